"""The advisor's laws made in advance for the families' models, so that a first estimate for
SD 1.x, SD 2.x, SDXL, FLUX.1 or SD 3.5 (or an embedded tiny model) answers at once, with no
simulation and without importing diffusers.

``trainer/assets/advisor/<name>.json.gz`` holds, for one model shape (the built-in configs of
a family, which single files and the families' downloaded folders share), what the advisor
stores about it (:func:`trainer.advisor.disk_cache.stored`). For the UNet families: the
parameter counts, the VAE encode's laws and the step's laws (:mod:`trainer.advisor.law`) for
each mode with the presets' networks (LoRA with alpha equal to the rank or not, with or without
the text encoder; DreamBooth with or without it; textual inversion) in fp32, bf16 and fp16,
gradient checkpointing on and off, batch 1 and larger batches. For FLUX.1 and SD 3.5: the
parameter counts by kind and the small models' laws (:mod:`trainer.advisor.flow_memory`) for
each set of trained blocks, checkpointing on and off, batch 1 and larger. Every law holds for
any bucket, batch and LoRA rank; other settings are simulated once and kept on disk.
``embedded.json`` holds the embedded tiny models' configs (building them imports diffusers).

The files are used while the code they came from is unchanged: each model's entry in the
index carries ``code``, a hash of :data:`CODE` (the advisor's simulation) and its own family's
memory role (``trainer/families/<folder>/memory.py``: its small models, a step's inputs), so
adding or changing a family leaves the other families' laws in use; the library versions they
were made with are recorded beside it. After a change to that code, ``python -m
trainer.advisor.make_shipped`` makes them again (about an hour on 2 CPU cores; ``--only sd1``
for one model) and ``tests/test_advisor_laws.py`` says when they are stale. This module reads
them and imports nothing of the advisor's.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
TRAINER = HERE.parent
FOLDER = TRAINER / "assets" / "advisor"
FAMILIES = TRAINER / "assets" / "families"
# the advisor's code whose simulations ship (paths under trainer/); a model's stamp adds its
# family's memory role (its small models, a step's inputs)
CODE = ("advisor/footprint.py", "advisor/law.py", "advisor/law_keys.py",
        "advisor/live_bytes.py", "advisor/flow_memory.py")
# the embedded models' builders, whose configs embedded.json holds (paths under trainer/)
UNET_BUILDER = "families/sd/tiny.py"
FLOW_BUILDER = "families/common/tiny_mmdit.py"
UNET_MODELS = ("sd1", "sd2-512", "sd2-768-v", "sdxl", "embedded:tiny-sd15",
               "embedded:tiny-sdxl")
FLOW_MODELS = ("flux1-dev", "flux1-schnell", "sd35-large", "sd35-medium", "sd3-medium",
               "embedded:tiny-flux", "embedded:tiny-sd3", "qwen-image", "chroma1-hd",
               "embedded:tiny-chroma", "z-image-turbo", "flux2-klein-4b", "flux2-klein-9b",
               "flux2-dev", "embedded:tiny-flux2")
MODELS = UNET_MODELS + FLOW_MODELS
MISSING = object()
_LOADED: dict[str, Any] = {}


def family_of(model: str) -> str:
    """The family of a shipped model: an embedded twin's id or a variant's asset folder."""
    from trainer.families import FAMILIES as REGISTRY
    from trainer.families import embedded_family

    return embedded_family(model) or next(
        s.name for s in REGISTRY.values() if any(v.asset == model for v in s.variants))


def code_files(model: str) -> tuple[str, ...]:
    """The code whose simulations ``model``'s file holds: :data:`CODE` and its family's memory
    role (paths under trainer/)."""
    from trainer.families import spec

    return CODE + (f"families/{spec(family_of(model)).folder}/memory.py",)


def code_stamp(model: str) -> str:
    """A hash of :func:`code_files` less their docstrings, comment lines and indentation
    (editing those leaves the shipped laws in use)."""
    h = hashlib.sha256()
    for name in code_files(model):
        h.update(_code(TRAINER / name).encode())
    return h.hexdigest()[:16]


def _code(path: Path) -> str:
    import ast

    source = path.read_text(encoding="utf-8")
    docstrings: set[int] = set()
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(source)):
        first = node.body[0] if isinstance(node, kinds) and node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines = (line.strip() for i, line in enumerate(source.splitlines(), 1) if i not in docstrings)
    return "\n".join(line for line in lines if line and not line.startswith("#"))


def entry_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def file_name(model: str) -> str:
    return model.replace("embedded:", "") + ".json.gz"


def _index() -> dict[str, str]:
    """Model key's id -> file, for the files made by this code (each model's entry: its file
    and the stamp of the code that made it, :func:`code_stamp`)."""
    if "index" not in _LOADED:
        try:
            index = json.loads((FOLDER / "index.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index = {}
        models = {file_name(m): m for m in MODELS}
        fresh = {}
        for key, entry in index.get("models", {}).items():
            model = models.get(entry.get("file")) if isinstance(entry, dict) else None
            if model is not None and entry.get("code") == code_stamp(model):
                fresh[key] = entry["file"]
        _LOADED["index"] = fresh
    return _LOADED["index"]


def lookup(model: str, key: str) -> Any:
    """What is shipped for ``key`` about ``model`` (a ``ModelConfigs.key``, or
    flow_memory's key of a transformer), or MISSING."""
    name = _index().get(entry_id(model))
    if name is None:
        return MISSING
    if name not in _LOADED:
        try:
            with gzip.open(FOLDER / name, "rt", encoding="utf-8") as f:
                _LOADED[name] = json.load(f)["entries"]
        except (OSError, ValueError, KeyError):
            _LOADED[name] = {}
    return _LOADED[name].get(entry_id(key), MISSING)


def _stamp(module: str) -> str:
    """A hash of a builder (a path under trainer/)."""
    return hashlib.sha256((TRAINER / module).read_bytes()).hexdigest()[:16]


def _embedded(value: str, section: str, module: str) -> Any:
    if "embedded" not in _LOADED:
        try:
            _LOADED["embedded"] = json.loads((FOLDER / "embedded.json").read_text("utf-8"))
        except (OSError, ValueError):
            _LOADED["embedded"] = {}
    data = _LOADED["embedded"].get(section, {})
    return data.get("models", {}).get(value) if data.get("stamp") == _stamp(module) else None


def embedded_configs(value: str) -> Optional[dict[str, Any]]:
    """The shipped configs of an embedded UNet model (family, unet, vae, text_encoders) while
    trainer/families/sd/tiny.py is the one they came from, else None."""
    return _embedded(value, "unet", UNET_BUILDER)


def embedded_flow_config(value: str) -> Optional[dict]:
    """The shipped transformer config of an embedded FLUX.1 / SD 3.5 model while
    trainer/families/common/tiny_mmdit.py is the one it came from, else None."""
    return _embedded(value, "flow", FLOW_BUILDER)
