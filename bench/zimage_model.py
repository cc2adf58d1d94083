"""A Z-Image at real width and reduced depth, with random weights, as a diffusers folder, and
a few 256 px images: the model and data of bench/zimage_lora_vs_diffusers.py.

    .venv/bin/python bench/zimage_model.py OUT_DIR [--layers 1] [--refiners 1] [--te-layers 2]

Writes ``OUT_DIR/model`` (a ``ZImagePipeline`` folder), ``OUT_DIR/images`` (the images alone,
as diffusers' DreamBooth example reads a folder) and ``OUT_DIR/data/1_shape`` (the same images
with a caption file each, as the studio reads them). Every image has the same caption, since
the example gives one ``--instance_prompt`` to all images (per-image captions need its
``--dataset_name`` path and the ``datasets`` package).

The model (fixed seed, stored in bf16 as the released files are):
- transformer: ``ZImageTransformer2DModel`` with the real config (dim 3840, 30 heads of 128,
  SwiGLU hidden 10240, caption features 2560, patch 2, RoPE theta 256, axes [32, 48, 48]) but
  ``--layers`` main blocks and ``--refiners`` noise and context refiner blocks (real: 30 and 2),
  about 0.18 G parameters a block; the default, one of each (0.55 G parameters, 2.05 GiB in
  fp32), keeps a 256 px fp32 step near a minute on 2 AVX2 cores shared with other work;
- text encoder: ``Qwen3Model`` at Qwen3-4B's width (hidden 2560, 32 heads, 8 KV heads, MLP
  9728) with ``--te-layers`` layers (real: 36), its vocabulary the tokenizer's;
- tokenizer: the tiny offline Qwen2 tokenizer of trainer/families/common/tiny_qwen.py;
- vae: the FLUX.1 ``AutoencoderKL`` config (16 channels), the real one at full size;
- scheduler: Z-Image Turbo's ``FlowMatchEulerDiscreteScheduler`` (static shift 3.0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vs_example import CAPTION, SEED, build_images  # noqa: F401 - the bench reads CAPTION here

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMER = dict(all_patch_size=[2], all_f_patch_size=[1], in_channels=16, dim=3840,
                   n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560,
                   rope_theta=256.0, t_scale=1000.0, axes_dims=[32, 48, 48],
                   axes_lens=[1536, 512, 512])
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, hidden_act="silu",
                max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                tie_word_embeddings=True, attention_bias=False)
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
             "shift": 3.0, "use_dynamic_shifting": False}
MODEL_INDEX = {"_class_name": "ZImagePipeline",
               "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "Qwen3Model"],
               "tokenizer": ["transformers", "Qwen2Tokenizer"],
               "transformer": ["diffusers", "ZImageTransformer2DModel"],
               "vae": ["diffusers", "AutoencoderKL"]}


def build_model(out: Path, layers: int, refiners: int, te_layers: int) -> None:
    """The diffusers folder ``out`` (see the module docstring)."""
    import diffusers
    import torch
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    sys.path.insert(0, str(ROOT))
    from trainer.families.common.tiny_qwen import build_qwen_tokenizer

    torch.manual_seed(SEED)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen_tokenizer()
    tokenizer.save_pretrained(out / "tokenizer")
    config = Qwen3Config(vocab_size=len(tokenizer), num_hidden_layers=te_layers,
                         pad_token_id=tokenizer.pad_token_id, **QWEN3_4B)
    Qwen3Model(config).to(torch.bfloat16).save_pretrained(out / "text_encoder")
    transformer = ZImageTransformer2DModel(n_layers=layers, n_refiner_layers=refiners,
                                           **TRANSFORMER)
    transformer.to(torch.bfloat16).save_pretrained(out / "transformer")
    del transformer
    vae_config = json.loads((ROOT / "trainer/assets/families/flux1-dev/vae/config.json")
                            .read_text(encoding="utf-8"))
    vae_config.pop("_class_name", None)
    AutoencoderKL(**vae_config).to(torch.bfloat16).save_pretrained(out / "vae")
    (out / "scheduler").mkdir(exist_ok=True)
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
    index = {**MODEL_INDEX, "_diffusers_version": diffusers.__version__}
    (out / "model_index.json").write_text(json.dumps(index, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=1, help="main blocks (real: 30)")
    parser.add_argument("--refiners", type=int, default=1,
                        help="noise and context refiner blocks each (real: 2)")
    parser.add_argument("--te-layers", type=int, default=2, help="Qwen3 layers (real: 36)")
    args = parser.parse_args()
    build_model(args.out / "model", args.layers, args.refiners, args.te_layers)
    build_images(args.out)
    print(f"wrote {args.out / 'model'}, {args.out / 'images'}, {args.out / 'data'}")


if __name__ == "__main__":
    main()
