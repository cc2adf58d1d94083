"""Find the tokenizer(s) of a single-file model: the one part a checkpoint does not hold.

Every Stable Diffusion tokenizer is CLIP's byte-level BPE over the same 49408-token vocabulary
(OpenCLIP ships OpenAI's ``bpe_simple_vocab_16e6``); the families differ only in the padding
token: CLIP ViT-L (SD 1.x, SDXL's first encoder) pads with ``<|endoftext|>``, OpenCLIP (SD 2.x,
SDXL's second) with ``!``, token 0, which is what open_clip pads with. The studio sets the
family's padding on whatever tokenizer it finds, so any copy of the vocabulary serves.

Where it looks, per slot (``tokenizer``, and ``tokenizer_2`` for SDXL), first found wins:

1. ``model.tokenizer``: a folder holding ``tokenizer/`` (and ``tokenizer_2/``) subfolders, such
   as a diffusers model folder, or holding the tokenizer files itself (then it serves every
   slot). A folder set there that has no tokenizer is an error, not a reason to look further.
2. Beside the checkpoint ``models/name.safetensors``: ``models/name/tokenizer/``, then
   ``models/tokenizer/`` (``tokenizer_2/`` likewise for SDXL).
3. The Hugging Face cache, never the network: the repositories diffusers' and sd-scripts' own
   single-file loading use (``openai/clip-vit-large-patch14``; ``stabilityai/stable-diffusion-2``
   ``tokenizer/`` for SD 2.x; ``laion/CLIP-ViT-bigG-14-laion2B-39B-b160k`` for SDXL's second),
   the diffusers base models' ``tokenizer/`` folders, and last ``openai/clip-vit-large-patch14``
   for every slot, since the vocabulary is the same.
4. Online, only when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is not set: the four small
   files of ``openai/clip-vit-large-patch14`` into the Hugging Face cache, once.

Nothing found: :class:`TokenizerNotFound` names the slots, where it looked and :data:`FETCH`,
the one command that fetches the files once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.families.sd.detect import FAMILIES, Family, ModelLoadError, TextEncoderSlot

CLIP_L = "openai/clip-vit-large-patch14"
FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
MAX_LENGTH = 77
FETCH = f"hf download {CLIP_L} {' '.join(FILES)}"
SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
# (family, slot) -> (repository, subfolder) in the Hugging Face cache, in order
CACHE_REPOS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("sd1", "tokenizer"): ((CLIP_L, ""), (SD15, "tokenizer")),
    ("sd2", "tokenizer"): (("stabilityai/stable-diffusion-2", "tokenizer"),
                           ("stabilityai/stable-diffusion-2-1", "tokenizer"), (CLIP_L, "")),
    ("sdxl", "tokenizer"): ((CLIP_L, ""), (SDXL, "tokenizer")),
    ("sdxl", "tokenizer_2"): (("laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", ""),
                              (SDXL, "tokenizer_2"), (CLIP_L, "")),
}


class TokenizerNotFound(ModelLoadError):
    """No tokenizer for a slot; the message says where the studio looked and what to run."""


@dataclass(frozen=True)
class Found:
    folder: Path
    where: str  # for people: "model.tokenizer", "beside the file", "Hugging Face cache (repo)"


def has_tokenizer_files(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or all(
        (folder / name).is_file() for name in FILES[:2])


def offline() -> bool:
    """The Hugging Face hub's own switch, read now (the hub reads it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def in_setting(folder: Path, slot: str) -> Found:
    for candidate in (folder / slot, folder):
        if candidate.is_dir() and has_tokenizer_files(candidate):
            return Found(candidate, "model.tokenizer")
    raise TokenizerNotFound(f"model.tokenizer = {str(folder)!r}: no tokenizer files there "
                            f"(vocab.json + merges.txt or tokenizer.json, directly or in {slot}/)")


def beside(checkpoint: Path, slot: str) -> Optional[Found]:
    for candidate in (checkpoint.parent / checkpoint.stem / slot, checkpoint.parent / slot):
        if candidate.is_dir() and has_tokenizer_files(candidate):
            return Found(candidate, f"beside the file ({candidate})")
    return None


def in_hf_cache(family: str, slot: str, cache_dir: Optional[str] = None) -> Optional[Found]:
    """A cached copy, found by file look-ups only (``try_to_load_from_cache`` never connects)."""
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in CACHE_REPOS[(family, slot)]:
        paths = [try_to_load_from_cache(repo, f"{sub}/{name}" if sub else name,
                                        cache_dir=cache_dir) for name in FILES[:2]]
        if all(isinstance(p, str) for p in paths):
            name = f"{repo}/{sub}" if sub else repo
            return Found(Path(paths[0]).parent, f"Hugging Face cache ({name})")
    return None


def download(cache_dir: Optional[str] = None) -> Found:
    """The online step: CLIP ViT-L's tokenizer files into the Hugging Face cache."""
    from huggingface_hub import hf_hub_download

    paths = [hf_hub_download(CLIP_L, name, cache_dir=cache_dir) for name in FILES]
    return Found(Path(paths[0]).parent, f"downloaded ({CLIP_L})")


def locate(family: Family, slot: TextEncoderSlot, setting: Optional[str],
           checkpoint: Optional[Path], fetch: Callable[[], Found] = download) -> Found:
    """The first of: the setting, beside the file, the HF cache, online (when allowed)."""
    if setting:
        return in_setting(Path(setting).expanduser(), slot.tokenizer)
    found = (beside(checkpoint, slot.tokenizer) if checkpoint else None) or in_hf_cache(
        family.name, slot.tokenizer)
    if found:
        return found
    if not offline():
        try:
            return fetch()
        except Exception as exc:  # noqa: BLE001 - no network, a proxy, the hub down: say so
            raise TokenizerNotFound(_missing(family, slot, checkpoint, f" The download failed: "
                                                                       f"{exc}.")) from None
    raise TokenizerNotFound(_missing(family, slot, checkpoint, " HF_HUB_OFFLINE is set, so "
                                                               "nothing was downloaded."))


def _missing(family: Family, slot: TextEncoderSlot, checkpoint: Optional[Path],
             why: str) -> str:
    places = [] if checkpoint is None else [
        str(checkpoint.parent / checkpoint.stem / slot.tokenizer),
        str(checkpoint.parent / slot.tokenizer)]
    repos = ", ".join(r + (f"/{s}" if s else "") for r, s in CACHE_REPOS[(family.name,
                                                                           slot.tokenizer)])
    return (f"{family.label} needs a CLIP tokenizer ({slot.tokenizer}), which a checkpoint file "
            f"does not hold, and none was found: not set in model.tokenizer, not beside the file "
            f"({', '.join(places) or '-'}), not in the Hugging Face cache ({repos}).{why} Fetch "
            f"it once with `{FETCH}`, or set model.tokenizer to a folder with the tokenizer "
            f"files (a diffusers model folder also works).")


def load(found: Found, pad_token: str) -> Any:
    """A CLIPTokenizer from ``found`` with the family's padding token and CLIP's 77 tokens."""
    from transformers import CLIPTokenizer

    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(found.folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerNotFound(f"cannot load the tokenizer in {found.folder} "
                                f"({found.where}): {exc}") from None
    if tokenizer.pad_token != pad_token and pad_token in tokenizer.get_vocab():
        tokenizer.pad_token = pad_token
    # every SD text encoder has 77 positions; vocab.json + merges.txt alone say no length
    tokenizer.model_max_length = min(tokenizer.model_max_length, MAX_LENGTH)
    return tokenizer


def cache_report(cache_dir: Optional[str] = None) -> list[tuple[str, str]]:
    """(family label, where its tokenizers are) for the doctor: the HF cache only."""
    rows = []
    for family in FAMILIES.values():
        found = [in_hf_cache(family.name, slot.tokenizer, cache_dir) for slot in family.encoders]
        if all(found):
            where = "; ".join(sorted({f.where for f in found if f}))
            rows.append((family.label, f"ready, tokenizer from the {where}"))
        else:
            rows.append((family.label, f"tokenizer not found: {FETCH}"))
    return rows
