"""The embedded default: a tiny model with the SD 1.x architecture, built offline.

Nothing can be downloaded here, in CI or on a first-time user's machine before they pick their
own checkpoint, so the project builds a small UNet2DConditionModel, AutoencoderKL (factor 8),
CLIPTextModel, a CLIP tokenizer and a DDPM scheduler from configs with a fixed seed, and saves
them as an ordinary diffusers folder. The loading code for a user's checkpoint loads it too.

The tokenizer is a real CLIP byte-level BPE tokenizer whose merges the project learns from a
small built-in word list (:func:`learn_bpe`), so no vocabulary file has to ship.

The same recipe gives tiny SD 2.x and SDXL models (:func:`build_sd2_components`,
:func:`build_sdxl_components`, ``save_tiny_model(path, family=...)``) with the features that
tell the families apart and nothing more:

- SD 2.x: linear ``proj_in``/``proj_out`` in the UNet's transformers (``use_linear_projection``),
  a GELU text encoder (OpenCLIP's activation; CLIP ViT-L uses quick_gelu), padding with ``!``
  (OpenCLIP pads with token 0) and an epsilon or v-prediction scheduler.
- SDXL: two text encoders of different widths (32, a CLIPTextModel like ViT-L; 48, a
  CLIPTextModelWithProjection like OpenCLIP bigG), a UNet conditioned on both (cross-attention
  width 32 + 48) with ``addition_embed_type="text_time"``: its added embedding takes the second
  encoder's pooled projection (48) and six size/crop ids of ``addition_time_embed_dim`` each.
  Two widths that differ keep the encoders apart for diffusers' single-file reader too.

Each builder seeds torch before each module, so a family's folder is byte-identical on every run.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import torch

TINY_SEED = 0
NUM_MERGES = 400
_CORPUS = """
a an the of in on with and photo picture painting drawing illustration portrait style by art
red green blue yellow orange purple pink black white gray brown dark light bright
circle square triangle shape shapes background foreground center left right top bottom
man woman person girl boy dog cat bird car house tree flower sky water city street
sks ohwx token concept class subject character face eyes hair smile standing sitting
high quality detailed realistic anime sketch simple small large big close up view
""".split()


def bytes_to_unicode() -> dict[int, str]:
    """CLIP's (and GPT-2's) reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def learn_bpe(words: list[str], num_merges: int) -> list[tuple[str, str]]:
    """Byte-pair merges in CLIP's word form (last symbol ends in ``</w>``), deterministic."""
    b2u = bytes_to_unicode()
    counts = collections.Counter(words)
    seqs: dict[tuple[str, ...], int] = {}
    for word, count in sorted(counts.items()):
        chars = [b2u[b] for b in word.encode("utf-8")]
        chars[-1] += "</w>"
        seqs[tuple(chars)] = count
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for seq, count in seqs.items():
            for pair in zip(seq, seq[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])  # ties broken by sort order
        merges.append(best)
        seqs = {_merge(seq, best): count for seq, count in seqs.items()}
    return merges


def _merge(seq: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(seq[i] + seq[i + 1])
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return tuple(out)


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    chars = list(bytes_to_unicode().values())
    merges = learn_bpe(_CORPUS, NUM_MERGES)
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}, merges


def write_tokenizer_files(folder: str | Path, pad_token: str = "<|endoftext|>") -> Path:
    """The tiny tokenizer as the files a Hugging Face CLIP tokenizer repository holds."""
    vocab, merges = _vocab_and_merges()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    specials = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>", "pad_token": pad_token}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": 77, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def build_tokenizer(pad_token: str = "<|endoftext|>"):
    """A CLIP tokenizer (77 tokens) over the learned vocabulary; OpenCLIP's models pad with "!"."""
    from transformers import CLIPTokenizer

    vocab, merges = _vocab_and_merges()
    if pad_token == "<|endoftext|>":  # the default, as the SD 1.x tiny model always had it
        return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token=pad_token)


def build_components(seed: int = TINY_SEED) -> dict:
    """UNet, VAE, text encoder, tokenizer and scheduler of the tiny SD 1.x model."""
    from diffusers import DDPMScheduler

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    unet = _tiny_unet(cross_attention_dim=32, attention_head_dim=4)
    torch.manual_seed(seed + 1)
    vae = _tiny_vae()
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_text_encoder(tokenizer, 32)
    scheduler = DDPMScheduler(**_SCHEDULER, clip_sample=False, prediction_type="epsilon")
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "scheduler": scheduler}


def build_sd2_components(seed: int = TINY_SEED, prediction_type: str = "v_prediction") -> dict:
    """The tiny SD 2.x model: linear attention projections, a GELU encoder, "!" padding."""
    from diffusers import DDPMScheduler

    tokenizer = build_tokenizer(pad_token="!")
    torch.manual_seed(seed)
    unet = _tiny_unet(cross_attention_dim=32, attention_head_dim=(2, 4),
                      use_linear_projection=True)
    torch.manual_seed(seed + 1)
    vae = _tiny_vae()
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_text_encoder(tokenizer, 32, hidden_act="gelu")
    scheduler = DDPMScheduler(**_SCHEDULER, clip_sample=False,
                              prediction_type=prediction_type)
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "scheduler": scheduler}


SDXL_WIDTHS = (32, 48)  # CLIP ViT-L-like and OpenCLIP bigG-like encoders: 768 and 1280 in SDXL
SDXL_TIME_EMBED_DIM = 8  # each of the six size/crop ids; 256 in SDXL


def build_sdxl_components(seed: int = TINY_SEED) -> dict:
    """The tiny SDXL model: two text encoders of different widths and a text_time UNet."""
    from diffusers import EulerDiscreteScheduler
    from transformers import CLIPTextModelWithProjection

    tokenizer, tokenizer_2 = build_tokenizer(), build_tokenizer(pad_token="!")
    width_1, width_2 = SDXL_WIDTHS
    torch.manual_seed(seed)
    unet = _tiny_unet(
        block_out_channels=(32, 64, 64), layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 1, 2), attention_head_dim=(2, 4, 4),
        cross_attention_dim=width_1 + width_2, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=SDXL_TIME_EMBED_DIM,
        projection_class_embeddings_input_dim=width_2 + 6 * SDXL_TIME_EMBED_DIM,
    )
    torch.manual_seed(seed + 1)
    vae = _tiny_vae(scaling_factor=0.13025)
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_text_encoder(tokenizer, width_1)
    torch.manual_seed(seed + 3)
    text_encoder_2 = _tiny_text_encoder(tokenizer_2, width_2, CLIPTextModelWithProjection,
                                        hidden_act="gelu")
    scheduler = EulerDiscreteScheduler(**_SCHEDULER, prediction_type="epsilon",
                                       timestep_spacing="leading")
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder,
            "text_encoder_2": text_encoder_2, "tokenizer": tokenizer,
            "tokenizer_2": tokenizer_2, "scheduler": scheduler}


_SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                  beta_schedule="scaled_linear", steps_offset=1)


def _tiny_unet(**kw):
    from diffusers import UNet2DConditionModel

    args = dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                block_out_channels=(32, 64), norm_num_groups=16,
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    return UNet2DConditionModel(**{**args, **kw})


def _tiny_vae(**kw):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, sample_size=128,
        block_out_channels=(32, 32, 64, 64), norm_num_groups=16, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        **kw,
    )


def _tiny_text_encoder(tokenizer, width: int, model_class=None, **kw):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
        projection_dim=width, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kw,
    )
    return (model_class or CLIPTextModel)(config)


TINY_BUILDERS = {"sd1": "tiny-sd15", "sd2": "tiny-sd2", "sdxl": "tiny-sdxl"}


def save_tiny_model(path: str | Path, seed: int = TINY_SEED, *, family: str = "sd1",
                    prediction_type: str = "v_prediction") -> Path:
    """Write a tiny model as a diffusers folder; ``prediction_type`` is for SD 2.x only."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    if family not in TINY_BUILDERS:
        raise ValueError(f"family {family!r}: the tiny families are {sorted(TINY_BUILDERS)}")
    path = Path(path)
    info: dict = {"seed": seed, "builder": TINY_BUILDERS[family]}
    if family == "sdxl":
        pipe = StableDiffusionXLPipeline(**build_sdxl_components(seed), add_watermarker=False)
    else:
        parts = build_components(seed) if family == "sd1" else build_sd2_components(
            seed, prediction_type)
        if family == "sd2":
            info["prediction_type"] = prediction_type
        pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    tmp = path.with_name(path.name + ".partial")
    pipe.save_pretrained(tmp, safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps(info))
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure_tiny_model(path: str | Path, seed: int = TINY_SEED, family: str = "sd1") -> Path:
    """The tiny model folder, built on first use."""
    path = Path(path)
    if not (path / "model_index.json").is_file():
        save_tiny_model(path, seed, family=family)
    return path


def ensure(folder: str | Path, name: str = "sd1") -> Path:
    """The embedded twin of ``name`` (``sd1``, ``sd2``) in ``folder``, built once."""
    return ensure_tiny_model(folder, family=name)
