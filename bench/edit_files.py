"""FLUX.1 Kontext [dev] and Qwen-Image-Edit (-2509) as diffusers folders at full size but sparse:
each component's config is the studio's shipped one (trainer/assets/families/flux1-dev,
qwen-image: Kontext's and the edit models' transformers have those shapes), the pipeline class
in ``model_index.json`` says which model it is, and the text encoders' and VAE's
``model.safetensors`` hold their key names and shapes (built on the meta device) over a hole of
the right size (bench/flux2_files.py's :func:`write_sparse`). The advisor reads such a folder as
it reads a downloaded one (nothing but headers and configs); bench/edit_advisor_table.py and
tests/test_advisor_edit.py use them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flux2_files import write_sparse

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "trainer" / "assets" / "families"
# (shipped configs, the pipeline class, component folder -> the class to build it with)
MODELS = {
    "flux1-kontext-dev": ("flux1-dev", "FluxKontextPipeline",
                          {"text_encoder": "transformers.CLIPTextModel",
                           "text_encoder_2": "transformers.T5EncoderModel",
                           "vae": "diffusers.AutoencoderKL"}),
    "qwen-image-edit": ("qwen-image", "QwenImageEditPipeline",
                        {"text_encoder": "transformers.Qwen2_5_VLForConditionalGeneration",
                         "vae": "diffusers.AutoencoderKLQwenImage"}),
    "qwen-image-edit-2509": ("qwen-image", "QwenImageEditPlusPipeline",
                             {"text_encoder": "transformers.Qwen2_5_VLForConditionalGeneration",
                              "vae": "diffusers.AutoencoderKLQwenImage"}),
}


def _layout(folder: Path, cls: str) -> dict:
    import importlib

    import torch

    module, name = cls.split(".")
    klass = getattr(importlib.import_module(module), name)
    with torch.device("meta"):
        if module == "diffusers":
            model = klass.from_config(json.loads((folder / "config.json").read_text()))
        else:
            import transformers

            model = klass(transformers.AutoConfig.from_pretrained(str(folder)))
    return {k: (tuple(v.shape), "bfloat16") for k, v in model.state_dict().items()}


def edit_folder(root: Path, model: str) -> Path:
    """``model``'s folder (a key of :data:`MODELS`) under ``root``, made once."""
    assets, pipeline, parts = MODELS[model]
    folder = Path(root) / model
    if (folder / "model_index.json").is_file():
        return folder
    shutil.copytree(ASSETS / assets, folder, dirs_exist_ok=True)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps(dict(index, _class_name=pipeline)))
    for part, cls in parts.items():
        write_sparse(folder / part / "model.safetensors", _layout(folder / part, cls))
    return folder
