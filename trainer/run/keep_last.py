"""Keep the last N saves: sd-scripts' ``save_last_n_epochs`` / ``save_last_n_steps`` and their
``_state`` twins (library/train_util.py: ``get_remove_epoch_no``, ``get_remove_step_no``,
``save_and_remove_state_on_epoch_end``, ``save_and_remove_state_stepwise``).

Called by :func:`trainer.run.outputs.save_checkpoint` after a save is complete on disk (the file
and its config written, the state folder renamed from its temporary name), so an older save is
never deleted before its successor exists. The thresholds are sd-scripts':

- an epoch save at epoch ``e`` with ``save_last_n_epochs = N`` removes the epoch saves of epoch
  ``e - save_every_n_epochs * N`` and before (N files stay);
- a step save at step ``s`` with ``save_last_n_steps = N`` removes the step saves of step
  ``s - N - 1`` and before (the saves of the last N steps stay: N is a number of steps);
- the states follow ``save_last_n_*_state``, unset: the same N as the files.

sd-scripts deletes the one save at the threshold; here every save of this output name at or
under it goes (a run resumed with another save interval leaves none behind). Our states are
named by step (``<name>-step<N>-state/``, trainer/run/state.py): a state saved at an epoch's end
is the one whose progress starts the next epoch at batch 0, and counts as that epoch's; the
others are step states. The final save (no suffix) removes nothing, as in sd-scripts.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer.run.state import STATE_SUFFIX, read_progress


def epoch_threshold(epoch: int, every: int, keep: int) -> int:
    """The last epoch whose save goes (sd-scripts' get_remove_epoch_no)."""
    return epoch - every * keep


def step_threshold(step: int, keep: int) -> int:
    """The last step whose save goes (sd-scripts' get_remove_step_no, before it rounds down to
    the save interval: every save at or under it goes here)."""
    return step - keep - 1


def _numbered(folder: Path, name: str, pattern: str) -> list[tuple[int, Path]]:
    rx = re.compile(re.escape(name) + pattern + r"\.safetensors")
    found = []
    for path in folder.glob(f"{glob_escape(name)}-*.safetensors"):
        match = rx.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def older_files(folder: Path, name: str, kind: str, threshold: int) -> list[Path]:
    """The saved files (``<name>-<epoch:06d>`` or ``<name>-step<step:08d>``) at or under
    ``threshold``, oldest first."""
    pattern = r"-(\d{6,})" if kind == "epoch" else r"-step(\d{8,})"
    return [p for n, p in sorted(_numbered(folder, name, pattern)) if n <= threshold]


def older_states(folder: Path, name: str, kind: str, threshold: int) -> list[Path]:
    """The complete state folders of ``kind`` (epoch: saved at an epoch's end, counted by that
    epoch; step: the others, counted by step) at or under ``threshold``, oldest first."""
    rx = re.compile(re.escape(name) + r"-step(\d{8,})" + re.escape(STATE_SUFFIX))
    found = []
    for path in folder.glob(f"{glob_escape(name)}-step*{STATE_SUFFIX}"):
        progress = read_progress(path) if rx.fullmatch(path.name) else None
        if progress is None:
            continue
        at_epoch_end = progress.position == 0 and progress.step > 0
        if at_epoch_end != (kind == "epoch"):
            continue
        number = progress.epoch - 1 if kind == "epoch" else progress.step
        if number <= threshold:
            found.append((number, path))
    return [p for _, p in sorted(found)]


def _remove(path: Path) -> None:
    """A saved file with the config beside it and, for DreamBooth, its diffusers folder; or a
    state folder. A file that cannot be deleted stays (the run goes on)."""
    try:
        if path.is_dir():
            shutil.rmtree(path)
            return
        path.unlink(missing_ok=True)
        path.with_suffix(".toml").unlink(missing_ok=True)
        folder = path.with_suffix("")
        if (folder / "model_index.json").is_file():
            shutil.rmtree(folder)
    except OSError:
        pass


def keep_last(cfg: Any, suffix: str, epoch: int, step: int,
              log: Optional[Callable[[str], None]] = None) -> list[Path]:
    """After the save ``suffix`` (``-<epoch>``, ``-step<N>``; ``""``: the final one, nothing
    goes) at ``epoch`` / ``step`` is complete: delete the saves and states the keep-last-N
    settings no longer keep. Returns what was deleted."""
    sv = cfg.saving
    kind = None if not suffix else ("step" if suffix.startswith("-step") else "epoch")
    if kind is None:
        return []
    if kind == "epoch":
        keep, keep_state = sv.save_last_n_epochs, sv.save_last_n_epochs_state
        every = sv.save_every_n_epochs or 1
        threshold = (None if keep is None else epoch_threshold(epoch, every, keep),
                     None if (keep_state or keep) is None
                     else epoch_threshold(epoch, every, keep_state or keep))
    else:
        keep, keep_state = sv.save_last_n_steps, sv.save_last_n_steps_state
        threshold = (None if keep is None else step_threshold(step, keep),
                     None if (keep_state or keep) is None
                     else step_threshold(step, keep_state or keep))
    folder, name = Path(sv.output_dir), sv.output_name
    gone = older_files(folder, name, kind, threshold[0]) if threshold[0] is not None else []
    if threshold[1] is not None and sv.save_state:
        gone += older_states(folder, name, kind, threshold[1])
    for path in gone:
        _remove(path)
    if gone and log is not None:
        log("Removed older saves (keep the last N): " + ", ".join(p.name for p in gone))
    return gone
