"""The sample gallery's pictures: each sample image, and an edit model's sample beside its
control images.

A Sample event names, per prompt, the control images its sample was made from (the prompt's
``--ci``, trainer/run/outputs.py); such a sample is shown as one picture, its controls on the
left scaled to the sample's height and the sample on the right, so the edit can be read at a
glance. Sample files are shown only from inside the run's output folder; a control is read
(as pixels, not served as a file) only when it is an image that decodes, else the sample is
shown alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GAP = 4  # pixels between a control and its sample


def _inside(path: str, folder: str | None) -> bool:
    if not folder:
        return False
    try:
        return Path(path).resolve().is_relative_to(Path(folder))
    except OSError:
        return False


def beside(sample: str, controls: list[str]) -> Any:
    """One PIL image: ``controls`` at the sample's height, then the sample; the sample's path
    when no control can be read."""
    from PIL import Image

    from trainer.data.images import is_image_file

    try:
        with Image.open(sample) as img:
            right = img.convert("RGB")
    except OSError:
        return sample
    lefts = []
    for path in controls:
        if not is_image_file(Path(path).expanduser()):
            continue
        try:
            with Image.open(Path(path).expanduser()) as img:
                ref = img.convert("RGB")
        except OSError:
            continue
        width = max(1, round(ref.width * right.height / ref.height))
        lefts.append(ref.resize((width, right.height), Image.Resampling.LANCZOS))
    if not lefts:
        return sample
    out = Image.new("RGB", (sum(i.width + GAP for i in lefts) + right.width, right.height),
                    "white")
    x = 0
    for img in [*lefts, right]:
        out.paste(img, (x, 0))
        x += img.width + GAP
    return out


def gallery_items(snap: dict[str, Any], limit: int = 8) -> list[tuple[Any, str]]:
    """(image, caption) of the newest samples inside the run's output folder: a path, or a
    sample beside its controls."""
    out: list[tuple[Any, str]] = []
    folder = snap.get("output_dir")
    for sample in reversed(snap.get("samples", [])):
        paths = sample["paths"]
        prompts = sample.get("prompts") or [""] * len(paths)
        controls = list(sample.get("controls") or [])
        controls += [[]] * (len(paths) - len(controls))
        for path, prompt, refs in zip(paths, prompts, controls):
            if len(out) == limit:
                return out
            if not _inside(path, folder):
                continue
            caption = f"step {sample['step']}: {prompt}"
            image = beside(path, list(refs)) if refs else path
            out.append((image, caption if isinstance(image, str)
                        else f"{caption} (left: its control)"))
    return out
