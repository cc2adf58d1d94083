"""kill -9 safety: train in a child process, SIGKILL it at random moments, check what is left.

    python bench/kill_trials.py [--trials 20] [--seed 0]

Each trial starts ``python -m trainer train`` on the embedded tiny model (a LoRA saved and its
training state written at every step, so kills land during steps, during LoRA saves and during
state saves), kills it after a random delay, then checks that every ``.safetensors`` in the
output folder loads completely and carries its metadata, that every state folder offered for
resume is complete, and that ``training.resume = "latest"`` finishes the run with a final file
bit-identical to an uninterrupted run's. Prints one line per trial and the totals.
tests/test_kill.py runs two trials of the same code.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
STEPS = 60  # long enough that a kill within 4 s lands before the end


def write_config(folder: Path, data: Path, out: Path, resume: bool = False) -> Path:
    lines = [
        "[dataset]", f'train_data_dir = "{data}"', "resolution = 64", "min_bucket_reso = 64",
        "max_bucket_reso = 128", "bucket_reso_steps = 64",
        "[optimizer]", "learning_rate = 0.001",
        "[training]", f"max_train_steps = {STEPS}", 'log_with = "none"',
        *(['resume = "latest"'] if resume else []),
        "[saving]", f'output_dir = "{out}"', 'output_name = "k"', 'save_precision = "fp32"',
        "save_every_n_steps = 1", "save_state = true",
    ]
    path = folder / ("resume.toml" if resume else "train.toml")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def broken_outputs(out: Path) -> list[str]:
    """Every visible .safetensors must load with its metadata; every state offered must be
    complete. Returns what is not."""
    from safetensors import safe_open

    from trainer.run.state import find_latest, read_progress

    bad = []
    for path in out.glob("*.safetensors"):
        try:
            with safe_open(str(path), "pt") as f:
                meta = f.metadata() or {}
                for key in f.keys():
                    f.get_tensor(key)
            if "ss_steps" not in meta:
                bad.append(f"{path.name}: no metadata")
        except Exception as exc:  # noqa: BLE001 - any failure to read is the finding
            bad.append(f"{path.name}: {exc}")
    latest = find_latest(out)
    if latest is not None:
        needed = ("trained.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "config.toml")
        if read_progress(latest) is None or not all((latest / n).is_file() for n in needed):
            bad.append(f"{latest.name}: incomplete state offered")
    return bad


def kill_after(config: Path, delay: float, env: dict) -> bool:
    """Start the training process and SIGKILL it ``delay`` s after its first state exists;
    True when it was still running (killed, not finished)."""
    out = Path(config.read_text().split('output_dir = "')[1].split('"')[0])
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", str(config)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(out.glob("*-state")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    return proc.wait() == -signal.SIGKILL


def train(config: Path, env: dict) -> Optional[Path]:
    """``python -m trainer train config`` in a fresh process, as a user runs it after a kill
    (the reference too: a test's own process may hold state that a fresh one does not); the
    final file, or None when it did not finish."""
    out = Path(config.read_text().split('output_dir = "')[1].split('"')[0])
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", str(config)], cwd=ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    final = out / "k.safetensors"
    return final if proc.returncode == 0 and final.is_file() else None


def resume_and_compare(folder: Path, data: Path, out: Path, reference: Path, env: dict) -> bool:
    """Finish the killed run from its latest state; True when the final file equals the
    uninterrupted run's, tensor for tensor."""
    import torch
    from safetensors.torch import load_file

    final = train(write_config(folder, data, out, resume=True), env)
    if final is None:
        return False
    a, b = load_file(reference), load_file(final)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reference_run(folder: Path, data: Path, env: dict) -> Path:
    final = train(write_config(folder, data, folder / "reference"), env)
    assert final is not None, "the uninterrupted run failed"
    return final


def trials(n: int, seed: int, folder: Path, data: Path, report=print,
           max_delay: float = 4.0) -> dict:
    rng = random.Random(seed)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    reference = reference_run(folder, data, env)
    totals = {"trials": 0, "killed_mid_run": 0, "corrupt": 0, "resumed_equal": 0}
    for i in range(n):
        trial_dir = folder / f"trial{i}"
        trial_dir.mkdir()
        out = trial_dir / "out"
        delay = rng.uniform(0.0, max_delay)
        killed = kill_after(write_config(trial_dir, data, out), delay, env)
        bad, files = broken_outputs(out), len(list(out.glob("*.safetensors")))
        equal = resume_and_compare(trial_dir, data, out, reference, env)
        totals["trials"] += 1
        totals["killed_mid_run"] += int(killed)
        totals["corrupt"] += len(bad)
        totals["resumed_equal"] += int(equal)
        report(f"trial {i}: SIGKILL {delay:.2f}s after the first state "
               f"({'mid-run' if killed else 'after the end'}); "
               f"{files} files left, broken: {bad or 'none'}; "
               f"resume equal to the uninterrupted run: {equal}")
    return totals


def sample_data(root: Path) -> Path:
    from PIL import Image, ImageDraw

    folder = root / "2_shapes"
    folder.mkdir(parents=True)
    for i in range(3):
        img = Image.new("RGB", (64, 64), (240, 240, 240))
        ImageDraw.Draw(img).ellipse((8 + 4 * i, 8, 56, 56 - 4 * i), fill=(200, 30 * i, 30))
        img.save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"shape {i}")
    return root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("KOHYA_STUDIO_HOME", tempfile.mkdtemp(prefix="bench-home-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    folder = Path(tempfile.mkdtemp(prefix="bench-kill-"))
    totals = trials(args.trials, args.seed, folder, sample_data(folder / "data"))
    print(f"{totals['trials']} trials ({totals['killed_mid_run']} killed mid-run): "
          f"{totals['corrupt']} broken files or states; "
          f"{totals['resumed_equal']} resumed runs equal to the uninterrupted one")


if __name__ == "__main__":
    main()
