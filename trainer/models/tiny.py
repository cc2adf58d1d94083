"""The embedded default: a tiny model with the SD 1.x architecture, built offline.

Nothing can be downloaded here, in CI or on a first-time user's machine before they pick their
own checkpoint, so the project builds a small UNet2DConditionModel, AutoencoderKL (factor 8),
CLIPTextModel, a CLIP tokenizer and a DDPM scheduler from configs with a fixed seed, and saves
them as an ordinary diffusers folder. The loading code for a user's checkpoint loads it too.

The tokenizer is a real CLIP byte-level BPE tokenizer whose merges the project learns from a
small built-in word list (:func:`learn_bpe`), so no vocabulary file has to ship.
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


def build_tokenizer():
    """A CLIP tokenizer (77 tokens) over the learned vocabulary."""
    from transformers import CLIPTokenizer

    chars = list(bytes_to_unicode().values())
    merges = learn_bpe(_CORPUS, NUM_MERGES)
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def build_components(seed: int = TINY_SEED) -> dict:
    """UNet, VAE, text encoder, tokenizer and scheduler of the tiny SD 1.x model."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=16, cross_attention_dim=32,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, sample_size=128,
        block_out_channels=(32, 32, 64, 64), norm_num_groups=16, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    )
    torch.manual_seed(seed + 2)
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
        projection_dim=32, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = CLIPTextModel(text_config)
    scheduler = DDPMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
        beta_schedule="scaled_linear", clip_sample=False, prediction_type="epsilon",
        steps_offset=1,
    )
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "scheduler": scheduler}


def save_tiny_model(path: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny model as a diffusers StableDiffusionPipeline folder."""
    from diffusers import StableDiffusionPipeline

    path = Path(path)
    pipe = StableDiffusionPipeline(
        **build_components(seed), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )
    tmp = path.with_name(path.name + ".partial")
    pipe.save_pretrained(tmp, safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps({"seed": seed, "builder": "tiny-sd15"}))
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure_tiny_model(path: str | Path, seed: int = TINY_SEED) -> Path:
    """The tiny model folder, built on first use."""
    path = Path(path)
    if not (path / "model_index.json").is_file():
        save_tiny_model(path, seed)
    return path
