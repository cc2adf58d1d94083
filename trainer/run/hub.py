"""Upload to the Hugging Face Hub (``saving.huggingface_repo_id``), as sd-scripts'
library/huggingface_util.py does: after each save the file goes to the repository (created,
private unless ``huggingface_repo_visibility = "public"``) at
``<huggingface_path_in_repo>/<file name>``; with ``save_state_to_huggingface`` the training
state's folder follows it. ``async_upload`` uploads intermediate saves on a background thread;
the final save uploads in the foreground once the pending ones are done (sd-scripts'
``force_sync_upload``). A failed upload is logged and never stops the run, and it touches
nothing on disk.

The token is huggingface_hub's own: ``HF_TOKEN`` or its token file; it is never passed in,
so no config or metadata holds it. ``download_state`` reads sd-scripts' ``--resume`` form of
a Hub state (``owner/name/<folder>[:revision[:repo type]]``) for ``resume_from_huggingface``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer.config.rules.hub import parse_resume  # the Hub form, checked at load

Log = Callable[..., None]

_pending: list[threading.Thread] = []
_lock = threading.Lock()


def upload_save(cfg: Any, path: Path, state: Optional[Path], final: bool, log: Log) -> None:
    """Upload a completed save (and its state with save_state_to_huggingface); no-op unless
    saving.huggingface_repo_id is set."""
    sv = cfg.saving
    if not sv.huggingface_repo_id:
        return
    items = [path] + ([state] if state is not None and sv.save_state_to_huggingface else [])
    if sv.async_upload and not final:
        thread = threading.Thread(target=_upload, args=(sv, items, log), daemon=False,
                                  name="hub-upload")
        with _lock:
            _pending.append(thread)
        thread.start()
        return
    if final:
        wait_pending()
    _upload(sv, items, log)


def wait_pending() -> None:
    """Join the background uploads started so far."""
    with _lock:
        threads, _pending[:] = list(_pending), []
    for thread in threads:
        thread.join()


def repo_path(sv: Any, name: str) -> str:
    prefix = (sv.huggingface_path_in_repo or "").strip("/")
    return f"{prefix}/{name}" if prefix else name


def _upload(sv: Any, items: list[Path], log: Log) -> None:
    where = f"{sv.huggingface_repo_id} ({sv.huggingface_repo_type})"
    try:
        from huggingface_hub import HfApi

        api = HfApi()  # the token: HF_TOKEN or huggingface_hub's token file
        api.create_repo(repo_id=sv.huggingface_repo_id, repo_type=sv.huggingface_repo_type,
                        private=sv.huggingface_repo_visibility != "public", exist_ok=True)
        for item in items:
            target = repo_path(sv, item.name)
            common = {"repo_id": sv.huggingface_repo_id, "repo_type": sv.huggingface_repo_type,
                      "path_in_repo": target}
            if item.is_dir():
                api.upload_folder(folder_path=str(item), **common)
            else:
                api.upload_file(path_or_fileobj=str(item), **common)
            log(f"Uploaded {item.name} to the Hub: {where} {target}")
    except Exception as exc:  # noqa: BLE001 - any failure is logged, the run goes on
        log(f"Upload to the Hub failed ({where}); the run goes on and the files stay on "
            f"disk: {type(exc).__name__}: {_short(exc)}", "warning")


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def download_state(value: str) -> Path:
    """Download the state that training.resume names on the Hub; returns its local folder."""
    from huggingface_hub import snapshot_download

    repo_id, folder, revision, repo_type = parse_resume(value)
    local = snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision,
                              allow_patterns=[f"{folder}/*"])
    return Path(local) / folder
