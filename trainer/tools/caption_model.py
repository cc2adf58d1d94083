"""Captions from a local transformers image-to-text model (BLIP, GIT, BLIP-2, Florence-2, ...).

The model folder is what ``save_pretrained`` writes for the model and its processor (the
Hugging Face repositories ``Salesforce/blip-image-captioning-large`` or ``microsoft/git-large-coco``
downloaded once, e.g. with ``huggingface-cli download REPO --local-dir DIR``). It goes through
transformers' ``image-text-to-text`` pipeline (the task that took over ``image-to-text`` in
transformers 5), with an empty prompt: the model's own unconditional caption. Nothing is
downloaded: a local folder is read as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.tools.common import ToolError
from trainer.tools.options import CaptionOptions

TASK = "image-text-to-text"


def _device() -> str:
    from trainer.system.device import detect

    return detect().torch_device


def load_captioner(opts: CaptionOptions):
    """A callable ``list[PIL.Image] -> list[str]`` over the model in ``opts.model_dir``."""
    from trainer.system.library_lock import library_imports

    folder = Path(opts.model_dir).expanduser()
    if not (folder / "config.json").is_file():
        raise ToolError(f"model_dir {str(folder)!r}: no config.json; point it at a folder "
                        f"that holds a transformers captioning model and its processor")
    try:
        with library_imports():  # the GUI may start a run or an estimate meanwhile
            from transformers import pipeline

            pipe = pipeline(TASK, model=str(folder), device=_device())
    except (OSError, ValueError, KeyError) as exc:
        raise ToolError(f"model_dir {str(folder)!r}: transformers cannot load it for "
                        f"{TASK} ({exc})") from None
    generate = {"max_new_tokens": opts.max_new_tokens, "num_beams": opts.num_beams}

    def caption(images: list[Any]) -> list[str]:
        out = pipe(images=images, text=[""] * len(images), batch_size=len(images),
                   generate_kwargs=generate, return_full_text=False)
        return [_text(item) for item in out]
    return caption


def _text(item: Any) -> str:
    """The generated text of one pipeline answer (a dict, or a list of one dict)."""
    if isinstance(item, list):
        item = item[0]
    return " ".join(str(item.get("generated_text", "")).split())
