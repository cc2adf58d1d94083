"""The tiny twins of the flow-matching families: FLUX.1 and SD 3.5, built offline.

As :mod:`trainer.families.sd.tiny` does for the UNet families, each builder seeds torch before each
module and makes every part from a config, so a family's folder is byte-identical on every run
and loads with diffusers' own pipeline (``FluxPipeline``, ``StableDiffusion3Pipeline``). The
features that tell the families apart are kept, the sizes are not:

- a VAE with 16 latent channels, factor 8, no quant convs, and the family's ``scaling_factor``
  and ``shift_factor`` (FLUX.1 0.3611 / 0.1159, SD3 1.5305 / 0.0609: sd-scripts'
  ``flux_models.py`` and ``sd3_models.py``);
- FLUX.1(-dev): CLIP-L (pooled, 32 wide) and T5 (hidden states, 48 wide) into a
  FluxTransformer2DModel whose input is the 2x2-packed latents (``in_channels = 4 * 16``), whose
  rotary axes add up to the head width, and with the guidance embedding of the dev model;
- SD 3.5: CLIP-L and CLIP-G with projections (32 and 48; their pooled outputs joined, 80) and T5
  (96, wider than the two CLIP hidden states side by side, which the pipeline pads to T5's
  width), into an SD3Transformer2DModel with 3.5's ``qk_norm = "rms_norm"`` and 3.5 medium's
  dual attention (``dual_attention_layers``).

The T5 tokenizer is a Unigram model over a small built-in word list, constructed in code with
the ``tokenizers`` library (T5's real vocabulary is a sentencepiece model that cannot ship
here); it keeps T5's special ids: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from trainer.families.sd.tiny import _CORPUS, TINY_SEED, _tiny_text_encoder, build_tokenizer

LATENT_CHANNELS = 16
FLUX_VAE = {"scaling_factor": 0.3611, "shift_factor": 0.1159}
SD3_VAE = {"scaling_factor": 1.5305, "shift_factor": 0.0609}
FLUX_WIDTHS = {"clip_l": 32, "t5": 48}
SD3_WIDTHS = {"clip_l": 32, "clip_g": 48, "t5": 96}
FLUX_ROPE_AXES = (4, 6, 6)  # (16, 56, 56) in FLUX.1: sum = attention_head_dim
FLUX_T5_MAX_LENGTH = 512  # FLUX.1-dev's (schnell: 256); the pipelines' max_sequence_length
SD3_T5_MAX_LENGTH = 256
TINY_FLOW_BUILDERS = {"flux": "tiny-flux", "flux-kontext": "tiny-flux-kontext", "sd3": "tiny-sd3"}
# the pipeline each tiny folder is written as (FLUX.1 Kontext: FLUX.1's components)
TINY_FLOW_PIPELINES = {"flux": "FluxPipeline", "flux-kontext": "FluxKontextPipeline",
                       "sd3": "StableDiffusion3Pipeline"}
T5_SPECIALS = ("<pad>", "</s>", "<unk>")
_T5_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()"


def t5_vocab() -> list[tuple[str, float]]:
    """(piece, log-probability) of the tiny T5 vocabulary: the specials, "▁", each word of the
    built-in list with its leading "▁" (likelier than its letters) and the single characters."""
    words = sorted(set(_CORPUS))
    pieces = [(tok, 0.0) for tok in T5_SPECIALS] + [("▁", -2.0)]
    pieces += [("▁" + w, -math.log(len(words)) - 1.0) for w in words]
    pieces += [(c, -20.0) for c in _T5_CHARS] + [("▁" + c, -21.0) for c in _T5_CHARS]
    return pieces


def build_t5_tokenizer(model_max_length: int = FLUX_T5_MAX_LENGTH):
    """A T5 tokenizer (``tokenizers`` Unigram, T5's pre-tokenizer and ``</s>`` suffix), no
    sentinel tokens."""
    from transformers import T5TokenizerFast

    return T5TokenizerFast(vocab=t5_vocab(), extra_ids=0, model_max_length=model_max_length)


def _t5_encoder(tokenizer, d_model: int):
    """A T5 v1.1 encoder (gated GELU, as T5-XXL), two layers, ``d_model`` wide."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_ff=2 * d_model, d_kv=8,
                      num_heads=4, num_layers=2, relative_attention_num_buckets=8,
                      relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
                      is_encoder_decoder=False, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0)
    return T5EncoderModel(config)


def _flow_vae(scaling_factor: float, shift_factor: float):
    """A factor-8 AutoencoderKL with 16 latent channels and no quant convs, as both families'."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, sample_size=64,
        block_out_channels=(16, 16, 32, 32), norm_num_groups=8, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        use_quant_conv=False, use_post_quant_conv=False, scaling_factor=scaling_factor,
        shift_factor=shift_factor,
    )


def flux_scheduler():
    """FLUX.1-dev's scheduler config: shift 3, resolution-dependent (exponential) shifting."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)


def build_flux_components(seed: int = TINY_SEED, guidance_embeds: bool = True) -> dict:
    """Transformer, VAE, CLIP-L, T5, their tokenizers and the scheduler of the tiny FLUX.1;
    ``guidance_embeds=False`` gives the schnell-like model (no guidance input)."""
    from diffusers import FluxTransformer2DModel

    tokenizer, tokenizer_2 = build_tokenizer(), build_t5_tokenizer(FLUX_T5_MAX_LENGTH)
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=1, num_single_layers=1,
        attention_head_dim=sum(FLUX_ROPE_AXES), num_attention_heads=2,
        joint_attention_dim=FLUX_WIDTHS["t5"], pooled_projection_dim=FLUX_WIDTHS["clip_l"],
        guidance_embeds=guidance_embeds, axes_dims_rope=FLUX_ROPE_AXES)
    torch.manual_seed(seed + 1)
    vae = _flow_vae(**FLUX_VAE)
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_text_encoder(tokenizer, FLUX_WIDTHS["clip_l"])
    torch.manual_seed(seed + 3)
    text_encoder_2 = _t5_encoder(tokenizer_2, FLUX_WIDTHS["t5"])
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "text_encoder_2": text_encoder_2, "tokenizer": tokenizer,
            "tokenizer_2": tokenizer_2, "scheduler": flux_scheduler()}


def build_sd3_components(seed: int = TINY_SEED) -> dict:
    """Transformer (3.5 options), VAE, CLIP-L, CLIP-G, T5, tokenizers and the scheduler of the
    tiny SD 3.5."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    tokenizer, tokenizer_2 = build_tokenizer(), build_tokenizer(pad_token="!")
    tokenizer_3 = build_t5_tokenizer(SD3_T5_MAX_LENGTH)
    clip_l, clip_g, t5 = SD3_WIDTHS["clip_l"], SD3_WIDTHS["clip_g"], SD3_WIDTHS["t5"]
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS,
        num_layers=2, attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=t5, pooled_projection_dim=clip_l + clip_g, pos_embed_max_size=32,
        dual_attention_layers=(0,), qk_norm="rms_norm")
    torch.manual_seed(seed + 1)
    vae = _flow_vae(**SD3_VAE)
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_text_encoder(tokenizer, clip_l, CLIPTextModelWithProjection)
    torch.manual_seed(seed + 3)
    text_encoder_2 = _tiny_text_encoder(tokenizer_2, clip_g, CLIPTextModelWithProjection,
                                        hidden_act="gelu")
    torch.manual_seed(seed + 4)
    text_encoder_3 = _t5_encoder(tokenizer_3, t5)
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "text_encoder_2": text_encoder_2, "text_encoder_3": text_encoder_3,
            "tokenizer": tokenizer, "tokenizer_2": tokenizer_2, "tokenizer_3": tokenizer_3,
            "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)}


def save_tiny_flow_model(path: str | Path, seed: int = TINY_SEED, *,
                         family: str = "flux") -> Path:
    """Write the tiny FLUX.1 (``family="flux"``), FLUX.1 Kontext (``"flux-kontext"``: FLUX.1's
    components in ``FluxKontextPipeline``'s folder) or SD 3.5 (``"sd3"``) as a diffusers
    folder, with ``embedded.json`` naming the builder, as
    :func:`trainer.families.sd.tiny.save_tiny_model`."""
    import diffusers

    if family not in TINY_FLOW_BUILDERS:
        raise ValueError(f"family {family!r}: the tiny flow families are "
                         f"{sorted(TINY_FLOW_BUILDERS)}")
    path = Path(path)
    parts = build_sd3_components(seed) if family == "sd3" else build_flux_components(seed)
    pipe = getattr(diffusers, TINY_FLOW_PIPELINES[family])(**parts)
    tmp = path.with_name(path.name + ".partial")
    pipe.save_pretrained(tmp, safe_serialization=True)
    info = {"seed": seed, "builder": TINY_FLOW_BUILDERS[family]}
    (tmp / "embedded.json").write_text(json.dumps(info))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure_tiny_flow_model(path: str | Path, seed: int = TINY_SEED,
                           family: str = "flux") -> Path:
    """The tiny flow model folder, built on first use."""
    path = Path(path)
    if not (path / "model_index.json").is_file():
        save_tiny_flow_model(path, seed, family=family)
    return path
