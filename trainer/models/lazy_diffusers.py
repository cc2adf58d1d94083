"""diffusers' model packages made lazy before a run imports its classes.

``diffusers`` itself is a lazy module, but three of its packages are not: the ``__init__`` of
``diffusers.models.autoencoders`` imports every autoencoder (the RAE autoencoder pulls in three
transformers vision models), ``diffusers.models.transformers`` every transformer (about 60, as
soon as the SD UNet's blocks import ``dual_transformer_2d``) and ``diffusers.models.unets``
every UNet. A run uses one UNet or transformer and one autoencoder.

``install()`` puts, for each such package not yet imported, diffusers' own ``_LazyModule`` in
``sys.modules``, built from the package's ``from .module import Name`` lines: every name stays
reachable (``from diffusers.models.autoencoders import AutoencoderTiny`` imports that one module),
only nothing is imported before it is asked for. A package whose ``__init__`` holds anything
else (a later diffusers) is left as it is.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from typing import Optional

PACKAGES = ("diffusers.models.autoencoders", "diffusers.models.transformers",
            "diffusers.models.unets")
_GUARDS = {"is_torch_available"}  # ``if is_torch_available():`` blocks: torch is there


def import_structure(source: str) -> Optional[dict[str, list[str]]]:
    """``{submodule: [names]}`` of an ``__init__`` made only of relative imports (inside
    ``if is_torch_available():``); None when it holds anything else."""
    structure: dict[str, list[str]] = {}

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                structure.setdefault(node.module, []).extend(a.asname or a.name
                                                             for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level > 1:
                continue  # ``from ...utils import is_torch_available``
            elif (isinstance(node, ast.If) and isinstance(node.test, ast.Call)
                  and getattr(node.test.func, "id", None) in _GUARDS and not node.orelse):
                if not visit(node.body):
                    return False
            else:
                return False
        return True

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return structure if visit(tree.body) and structure else None


def _lazy(name: str):
    spec = importlib.util.find_spec(name)  # imports the parents (lazy modules), not ``name``
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    with open(spec.origin, encoding="utf-8") as fh:
        structure = import_structure(fh.read())
    if structure is None:
        return None
    from diffusers.utils.import_utils import _LazyModule

    module = _LazyModule(name, spec.origin, structure, module_spec=spec)
    module.__loader__ = spec.loader
    return module


def install() -> list[str]:
    """Make the packages lazy that are not imported yet; returns the names it replaced."""
    if importlib.util.find_spec("diffusers") is None:
        return []
    done = []
    for name in PACKAGES:
        if name in sys.modules:
            continue
        try:
            module = _lazy(name)
        except (ImportError, OSError, AttributeError, TypeError):
            module = None  # a diffusers unlike 0.3x-0.4x: its own eager package
        if module is not None:
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, module)  # as the import system would
            done.append(name)
    return done
