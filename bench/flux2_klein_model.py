"""A FLUX.2 [klein] 4B at real width and reduced depth, with random weights, as the
``Flux2KleinPipeline`` folder the released model ships, and a few 256 px images: the model and
data of bench/flux2_klein_lora_vs_diffusers.py.

    .venv/bin/python bench/flux2_klein_model.py OUT_DIR [--double 2] [--single 2]

Writes ``OUT_DIR/model`` and the images of bench/vs_example.py (``OUT_DIR/images`` for the
example, ``OUT_DIR/data/1_shape`` with caption files for the studio).

The model (fixed seed, stored in bf16 as the released files are):
- transformer: ``Flux2Transformer2DModel`` with klein 4B's config (hidden 3072 = 24 heads of
  128, 128 packed latent channels, text input 7680 = three Qwen3-4B hidden states of 2560,
  gated MLP ratio 3, RoPE axes (32, 32, 32, 32) theta 2000, no guidance embedder) but
  ``--double`` double-stream and ``--single`` single-stream blocks (real: 5 and 20). A double
  block is 0.25 G parameters, a single one 0.12 G, the shared modulations and embedders 0.3 G:
  the default (2 and 2) is 1.04 G parameters, 3.9 GiB in fp32;
- text encoder: ``Qwen3ForCausalLM`` (the class the pipeline names) at Qwen3-4B's hidden width
  2560, which is what shapes the denoiser's input, with 28 layers so that klein's layers 9, 18
  and 27 exist, but narrow inside (2 heads of 128, 1 KV head, MLP 256: real 32, 8 and 9728):
  0.11 G parameters where the real one has 4 G. Both tools encode the one caption once;
- tokenizer: the tiny offline Qwen2 tokenizer of trainer/families/common/tiny_qwen.py, with
  Qwen3's chat template;
- vae: ``AutoencoderKLFlux2`` with its default (the released) config, 32 latent channels;
- scheduler: klein's ``FlowMatchEulerDiscreteScheduler`` (shift 3, dynamic shifting);
- ``model_index.json`` with ``is_distilled: true`` (klein 4B, not klein-base).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vs_example import SEED, build_images

ROOT = Path(__file__).resolve().parent.parent
TRANSFORMER = dict(patch_size=1, in_channels=128, attention_head_dim=128, num_attention_heads=24,
                   joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
                   axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, guidance_embeds=False)
QWEN3 = dict(hidden_size=2560, num_hidden_layers=28, num_attention_heads=2,
             num_key_value_heads=1, head_dim=128, intermediate_size=256, hidden_act="silu",
             max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
             tie_word_embeddings=True, attention_bias=False)


def build_model(out: Path, double: int, single: int) -> None:
    """The diffusers folder ``out`` (see the module docstring)."""
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(ROOT))
    from trainer.families.common.tiny_mmdit import flux_scheduler
    from trainer.families.common.tiny_qwen import build_qwen_tokenizer

    torch.manual_seed(SEED)
    tokenizer = build_qwen_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **QWEN3)
    text_encoder = Qwen3ForCausalLM(config).to(torch.bfloat16)
    transformer = Flux2Transformer2DModel(num_layers=double, num_single_layers=single,
                                          **TRANSFORMER).to(torch.bfloat16)
    vae = AutoencoderKLFlux2().to(torch.bfloat16)
    pipe = Flux2KleinPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder,
                              tokenizer=tokenizer, scheduler=flux_scheduler(), is_distilled=True)
    pipe.save_pretrained(out, safe_serialization=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--double", type=int, default=2, help="double-stream blocks (real: 5)")
    parser.add_argument("--single", type=int, default=2, help="single-stream blocks (real: 20)")
    args = parser.parse_args()
    build_model(args.out / "model", args.double, args.single)
    build_images(args.out)
    print(f"wrote {args.out / 'model'}, {args.out / 'images'}, {args.out / 'data'}")


if __name__ == "__main__":
    main()
