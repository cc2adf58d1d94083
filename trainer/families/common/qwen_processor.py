"""The image processor of Qwen2.5-VL (``preprocessor_config.json``: patch 14, merge 2, the
pixel range and the CLIP mean and std), which Qwen-Image-Edit's text encoder reads its control
images through. A diffusers folder holds it in ``processor/``; a ComfyUI diffusion-model or
text-encoder file holds none, so a split-file edit model looks it up as its tokenizer is looked
up (:mod:`trainer.families.common.qwen_tokenizers`), first found wins:

1. The settings: ``model.tokenizer`` (a diffusers Qwen-Image-Edit folder's ``processor/``, or a
   Qwen2.5-VL repository's files themselves) and ``model.config_dir``'s ``processor/``; a
   tokenizer folder without one is no error (it names the tokenizer first).
2. Beside each given file ``models/name.safetensors``: ``models/name/processor/``,
   ``models/processor/``, then ``models/`` itself.
3. The Hugging Face cache, by file look-ups only (:data:`CACHE`).
4. Online, only when ``HF_HUB_OFFLINE`` is not set: :data:`FETCH_REPO`'s ``processor/``.
5. The copy shipped with the studio (Qwen2.5-VL-7B-Instruct's values, which every released
   Qwen-Image-Edit folder repeats), said so with :data:`FETCH`, the command that fetches the
   model's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from trainer.families.common.qwen_tokenizers import CHECKPOINTS, _paths, _places
from trainer.families.spec import ASSETS
from trainer.models import tokenizers
from trainer.models.tokenizers import Found

SLOT = "processor"
CONFIG = "preprocessor_config.json"
SAVED = "processor_config.json"  # transformers 5's save of a processor: the image part inside
SHIPPED = ASSETS / "qwen-image" / SLOT
CACHE = (("Qwen/Qwen-Image-Edit", SLOT), ("Qwen/Qwen-Image-Edit-2509", SLOT),
         ("Qwen/Qwen-Image-Edit-2511", SLOT), ("Qwen/Qwen2.5-VL-7B-Instruct", ""))
FETCH_REPO = "Qwen/Qwen-Image-Edit"
FETCH = f'hf download {FETCH_REPO} --include "{SLOT}/*"'
LABEL = "Qwen2.5-VL image processor (Qwen-Image-Edit)"


def _holds(folder: Path) -> bool:
    """An image processor's files: ``preprocessor_config.json`` (the Hub's repositories), or
    the ``processor_config.json`` with an ``image_processor`` entry that transformers 5
    writes."""
    if (folder / CONFIG).is_file():
        return True
    try:
        return "image_processor" in json.loads((folder / SAVED).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _in_settings(tokenizer: Optional[str], config_dir: Optional[str]) -> Optional[Found]:
    for setting, value in (("model.tokenizer", tokenizer), ("model.config_dir", config_dir)):
        if not value:
            continue
        root = Path(value).expanduser()
        for candidate in (root / SLOT, root):
            if _holds(candidate):
                return Found(candidate, setting)
    return None


def _beside(checkpoints: list[Path]) -> Optional[Found]:
    for checkpoint in checkpoints:
        for candidate in _places(checkpoint, SLOT):
            if _holds(candidate):
                return Found(candidate, f"beside the file ({candidate})")
    return None


def in_cache(cache_dir: Optional[str] = None) -> Optional[Found]:
    """A cached copy, by file look-ups only (``try_to_load_from_cache`` never connects)."""
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in CACHE:
        path = try_to_load_from_cache(repo, f"{sub}/{CONFIG}" if sub else CONFIG,
                                      cache_dir=cache_dir)
        if isinstance(path, str):
            name = f"{repo}/{sub}" if sub else repo
            return Found(Path(path).parent, f"Hugging Face cache ({name})")
    return None


def _download() -> Optional[Found]:
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(FETCH_REPO, f"{SLOT}/{CONFIG}")
    except Exception:  # noqa: BLE001 - no network, a proxy, the hub down: the shipped copy
        return None
    return Found(Path(path).parent, f"downloaded ({FETCH_REPO}/{SLOT})")


def shipped() -> Found:
    return Found(SHIPPED, f"the studio's shipped copy of Qwen2.5-VL-7B-Instruct's (none beside "
                          f"the file, in model.tokenizer or the Hugging Face cache; `{FETCH}` "
                          f"fetches the model's own)")


def locate(tokenizer: Optional[str], config_dir: Optional[str],
           checkpoint: CHECKPOINTS = None) -> Found:
    """The folder of the image processor: the settings, beside the file(s), the HF cache,
    online when allowed, else the shipped copy (see the module's notes)."""
    found = _in_settings(tokenizer, config_dir) or _beside(_paths(checkpoint)) or in_cache()
    if found is None and not tokenizers.offline():
        found = _download()
    return found or shipped()


def cache_report(cache_dir: Optional[str] = None) -> list[tuple[str, str]]:
    """The doctor's row: the processor in the HF cache, or the command that fetches it."""
    found = in_cache(cache_dir)
    return [(LABEL, f"ready, processor from the {found.where}" if found else
             f"processor not found, the shipped copy serves: {FETCH}")]
