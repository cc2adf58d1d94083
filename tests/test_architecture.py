"""The trainer's layout holds: no import circles, each package imports only the layers below it,
the config stays light, nothing in trainer/ reaches for the GUI, and no module grows past 400
lines. docs/architecture.md describes the layers this test enforces.

The checker reads the source (every ``import``, at any depth: a circle through a function-level
import is still a circle in the design), so it runs in milliseconds and sees modules that a test
never imports. Its own cases below show that it fails on a circle and on a forbidden import.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
# Each package of trainer/ with the packages it may import (besides itself). The order is the
# order of the layers, from the floor up; docs/architecture.md says what each holds.
ALLOWED: dict[str, set[str]] = {
    "system": set(),
    "events": set(),
    "optim": {"system"},
    "families": {"system"},
    "config": {"system", "optim", "families"},
    "objectives": {"config", "system", "families"},
    "models": {"config", "system", "families"},
    "data": {"config", "system", "families", "models"},
    "export": {"config", "system", "families", "models"},
    "methods": {"config", "system", "families", "models", "data", "export"},
    "importers": {"config", "system", "families", "models", "data"},
    "advisor": {"config", "system", "optim", "families", "models", "data", "export", "methods"},
    "tools": {"config", "system", "optim", "families", "models", "data", "export", "methods"},
    "run": {"config", "system", "events", "optim", "objectives", "families", "models", "data",
            "export", "methods"},
}
# trainer/families/: the registry, the specs and the torch-free roles are the "families" layer
# (under the config, which reads the registry); every other role file sits in the layer of what
# it does, by its name (a family's ``lora`` is an export, its ``kohya`` an importer's table).
ROLE_LAYERS = {"detect": "families", "spec": "families", "files": "families",
               "mmdit_detect": "families", "rules": "config", "kohya": "importers",
               "lora": "export", "checkpoint": "export", "pipeline_folder": "export",
               "mmdit_checkpoint": "export", "mmdit_lora_file": "export", "memory": "advisor",
               "targets": "tools"}
TORCH_FREE_ROLES = ("detect", "rules", "spec", "files", "mmdit_detect", "kohya")
TOP = {"cli", "__main__", ""}  # the commands and the package root: may import any package
HEAVY = ("torch", "diffusers", "transformers", "peft", "accelerate", "gradio", "safetensors")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path, modules: set[str]) -> set[str]:
    """The trainer modules (or packages) that ``path`` imports, anywhere in the file."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import module` names a module
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the trainer / kohya_gui modules it imports} for every module under root/trainer."""
    paths = sorted((root / "trainer").rglob("*.py"))
    modules = {module_name(root, p) for p in paths}
    return {module_name(root, p): imports_of(root, p, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> str:
    """``trainer.run.loop`` -> ``run``; the root package and its top modules by their names; a
    module of ``trainer/families/<folder>/`` by its role (``ROLE_LAYERS``, else ``models``)."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "families":
        return ROLE_LAYERS.get(parts[-1], "models")
    return parts[1] if len(parts) > 1 else ""


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses the layers the wrong way, or leaves trainer/ for kohya_gui."""
    problems = []
    for module, targets in sorted(graph.items()):
        own = layer(module)
        for target in sorted(targets):
            top = target.split(".")[0]
            if top == "kohya_gui":
                problems.append(f"{module} imports {target}: the trainer never imports the GUI")
            elif _other_family(module, target):
                problems.append(f"{module} imports {target}: a family folder imports no other "
                                f"family's (only trainer/families/common, and sdxl from sd)")
            elif top == "trainer" and layer(target) != own and own not in TOP:
                allowed = ALLOWED.get(own)
                if allowed is None:
                    problems.append(f"{module}: trainer/{own} is not a known layer (add it to "
                                    f"ALLOWED and docs/architecture.md)")
                elif layer(target) not in allowed:
                    problems.append(f"{module} imports {target}: trainer/{own} may import only "
                                    f"{', '.join(sorted(allowed)) or 'itself'}")
    return problems


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "families" and \
        (root_package := parts[2]) not in ("spec",) and root_package else None


def _other_family(module: str, target: str) -> bool:
    """An import from one family folder into another (sdxl may extend sd; all use common)."""
    own, other = _folder(module), _folder(target)
    return (own is not None and other is not None and own != other and "common" not in
            (own, other) and (own, other) != ("sdxl", "sd") and len(target.split(".")) > 3)


def torch_free_paths(root: Path) -> list[Path]:
    """trainer/config and the torch-free roles of trainer/families (detect, rules, ...)."""
    families = root / "trainer" / "families"
    return sorted((root / "trainer" / "config").rglob("*.py")) + sorted(
        p for p in families.rglob("*.py")
        if p.stem in TORCH_FREE_ROLES or p.name == "__init__.py")


def heavy_config_imports(root: Path) -> list[str]:
    """Imports of torch and the other heavy libraries in trainer/config and in the torch-free
    family roles (the GUI, the advisor and the doctor detect and validate without torch)."""
    out = []
    for path in torch_free_paths(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            out += [f"{module_name(root, path)} imports {n}" for n in names
                    if n.split(".")[0] in HEAVY]
    return out


def family_words() -> set[str]:
    """Every spelling of a family or a variant: the registry's names, folders and assets."""
    from trainer.families import FAMILIES

    words = {"flux", "sd"}
    for spec in FAMILIES.values():
        words |= {spec.name, spec.folder} | {v.asset for v in spec.variants}
    return words


def _literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in _literals(e)]
    return []


def family_literal_comparisons(root: Path) -> list[str]:
    """``x == "flux1"``, ``version in ("sd1", "sd2")``, ``name.startswith("flux")`` outside
    trainer/families: a family's behaviour belongs to its folder or its spec."""
    words, out = family_words(), []
    paths = [p for folder in ("trainer", "kohya_gui") for p in sorted((root / folder).rglob("*.py"))
             if "families" not in p.relative_to(root).parts[:2]]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = []
            if isinstance(node, ast.Compare):
                found = [w for side in [node.left, *node.comparators] for w in _literals(side)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "endswith"):
                found = [w for a in node.args for w in _literals(a)]
            hits = sorted({w for w in found if w in words})
            if hits:
                out.append(f"{path.relative_to(root)}:{node.lineno} compares {', '.join(hits)}")
    return out


def long_modules(root: Path) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for folder in ("trainer", "kohya_gui")
            for p in sorted((root / folder).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]


# --- the project as it is --------------------------------------------------------------------

def test_no_import_circles():
    assert circles(import_graph(ROOT)) == []


def test_every_import_goes_down_the_layers():
    graph = import_graph(ROOT)
    assert {layer(m) for m in graph} - TOP <= set(ALLOWED), "a package without a layer"
    assert forbidden_imports(graph) == []


def test_the_config_imports_nothing_heavy():
    assert heavy_config_imports(ROOT) == []


def test_loading_every_preset_imports_no_heavy_library():
    """The GUI builds its form and validates configs in a process that may never train."""
    code = (
        "import sys\n"
        "from trainer.config import files\n"
        "from trainer.config.paths import presets_dir, PROJECT_ROOT\n"
        "paths = sorted(presets_dir().rglob('*.toml')) + [PROJECT_ROOT / 'config_example.toml']\n"
        "for p in paths: files.load(p)\n"
        f"print(len(paths), sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split(" ", 1)
    presets = len(list((ROOT / "presets").rglob("*.toml")))
    assert int(out[0]) == presets + 1 and out[1].strip() == "[]"


def test_no_family_name_is_compared_outside_the_families():
    assert family_literal_comparisons(ROOT) == []


def test_no_module_over_400_lines():
    assert long_modules(ROOT) == []


def test_the_top_level_holds_only_packages_and_the_entry_points():
    top = sorted(p.name for p in (ROOT / "trainer").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py", "events.py"]


# --- the checker catches what it is for ------------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the trainer's sources to break on purpose."""
    shutil.copytree(ROOT / "trainer", tmp_path / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__", "assets"))
    assert circles(import_graph(tmp_path)) == [] and forbidden_imports(import_graph(tmp_path)) == []
    return tmp_path


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")


def test_a_circle_through_a_function_level_import_is_found(tree):
    append(tree / "trainer/config/plan.py",
           "def late():\n    from trainer.config.files import load  # noqa\n")
    append(tree / "trainer/config/files.py", "from trainer.config import plan  # noqa")
    assert [c for c in circles(import_graph(tree)) if "trainer.config.plan" in c] == [
        ["trainer.config.files", "trainer.config.plan"]]


def test_a_relative_import_circle_is_found(tree):
    append(tree / "trainer/data/buckets.py", "from .dataset import TrainingData  # noqa")
    found = circles(import_graph(tree))
    assert any({"trainer.data.buckets", "trainer.data.dataset"} <= set(c) for c in found)


@pytest.mark.parametrize("where, line, expected", [
    ("trainer/data/buckets.py", "from trainer.run.loop import run",
     "trainer.data.buckets imports trainer.run.loop: trainer/data may import only"),
    ("trainer/models/loader.py", "import trainer.run.step",
     "trainer.models.loader imports trainer.run.step: trainer/models may import only"),
    ("trainer/system/device.py", "from trainer.models import loader",
     "trainer.system.device imports trainer.models.loader: trainer/system may import only itself"),
    ("trainer/families/sd/detect.py", "from trainer.models import loader",
     "trainer.families.sd.detect imports trainer.models.loader: trainer/families may import only"),
    ("trainer/families/flux/lora.py", "from trainer.run import loop",
     "trainer.families.flux.lora imports trainer.run.loop: trainer/export may import only"),
    ("trainer/families/sd3/conditioning.py", "from trainer.families.flux import conditioning",
     "trainer.families.sd3.conditioning imports trainer.families.flux.conditioning: a family "
     "folder imports no other family's"),
    ("trainer/config/schema.py", "from trainer.data import DatasetError",
     "trainer.config.schema imports trainer.data: trainer/config may import only"),
    ("trainer/run/loop.py", "from kohya_gui.runner import Runner",
     "trainer.run.loop imports kohya_gui.runner: the trainer never imports the GUI"),
])
def test_a_forbidden_import_is_found(tree, where, line, expected):
    append(tree / where, f"def later():\n    {line}  # noqa\n")
    problems = forbidden_imports(import_graph(tree))
    assert len(problems) == 1 and problems[0].startswith(expected), problems


@pytest.mark.parametrize("line", ['if model.version == "flux1":\n        pass',
                                  'ok = family in ("sd1", "sd2")',
                                  'ok = name.startswith("flux")'])
def test_a_family_name_comparison_is_found(tree, line):
    append(tree / "trainer/run/step.py", f"def later(model, family, name):\n    {line}\n")
    assert [p.split(" compares")[0].split(":")[0] for p in family_literal_comparisons(tree)
            if p.startswith("trainer/run/step.py")] == ["trainer/run/step.py"]


def test_a_family_comparison_inside_its_folder_is_allowed(tree):
    append(tree / "trainer/families/flux/conditioning.py",
           'def later(model):\n    return model.version == "flux1"\n')
    assert not [p for p in family_literal_comparisons(tree) if "families" in p]


def test_torch_in_a_detect_role_is_found(tree):
    append(tree / "trainer/families/flux/detect.py", "def later():\n    import torch  # noqa\n")
    assert heavy_config_imports(tree) == ["trainer.families.flux.detect imports torch"]


def test_torch_in_the_config_is_found(tree):
    append(tree / "trainer/config/rules/__init__.py", "def later():\n    import torch  # noqa\n")
    assert heavy_config_imports(tree) == ["trainer.config.rules imports torch"]


def test_a_long_module_is_found(tree):
    (tree / "kohya_gui").mkdir()
    (tree / "kohya_gui" / "big.py").write_text("x = 1\n" * 401)
    assert long_modules(tree) == ["kohya_gui/big.py: 401 lines"]
