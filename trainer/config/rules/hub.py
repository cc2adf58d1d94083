"""``saving.resume_from_huggingface`` (sd-scripts' --resume_from_huggingface): training.resume
then names a state on the Hub, ``owner/name/<folder>[:revision[:repo type]]``, which
trainer/run/hub.py downloads before the run. Checked when the config loads, without the network:
the flag needs a resume value of that form."""

from __future__ import annotations

from typing import Any, Optional

HUB_FORM = "'owner/name/<folder>[:revision[:type]]'"


def parse_resume(value: str) -> tuple[str, str, Optional[str], str]:
    """sd-scripts' Hub resume: ``owner/name/<folder>[:revision[:repo type]]`` -> repo id,
    folder, revision, repo type; ValueError naming training.resume otherwise."""
    parts = value.split("/")
    if len(parts) < 3 or not all(parts[:2]):
        raise ValueError(f"training.resume = {value!r}: with saving.resume_from_huggingface it "
                         f"names a state on the Hub as {HUB_FORM}")
    folder, revision, repo_type = "/".join(parts[2:]), None, "model"
    if ":" in folder:
        folder, revision, *rest = folder.split(":")
        repo_type = rest[0] if rest else "model"
    if repo_type not in ("model", "dataset", "space"):
        raise ValueError(f"training.resume = {value!r}: the repository type after the second "
                         f"':' is 'model', 'dataset' or 'space', not {repo_type!r}")
    if not folder.strip("/"):
        raise ValueError(f"training.resume = {value!r}: name the state's folder in the "
                         f"repository ({HUB_FORM})")
    return f"{parts[0]}/{parts[1]}", folder.strip("/"), revision or None, repo_type


def problems(cfg: Any) -> list[str]:
    """resume_from_huggingface reads training.resume; without it (or with 'latest', which looks
    in saving.output_dir) the flag would do nothing, so the config is refused."""
    if not cfg.saving.resume_from_huggingface:
        return []
    resume = cfg.training.resume
    if not resume:
        return [f"saving.resume_from_huggingface downloads the state that training.resume names "
                f"on the Hub ({HUB_FORM}), and training.resume is not set: set it, or turn "
                f"resume_from_huggingface off"]
    if resume == "latest":
        return ["training.resume = 'latest' looks for a state in saving.output_dir, but "
                "saving.resume_from_huggingface is on: name the Hub state "
                f"({HUB_FORM}) or turn resume_from_huggingface off"]
    try:
        parse_resume(resume)
    except ValueError as exc:
        return [str(exc)]
    return []
