"""FLUX.2's conditioning (Black Forest Labs 2025; diffusers' ``Flux2KleinPipeline`` for klein,
``Flux2Pipeline`` for dev).

The prompt goes through Qwen3's chat template (one user turn, the generation prompt,
``enable_thinking=False``: the empty think block), padded / cut to ``max_sequence_length`` (512)
tokens and run with its attention mask; the hidden states of layers 9, 18 and 27 are stacked
side by side per token (3 x 2560 = 7680 wide in klein 4B). Every position, padding included,
goes to the transformer (no mask), as the pipeline hands it ``prompt_embeds``; the text's
position ids are (0, 0, 0, l). dev does the same with Mistral-Small-3 (the pipeline's
``_get_mistral_3_small_prompt_embeds``): ``[IMG]`` stripped from the prompt, the pipeline's
system message and the prompt as a system and a user turn through the chat template (padded /
cut to 512), the hidden states of layers 10, 20 and 30 side by side (3 x 5120 = 15360).

The latents are the VAE's 32 channels patchified 2x2 into 128 and normalized with the VAE's
BatchNorm running statistics (the pipeline's ``_encode_vae_image``); ``encode_latents`` returns
them unpatchified again, [B, 32, H/8, W/8], the shape the latent cache, the buckets and the
loss masks of every family keep (the 2x2 patchify is a fixed permutation of the elements, so
noise drawn there is the pipeline's noise in its own order, and the loss is the same). The
transformer reads them patchified and packed one token per patch with position ids
(0, h, w, 0), the sigma itself as its timestep (the pipeline passes ``t / 1000``), no guidance
(klein has no guidance embedder; dev's is given ``flow.guidance_scale``, FLUX.1's setting: 1.0,
musubi-tuner's fixed training value; diffusers' example defaults to 3.5), and returns the
velocity ``noise - latents``, unpatchified back.

Reference images (edit training's controls, trainer/families/flux2/references.py) are encoded
as the target is; their tokens follow the target's with position ids whose time coordinate
is 10, 20, ... per reference, and the output is cut back to the target's tokens.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.families.flux2.detect import MAX_SEQUENCE_LENGTH
from trainer.models.text_conditioning import TextConditioning

OUT_LAYERS = (9, 18, 27)  # Flux2KleinPipeline.encode_prompt's text_encoder_out_layers
DEV_OUT_LAYERS = (10, 20, 30)  # Flux2Pipeline.encode_prompt's
DEV = "dev"  # the variant that reads Mistral-Small-3 (trainer/families/flux2/__init__.py)


def qwen3_features(encoder: Any, tokenizer: Any, captions: list[str],
                   max_length: int = MAX_SEQUENCE_LENGTH) -> torch.Tensor:
    """[B, L, 3 x width]: the pipeline's own prompt encoding (its static
    ``_get_qwen3_prompt_embeds``), in the encoder's dtype on its device."""
    from diffusers import Flux2KleinPipeline

    return Flux2KleinPipeline._get_qwen3_prompt_embeds(
        encoder, tokenizer, captions, max_sequence_length=max_length,
        hidden_states_layers=OUT_LAYERS)


def mistral_features(encoder: Any, tokenizer: Any, captions: list[str],
                     max_length: int = MAX_SEQUENCE_LENGTH) -> torch.Tensor:
    """[B, L, 3 x width]: dev's prompt encoding, the pipeline's own (its static
    ``_get_mistral_3_small_prompt_embeds`` with its system message)."""
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    return Flux2Pipeline._get_mistral_3_small_prompt_embeds(
        encoder, tokenizer, captions, max_sequence_length=max_length,
        system_message=SYSTEM_MESSAGE, hidden_states_layers=DEV_OUT_LAYERS)


def normalize_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """The VAE's [B, C, H, W] latents patchified to [B, 4C, H/2, W/2] and normalized with its
    BatchNorm statistics, as the pipeline's ``_encode_vae_image``."""
    from diffusers import Flux2KleinPipeline

    latents = Flux2KleinPipeline._patchify_latents(latents)
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return (latents - mean) / std.to(latents.device, latents.dtype)


def transformer_call(transformer: Any, latents: torch.Tensor, sigma: torch.Tensor,
                     hidden: torch.Tensor, guidance: Optional[float] = None,
                     references: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
    """The transformer's output for patchified latents [B, C, H, W] at ``sigma`` [B] (the
    pipeline's ``timestep / 1000``), as the pipeline calls it; [B, C, H, W]. ``references``:
    patchified reference latents (one [B, C, h, w] each), read after the target's tokens;
    the output keeps the target's. The first call gives the transformer's SwiGLUs the
    backward that keeps less (trainer/families/common/swiglu.py; the same numbers), its
    last single-stream block a forward without the text rows it drops
    (trainer/families/flux2/last_block.py; the same numbers to float rounding), and its
    shared modulations bf16 storage where their fp32 weights are bf16 values
    (trainer/families/flux2/shared_weights.py; the same numbers)."""
    from diffusers import Flux2KleinPipeline as Pipe
    from diffusers.models.transformers.transformer_flux2 import Flux2SwiGLU

    from trainer.families.common.swiglu import lean_swiglu
    from trainer.families.flux2.last_block import live_rows_only
    from trainer.families.flux2.references import pack_references
    from trainer.families.flux2.shared_weights import keep_bf16

    if not getattr(transformer, "_lean_swiglu", False):  # once: keeps x, not silu(a) too
        lean_swiglu(transformer, Flux2SwiGLU)
        live_rows_only(transformer)
        transformer._lean_swiglu = True
    keep_bf16(transformer)  # decides once the base is frozen
    b, c, h, w = latents.shape
    tokens = Pipe._pack_latents(latents)
    img_ids = Pipe._prepare_latent_ids(latents).to(latents.device)
    if references:
        ref_tokens, ref_ids = pack_references([r.to(latents.dtype) for r in references])
        tokens = torch.cat([tokens, ref_tokens], dim=1)
        img_ids = torch.cat([img_ids, ref_ids], dim=1)
    txt_ids = Pipe._prepare_text_ids(hidden).to(latents.device)
    value = None
    if transformer.config.guidance_embeds:
        value = torch.full((b,), float(4.0 if guidance is None else guidance),
                           device=latents.device, dtype=latents.dtype)
    out = transformer(hidden_states=tokens, timestep=sigma, guidance=value,
                      encoder_hidden_states=hidden, txt_ids=txt_ids, img_ids=img_ids,
                      return_dict=False)[0]
    return out[:, :h * w].permute(0, 2, 1).reshape(b, c, h, w)


class Flux2Family:
    """FLUX.2 klein (4B, 9B, base) and dev: stacked Qwen3 (klein) or Mistral-Small-3 (dev)
    features, patchified normalized latents."""

    name = "flux2"
    objective = "flow"
    takes_guidance = False  # klein has no guidance embedder
    # a whole checkpoint's parts (trainer/families/flux2/checkpoint.py), and those of the file
    # as BFL ships it (flux-2-klein-4b.safetensors: the transformer alone)
    checkpoint_parts = ("transformer", "vae", "qwen3")
    shipped_parts = ("transformer",)

    def __init__(self, guidance: Optional[float] = None) -> None:
        self.guidance = guidance  # dev's distilled guidance (flow.guidance_scale)

    def checkpoint_name(self, variant: str) -> str:
        return f"flux2-{variant or 'klein-4b'}"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer)]

    def t5_slot(self) -> None:
        return None

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        length = getattr(model, "t5_max_length", 0) or MAX_SEQUENCE_LENGTH
        features = mistral_features if model.variant == DEV else qwen3_features
        return TextConditioning(features(model.text_encoder, model.tokenizer, captions, length))

    def encode_latents(self, vae: Any, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels in [-1, 1] -> the normalized latents, [B, C, H/8, W/8] (the mode, as the
        pipeline's ``argmax``, so caching is exact)."""
        from diffusers import Flux2KleinPipeline

        latents = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
        return Flux2KleinPipeline._unpatchify_latents(normalize_latents(vae, latents))

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None, controls: Optional[list[torch.Tensor]] = None
                ) -> torch.Tensor:
        """``noise - latents`` predicted for ``noisy`` [B, C, H/8, W/8] at sigmas ``t`` [B];
        ``controls``: the latents of its reference images (one [B, C, h, w] each, as
        ``encode_latents`` gives them, each its own size), read beside it."""
        from diffusers import Flux2KleinPipeline as Pipe

        transformer = denoiser if denoiser is not None else model.denoiser
        guidance = self.guidance
        if guidance is None and cfg is not None:
            guidance = cfg.flow.guidance_scale
        references = [Pipe._patchify_latents(c) for c in controls or ()]
        out = transformer_call(transformer, Pipe._patchify_latents(noisy), t.to(noisy.dtype),
                               text.hidden.to(noisy.dtype), guidance, references)
        return Pipe._unpatchify_latents(out)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import Flux2KleinPipeline, Flux2Pipeline

        if model.variant == DEV:
            return Flux2Pipeline(scheduler=scheduler, vae=model.vae,
                                 text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                                 transformer=denoiser)
        return Flux2KleinPipeline(scheduler=scheduler, vae=model.vae,
                                  text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                                  transformer=denoiser,
                                  is_distilled="base" not in (model.variant or ""))

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def family(name: str = "flux2", guidance: Optional[float] = None) -> Flux2Family:
    return Flux2Family(guidance)
