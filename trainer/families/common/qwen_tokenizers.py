"""The Qwen tokenizers of the Qwen-encoded families' single files: Qwen3's (Z-Image's Qwen3-4B,
FLUX.2 klein's Qwen3-4B / 8B; ``kind`` "qwen3") and Qwen2.5-VL's (Qwen-Image's Qwen2.5-VL-7B;
``kind`` "qwen25vl"). Both are the same byte-level BPE (``Qwen2Tokenizer``; ComfyUI ships one
folder for both); what differs is the chat template: Z-Image and klein call
``apply_chat_template(..., enable_thinking=...)``, which only Qwen3's template reads (Qwen2.5's
would add its default system prompt), so a "qwen3" tokenizer must carry Qwen3's template.
Qwen-Image writes its template string itself and needs none.

FLUX.2 [dev]'s Mistral-Small-3 tokenizer (``kind`` "mistral3") is found the same way: a fast
tokenizer (``tokenizer.json``) with Mistral's chat template (``[SYSTEM_PROMPT]``), as the
``tokenizer/`` folder of ``black-forest-labs/FLUX.2-dev`` or a Mistral-Small-3.x repository
holds it. It is read as the tokenizer alone: the folder's ``PixtralProcessor`` needs
torchvision, and for text it renders the same template and tokenizes with this tokenizer.

A text-encoder file holds no tokenizer. The look-up is the CLIP / T5 one's
(:mod:`trainer.families.common.mmdit_tokenizers`), first found wins:

1. ``model.tokenizer``: a folder holding ``tokenizer/`` (a diffusers Z-Image / Qwen-Image /
   FLUX.2 folder) or the tokenizer files themselves (a Qwen3-4B / Qwen2.5-VL repository); set
   there without one, it is an error.
2. Beside each given file ``models/name.safetensors``: ``models/name/tokenizer/``,
   ``models/tokenizer/``, then ``models/`` itself when the files lie beside it.
3. The Hugging Face cache, by file look-ups only (:data:`CACHE`).
4. Online, only when ``HF_HUB_OFFLINE`` is not set: the ``tokenizer/`` folder of
   :data:`FETCH_REPO` (what :data:`FETCH` says to run).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional, Union

from trainer.models import tokenizers
from trainer.models.tokenizers import Found, TokenizerNotFound

SLOT = "tokenizer"
CACHE: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen3": (("Qwen/Qwen3-4B", ""), ("Tongyi-MAI/Z-Image-Turbo", SLOT),
              ("Tongyi-MAI/Z-Image", SLOT), ("black-forest-labs/FLUX.2-klein-4B", SLOT),
              ("Qwen/Qwen3-8B", "")),
    "qwen25vl": (("Qwen/Qwen2.5-VL-7B-Instruct", ""), ("Qwen/Qwen-Image", SLOT),
                 ("Qwen/Qwen-Image-Edit", SLOT)),
    "mistral3": (("black-forest-labs/FLUX.2-dev", SLOT),
                 ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", ""),
                 ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", "")),
}
FETCH_REPO = {"qwen3": "Tongyi-MAI/Z-Image-Turbo", "qwen25vl": "Qwen/Qwen-Image",
              "mistral3": "black-forest-labs/FLUX.2-dev"}  # gated: accept its license, log in
FETCH = {kind: f'hf download {repo} --include "{SLOT}/*"' for kind, repo in FETCH_REPO.items()}
GATED = {"mistral3": " (a gated repository: accept its license on the Hub and log in with "
                     "`hf auth login` first)"}
LABELS = {"qwen3": "Qwen3 (Z-Image, FLUX.2 klein)", "qwen25vl": "Qwen2.5-VL (Qwen-Image)",
          "mistral3": "Mistral-Small-3 (FLUX.2 [dev])"}
MISTRAL_MARK = "[SYSTEM_PROMPT]"  # in Mistral-Small-3's chat template
CHECKPOINTS = Union[Path, str, Iterable[Union[Path, str]], None]


def _check_kind(kind: str) -> None:
    if kind not in CACHE:
        raise ValueError(f"unknown Qwen tokenizer kind {kind!r}; one of {', '.join(CACHE)}")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def chat_template(folder: Path) -> str:
    """The folder's chat template: ``chat_template.jinja`` (transformers 5 writes it), or the
    ``chat_template`` entry of ``tokenizer_config.json`` (older saves) or of a processor's
    ``chat_template.json``."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.json"):
        found = _json(folder / name).get("chat_template")
        if isinstance(found, str) and found:
            return found
    return ""


def is_qwen(folder: Path) -> bool:
    """Qwen tokenizer files: ``tokenizer.json`` or ``vocab.json`` + ``merges.txt`` (CLIP's
    folders have those too), with a ``tokenizer_config.json`` that names Qwen2's class."""
    if not folder.is_dir() or not tokenizers.has_tokenizer_files(folder):
        return False
    return "Qwen2" in str(_json(folder / "tokenizer_config.json").get("tokenizer_class", ""))


def fits(folder: Path, kind: str) -> bool:
    """A tokenizer that serves ``kind``: Qwen3's needs the ``enable_thinking`` template,
    Mistral's a ``tokenizer.json`` and its ``[SYSTEM_PROMPT]`` template."""
    if kind == "mistral3":
        return (folder / "tokenizer.json").is_file() and MISTRAL_MARK in chat_template(folder)
    return is_qwen(folder) and (kind != "qwen3" or "enable_thinking" in chat_template(folder))


def _what(kind: str) -> str:
    if kind == "mistral3":
        return ("Mistral-Small-3 tokenizer files (tokenizer.json and a chat template with "
                "[SYSTEM_PROMPT])")
    if kind == "qwen3":
        return ("Qwen3 tokenizer files (tokenizer.json or vocab.json + merges.txt, a "
                "tokenizer_config.json of class Qwen2Tokenizer, and Qwen3's chat template with "
                "enable_thinking)")
    return ("Qwen2.5-VL tokenizer files (tokenizer.json or vocab.json + merges.txt, and a "
            "tokenizer_config.json of class Qwen2Tokenizer)")


def _in_setting(folder: Path, kind: str) -> Found:
    for candidate in (folder / SLOT, folder):
        if fits(candidate, kind):
            return Found(candidate, "model.tokenizer")
    raise TokenizerNotFound(f"model.tokenizer = {str(folder)!r}: no {_what(kind)} there, "
                            f"directly or in {SLOT}/. Fetch them once with `{FETCH[kind]}`")


def _paths(checkpoint: CHECKPOINTS) -> list[Path]:
    if checkpoint is None:
        return []
    if isinstance(checkpoint, (str, Path)):
        return [Path(checkpoint).expanduser()]
    return [Path(c).expanduser() for c in checkpoint if c]


def _places(checkpoint: Path, slot: str = SLOT) -> list[Path]:
    """Where files beside ``checkpoint`` may hold a ``slot`` folder's (``models/name/slot/``,
    ``models/slot/``, ``models/``): the tokenizer's, or an edit model's image processor's."""
    return [checkpoint.parent / checkpoint.stem / slot, checkpoint.parent / slot,
            checkpoint.parent]


def _beside(checkpoints: list[Path], kind: str) -> Optional[Found]:
    for checkpoint in checkpoints:
        for candidate in _places(checkpoint):
            if fits(candidate, kind):
                return Found(candidate, f"beside the file ({candidate})")
    return None


def in_cache(kind: str, cache_dir: Optional[str] = None) -> Optional[Found]:
    """A cached copy, by file look-ups only (``try_to_load_from_cache`` never connects)."""
    from huggingface_hub import try_to_load_from_cache

    for repo, sub in CACHE[kind]:
        for names in (("tokenizer_config.json", "tokenizer.json"),
                      ("tokenizer_config.json", "vocab.json", "merges.txt")):
            paths = [try_to_load_from_cache(repo, f"{sub}/{n}" if sub else n,
                                            cache_dir=cache_dir) for n in names]
            if all(isinstance(p, str) for p in paths) and fits(Path(paths[0]).parent, kind):
                name = f"{repo}/{sub}" if sub else repo
                return Found(Path(paths[0]).parent, f"Hugging Face cache ({name})")
    return None


def download(kind: str, cache_dir: Optional[str] = None) -> Found:
    """The online step: the ``tokenizer/`` folder of :data:`FETCH_REPO` into the HF cache."""
    from huggingface_hub import snapshot_download

    root = snapshot_download(FETCH_REPO[kind], allow_patterns=[f"{SLOT}/*"],
                             cache_dir=cache_dir)
    return Found(Path(root) / SLOT, f"downloaded ({FETCH_REPO[kind]}/{SLOT})")


def _missing(kind: str, checkpoints: list[Path], why: str) -> str:
    places = [str(p) for c in checkpoints for p in _places(c)]
    cached = ", ".join(r + (f"/{s}" if s else "") for r, s in CACHE[kind])
    return (f"the model needs a {LABELS[kind]} tokenizer, which its files do not hold, and none "
            f"was found: not set in model.tokenizer, not beside the file "
            f"({', '.join(places) or '-'}), not in the Hugging Face cache ({cached}).{why} Fetch "
            f"it once with `{FETCH[kind]}`{GATED.get(kind, '')}, or set model.tokenizer to a "
            f"folder with the tokenizer files (a diffusers folder of the model also works).")


def locate(kind: str, setting: Optional[str], checkpoint: CHECKPOINTS = None) -> Found:
    """The first of: the setting, beside the file(s), the HF cache, online (when allowed)."""
    _check_kind(kind)
    if setting:
        return _in_setting(Path(setting).expanduser(), kind)
    checkpoints = _paths(checkpoint)
    found = _beside(checkpoints, kind) or in_cache(kind)
    if found:
        return found
    if not tokenizers.offline():
        try:
            found = download(kind)
        except Exception as exc:  # noqa: BLE001 - no network, a proxy, the hub down: say so
            raise TokenizerNotFound(_missing(kind, checkpoints,
                                             f" The download failed: {exc}.")) from None
        if fits(found.folder, kind):
            return found
    raise TokenizerNotFound(_missing(kind, checkpoints,
                                     " HF_HUB_OFFLINE is set, so nothing was downloaded."
                                     if tokenizers.offline() else ""))


def load(found: Found, kind: str = "qwen3") -> Any:
    """The ``Qwen2Tokenizer`` in ``found`` (the class the Qwen pipelines take); for
    "mistral3" what ``AutoTokenizer`` makes of the folder (as the ``PixtralProcessor`` that
    ``Flux2Pipeline`` loads does: the class, and so the padding side, its files name), with the
    folder's chat template."""
    from transformers import AutoTokenizer, Qwen2Tokenizer

    cls = AutoTokenizer if kind == "mistral3" else Qwen2Tokenizer
    try:
        tokenizer = cls.from_pretrained(str(found.folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise TokenizerNotFound(f"cannot load the {LABELS[kind]} tokenizer in {found.folder} "
                                f"({found.where}): {exc}") from None
    if kind == "mistral3" and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template(found.folder)
    return tokenizer


def load_qwen_tokenizer(kind: str, setting: Optional[str], checkpoint: CHECKPOINTS = None
                        ) -> Any:
    """The tokenizer of ``kind`` ("qwen3" / "qwen25vl" / "mistral3"): ``setting`` is
    ``model.tokenizer``, ``checkpoint`` the single file(s) the model was given (the text
    encoder's first, then the others); raises :class:`TokenizerNotFound` (a ModelLoadError)
    saying where it looked and the ``hf download`` command that fetches it."""
    return load(locate(kind, setting, checkpoint), kind)


def cache_report(cache_dir: Optional[str] = None) -> list[tuple[str, str]]:
    """(label, where the tokenizer is) for the doctor: the HF cache only, per kind; a missing
    one with the command that fetches it."""
    rows = []
    for kind, label in LABELS.items():
        found = in_cache(kind, cache_dir)
        rows.append((label, f"ready, tokenizer from the {found.where}" if found
                     else f"tokenizer not found: {FETCH[kind]}"))
    return rows
