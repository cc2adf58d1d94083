"""The tokenizers of a FLUX.1 / SD 3.x single file: CLIP (as the SD families) and T5-XXL.

A checkpoint holds no tokenizer. The look-up is :mod:`trainer.models.tokenizers`' (first found
wins: ``model.tokenizer``, beside the file, the Hugging Face cache, online only when
``HF_HUB_OFFLINE`` is unset), per slot of the diffusers pipeline:

- FLUX.1 (``FluxPipeline``): ``tokenizer`` CLIP-L, ``tokenizer_2`` T5;
- SD 3.x (``StableDiffusion3Pipeline``): ``tokenizer`` CLIP-L, ``tokenizer_2`` CLIP-G (the CLIP
  vocabulary, padded with ``!`` as OpenCLIP pads), ``tokenizer_3`` T5.

T5-XXL's tokenizer is google/t5-v1_1-xxl's sentencepiece model (32k pieces). transformers
loads it from ``tokenizer.json`` (the ``tokenizers`` form, no extra package) or from
``spiece.model`` when the ``sentencepiece`` package is installed. The diffusers releases
carry both in their T5 folder; FLUX.1-schnell's is public (Apache-2.0, not gated), hence
:data:`T5_FETCH`. T5's length limit is the family's ``max_sequence_length`` (sd-scripts'
``t5xxl_max_token_length``): 512 for FLUX.1-dev, 256 for schnell and SD 3.x.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from trainer.families.sd.detect import CLIP_L_PAD, OPEN_CLIP_PAD
from trainer.models import tokenizers
from trainer.models.tokenizers import CLIP_L, Found, TokenizerNotFound

SCHNELL = "black-forest-labs/FLUX.1-schnell"
T5_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model")
T5_FETCH = f"hf download {SCHNELL} " + " ".join(f"tokenizer_2/{n}" for n in T5_FILES)
T5_MAX_LENGTH = {"flux1-dev": 512, "flux1-schnell": 256}
T5_CACHE: tuple[tuple[str, str], ...] = (
    (SCHNELL, "tokenizer_2"), ("black-forest-labs/FLUX.1-dev", "tokenizer_2"),
    ("stabilityai/stable-diffusion-3.5-large", "tokenizer_3"),
    ("stabilityai/stable-diffusion-3.5-medium", "tokenizer_3"),
    ("stabilityai/stable-diffusion-3-medium-diffusers", "tokenizer_3"),
    ("lodestones/Chroma1-HD", "tokenizer"),
    ("google/t5-v1_1-xxl", ""))
CLIP_CACHE: dict[str, tuple[tuple[str, str], ...]] = {
    "clip_l": ((CLIP_L, ""), (SCHNELL, "tokenizer"),
               ("stabilityai/stable-diffusion-3.5-large", "tokenizer")),
    "clip_g": (("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", ""),
               ("stabilityai/stable-diffusion-3.5-large", "tokenizer_2"), (CLIP_L, "")),
}


def slots(kind: str) -> dict[str, str]:
    """Pipeline slot -> encoder (``clip_l``, ``clip_g``, ``t5xxl``) of ``flux`` or ``sd3``."""
    if kind == "flux":
        return {"tokenizer": "clip_l", "tokenizer_2": "t5xxl"}
    return {"tokenizer": "clip_l", "tokenizer_2": "clip_g", "tokenizer_3": "t5xxl"}


def has_t5_files(folder: Path) -> bool:
    """A T5 tokenizer: ``spiece.model``, or a ``tokenizer.json`` whose config names T5 (CLIP's
    fast tokenizer has a ``tokenizer.json`` too)."""
    if (folder / "spiece.model").is_file():
        return True
    if not (folder / "tokenizer.json").is_file():
        return False
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "T5" in str(config.get("tokenizer_class", ""))


def _has(folder: Path, encoder: str) -> bool:
    if encoder == "t5xxl":
        return folder.is_dir() and has_t5_files(folder)
    return folder.is_dir() and tokenizers.has_tokenizer_files(folder)


def _in_setting(folder: Path, slot: str, encoder: str) -> Found:
    for candidate in (folder / slot, folder):
        if _has(candidate, encoder):
            return Found(candidate, "model.tokenizer")
    kind = "T5 (spiece.model, or tokenizer.json)" if encoder == "t5xxl" else "CLIP (vocab.json " \
                                                                             "+ merges.txt)"
    raise TokenizerNotFound(f"model.tokenizer = {str(folder)!r}: no {kind} tokenizer files "
                            f"there, directly or in {slot}/")


def _beside(checkpoint: Path, slot: str, encoder: str) -> Optional[Found]:
    for candidate in (checkpoint.parent / checkpoint.stem / slot, checkpoint.parent / slot):
        if _has(candidate, encoder):
            return Found(candidate, f"beside the file ({candidate})")
    return None


def _in_cache(encoder: str, cache_dir: Optional[str] = None) -> Optional[Found]:
    """A cached copy, by file look-ups only (``try_to_load_from_cache`` never connects)."""
    from huggingface_hub import try_to_load_from_cache

    repos = T5_CACHE if encoder == "t5xxl" else CLIP_CACHE[encoder]
    wanted = [("tokenizer.json", "tokenizer_config.json"), ("spiece.model",)] \
        if encoder == "t5xxl" else [("vocab.json", "merges.txt")]
    for repo, sub in repos:
        for names in wanted:
            paths = [try_to_load_from_cache(repo, f"{sub}/{n}" if sub else n,
                                            cache_dir=cache_dir) for n in names]
            if all(isinstance(p, str) for p in paths):
                name = f"{repo}/{sub}" if sub else repo
                return Found(Path(paths[0]).parent, f"Hugging Face cache ({name})")
    return None


def download_t5(cache_dir: Optional[str] = None) -> Found:
    """The online step: FLUX.1-schnell's T5 tokenizer files into the Hugging Face cache."""
    from huggingface_hub import hf_hub_download

    paths = [hf_hub_download(SCHNELL, f"tokenizer_2/{n}", cache_dir=cache_dir) for n in T5_FILES]
    return Found(Path(paths[0]).parent, f"downloaded ({SCHNELL}/tokenizer_2)")


def _missing(encoder: str, slot: str, checkpoint: Optional[Path], why: str) -> str:
    places = [] if checkpoint is None else [str(checkpoint.parent / checkpoint.stem / slot),
                                             str(checkpoint.parent / slot)]
    repos = T5_CACHE if encoder == "t5xxl" else CLIP_CACHE[encoder]
    cached = ", ".join(r + (f"/{s}" if s else "") for r, s in repos)
    what = "a T5-XXL tokenizer" if encoder == "t5xxl" else f"a CLIP tokenizer ({encoder})"
    fetch = T5_FETCH if encoder == "t5xxl" else tokenizers.FETCH
    return (f"the model needs {what} for {slot}, which a checkpoint file does not hold, and "
            f"none was found: not set in model.tokenizer, not beside the file "
            f"({', '.join(places) or '-'}), not in the Hugging Face cache ({cached}).{why} Fetch "
            f"it once with `{fetch}`, or set model.tokenizer to a folder with the tokenizer "
            f"files (a diffusers FLUX.1 / SD 3.5 folder also works).")


def locate(encoder: str, slot: str, setting: Optional[str], checkpoint: Optional[Path],
           fetch: Optional[Callable[[], Found]] = None) -> Found:
    """The first of: the setting, beside the file, the HF cache, online (when allowed)."""
    if setting:
        return _in_setting(Path(setting).expanduser(), slot, encoder)
    found = (_beside(checkpoint, slot, encoder) if checkpoint else None) or _in_cache(encoder)
    if found:
        return found
    if not tokenizers.offline():
        try:
            return (fetch or (download_t5 if encoder == "t5xxl" else tokenizers.download))()
        except Exception as exc:  # noqa: BLE001 - no network, a proxy, the hub down: say so
            raise TokenizerNotFound(_missing(encoder, slot, checkpoint,
                                             f" The download failed: {exc}.")) from None
    raise TokenizerNotFound(_missing(encoder, slot, checkpoint,
                                     " HF_HUB_OFFLINE is set, so nothing was downloaded."))


def load_t5(found: Found, max_length: int) -> Any:
    """A T5 tokenizer from ``found``, limited to the family's sequence length."""
    from transformers import T5TokenizerFast

    try:
        tokenizer = T5TokenizerFast.from_pretrained(str(found.folder), local_files_only=True)
    except (OSError, ValueError, ImportError) as exc:
        raise TokenizerNotFound(f"cannot load the T5 tokenizer in {found.folder} ({found.where}): "
                                f"{exc}. Its tokenizer.json is needed (or spiece.model with the "
                                f"sentencepiece package): `{T5_FETCH}`") from None
    tokenizer.model_max_length = max_length
    return tokenizer


def load_flow_tokenizers(family: str, setting: Optional[str], checkpoint: Optional[Path]
                         ) -> dict[str, Any]:
    """``tokenizer``, ``tokenizer_2`` (and ``tokenizer_3``) of a FLUX.1 / SD 3.x family."""
    kind = "flux" if family.startswith("flux") else "sd3"
    out = {}
    for slot, encoder in slots(kind).items():
        found = locate(encoder, slot, setting, checkpoint)
        if encoder == "t5xxl":
            out[slot] = load_t5(found, T5_MAX_LENGTH.get(family, 256))
        else:
            pad = OPEN_CLIP_PAD if encoder == "clip_g" else CLIP_L_PAD
            out[slot] = tokenizers.load(found, pad)
    return out


FAMILY_LABELS = {"flux": "FLUX.1", "sd3": "SD 3 / 3.5"}
ENCODER_LABELS = {"clip_l": "CLIP-L", "clip_g": "CLIP-G", "t5xxl": "T5"}


def cache_report(cache_dir: Optional[str] = None) -> list[tuple[str, str]]:
    """(family label, where its tokenizers are) for the doctor: the HF cache only, per encoder
    of FLUX.1 (CLIP-L, T5) and SD 3.x (CLIP-L, CLIP-G, T5); the missing ones with the command
    that fetches them (one CLIP-L download serves CLIP-G too: the same vocabulary)."""
    rows = []
    for kind, label in FAMILY_LABELS.items():
        found: list[str] = []
        missing: dict[str, list[str]] = {}  # fetch command -> encoders it serves
        for encoder in slots(kind).values():
            where = _in_cache(encoder, cache_dir)
            name = ENCODER_LABELS[encoder]
            if where is None:
                fetch = T5_FETCH if encoder == "t5xxl" else tokenizers.FETCH
                missing.setdefault(fetch, []).append(name)
            else:
                found.append(f"{name} from the {where.where}")
        if missing:
            rows.append((label, "; ".join(
                [f"{', '.join(names)} tokenizer not found: {fetch}"
                 for fetch, names in missing.items()] + found)))
        else:
            rows.append((label, "ready, " + "; ".join(found)))
    return rows
