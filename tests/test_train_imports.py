"""A ``train`` imports only what the run uses (issue 20's start-up): no gradio, GUI, tools,
importers, advisor or onnxruntime, and only the diffusers model modules of its family."""

import json
import subprocess
import sys

from trainer.config.paths import PROJECT_ROOT
from trainer.models.lazy_diffusers import import_structure

UNUSED = ("gradio", "kohya_gui", "trainer.tools", "trainer.importers", "trainer.advisor",
          "onnxruntime")

# the CLI's train on one step of the tiny model, then the modules it imported
SCRIPT = """
import json, runpy, sys
sys.argv = ["trainer", "train", "presets/lora/default.toml", "--set", "training.max_train_steps=1",
            "--set", "saving.output_dir=%r", "--set", "training.log_with=none"]
try:
    runpy.run_module("trainer", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("MODULES=" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _train_modules(out) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT % str(out)], capture_output=True,
                          text=True, cwd=PROJECT_ROOT, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES=")), None)
    assert line is not None, proc.stderr[-2000:]
    return json.loads(line[len("MODULES="):])


def test_a_train_imports_nothing_the_run_does_not_use(tmp_path, tiny_model_dir):
    done = _train_modules(tmp_path / "out")
    assert done["code"] == 0
    modules = done["modules"]
    assert "trainer.run.loop" in modules and "peft" in modules  # it did train
    assert [m for m in modules if m.startswith(UNUSED)] == []
    autoencoders = [m for m in modules if m.startswith("diffusers.models.autoencoders.")]
    assert sorted(autoencoders) == ["diffusers.models.autoencoders.autoencoder_kl",
                                    "diffusers.models.autoencoders.vae"]
    assert "diffusers.models.transformers.transformer_flux" not in modules
    assert "diffusers.models.unets.unet_stable_cascade" not in modules


def test_the_lazy_packages_keep_every_name_reachable():
    code = ("import sys; from trainer.models import lazy_diffusers as L; print(L.install()); "
            "from diffusers.models.autoencoders import AutoencoderTiny; "
            "from diffusers import AutoencoderKL, SD3Transformer2DModel, UNet2DConditionModel; "
            "import diffusers.models.autoencoders as a; "
            "print(AutoencoderTiny.__module__, SD3Transformer2DModel.__name__, "
            "a.AutoencoderKL is AutoencoderKL, type(sys.modules['diffusers.models.unets']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    replaced, names = proc.stdout.splitlines()[-2:]
    assert "diffusers.models.autoencoders" in replaced
    assert names.startswith("diffusers.models.autoencoders.autoencoder_tiny "
                            "SD3Transformer2DModel True")
    assert "_LazyModule" in names


def test_an_init_with_anything_but_relative_imports_is_left_eager():
    plain = "from ...utils import is_torch_available\n\nif is_torch_available():\n" \
            "    from .a import A, B\n    from .b import C\n"
    assert import_structure(plain) == {"a": ["A", "B"], "b": ["C"]}
    assert import_structure(plain + "X = 1\n") is None
    assert import_structure("if other():\n    from .a import A\n") is None
    assert import_structure("") is None
