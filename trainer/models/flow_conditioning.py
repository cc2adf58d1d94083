"""What differs per flow family (FLUX.1, SD 3.5): how a caption becomes conditioning and how the
noisy latents enter the transformer.

The same methods as :class:`trainer.models.conditioning.SD1Family`, so the step, the text cache,
the validation loss and the samples ask the family instead of branching:

- **FLUX.1** (Black Forest Labs 2024; diffusers' ``FluxPipeline``): CLIP-L's pooled output and
  T5-XXL's last hidden states (``model.t5_max_length`` tokens: 512 for dev, 256 for schnell). The
  transformer reads the latents packed into 2x2 patches (one token of 4 x 16 channels each) with
  their row and column as ``img_ids``, zeros as ``txt_ids``, the sigma itself as its timestep,
  and, for the guidance-distilled dev, the guidance value (``flow.guidance_scale``).
- **SD 3.5** (Esser et al. 2024; ``StableDiffusion3Pipeline``): the penultimate hidden states
  of CLIP-L and CLIP-G side by side, padded to T5's width and followed by T5's tokens along the
  sequence; the two pooled, projected outputs joined as ``pooled_projections``; the timestep
  is sigma x 1000; the latents go in unpacked.

Both read ``(latents - shift_factor) * scaling_factor`` from their 16-channel VAE
(:func:`trainer.run.step.encode_images` applies the VAE config's shift).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from trainer.models.text_conditioning import TextConditioning

CLIP_LENGTH = 77
SD3_TIMESTEPS = 1000


def _tokens(tokenizer: Any, captions: list[str], length: int, device: Any) -> torch.Tensor:
    return tokenizer(captions, padding="max_length", max_length=length, truncation=True,
                     return_tensors="pt").input_ids.to(device)


def t5_hidden(model: Any, encoder: Any, tokenizer: Any, captions: list[str]) -> torch.Tensor:
    """T5's last hidden states for ``model.t5_max_length`` tokens (diffusers'
    ``_get_t5_prompt_embeds``: padded to the length, no attention mask, as sd-scripts trains
    without ``apply_t5_attn_mask``)."""
    return encoder(_tokens(tokenizer, captions, model.t5_max_length, encoder.device))[0]


class FluxFamily:
    """FLUX.1 dev and schnell: CLIP-L pooled + T5-XXL, packed latents, guidance for dev."""

    name = "flux1"
    objective = "flow"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer),
                ("text_encoder_2", model.text_encoder_2, model.tokenizer_2)]

    def t5_slot(self) -> str:
        return "text_encoder_2"

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        clip = model.text_encoder
        ids = _tokens(model.tokenizer, captions, CLIP_LENGTH, clip.device)
        pooled = clip(ids, output_hidden_states=False).pooler_output
        hidden = t5_hidden(model, model.text_encoder_2, model.tokenizer_2, captions)
        return TextConditioning(hidden, pooled)

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any,
                denoiser: Any = None) -> torch.Tensor:
        """The transformer's output for ``noisy`` [B, C, h, w] at sigmas ``t`` [B], unpacked
        back to the latents' shape."""
        from diffusers import FluxPipeline

        transformer = denoiser if denoiser is not None else model.unet
        b, c, h, w = noisy.shape
        packed = FluxPipeline._pack_latents(noisy, b, c, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device,
                                                         noisy.dtype)
        txt_ids = torch.zeros(text.hidden.shape[1], 3, device=noisy.device, dtype=noisy.dtype)
        guidance = None
        if transformer.config.guidance_embeds:
            guidance = torch.full((b,), float(cfg.flow.guidance_scale), device=noisy.device,
                                  dtype=noisy.dtype)
        out = transformer(hidden_states=packed, timestep=t.to(noisy.dtype), guidance=guidance,
                          pooled_projections=text.pooled, encoder_hidden_states=text.hidden,
                          txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        return FluxPipeline._unpack_latents(out, h, w, 1)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import FluxPipeline

        return FluxPipeline(scheduler=scheduler, vae=model.vae, text_encoder=model.text_encoder,
                            tokenizer=model.tokenizer, text_encoder_2=model.text_encoder_2,
                            tokenizer_2=model.tokenizer_2, transformer=denoiser)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def flow_family(version: str) -> FluxFamily:
    """The family object of ``model.version`` ``flux1`` or ``sd3``."""
    return FluxFamily() if version == "flux1" else SD3Family()


class SD3Family(FluxFamily):
    """SD 3 and 3.5: CLIP-L + CLIP-G + T5-XXL joined, unpacked latents, timestep sigma x 1000."""

    name = "sd3"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer),
                ("text_encoder_2", model.text_encoder_2, model.tokenizer_2),
                ("text_encoder_3", model.text_encoder_3, model.tokenizer_3)]

    def t5_slot(self) -> str:
        return "text_encoder_3"

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        hidden, pooled = [], []
        for _, encoder, tokenizer in self.text_encoders(model)[:2]:
            out = encoder(_tokens(tokenizer, captions, CLIP_LENGTH, encoder.device),
                          output_hidden_states=True)
            pooled.append(out[0])  # the projected pooled output (text_embeds)
            hidden.append(out.hidden_states[-2])  # the penultimate layer, as the pipeline
        t5 = t5_hidden(model, model.text_encoder_3, model.tokenizer_3, captions)
        clip = torch.cat(hidden, dim=-1)
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return TextConditioning(torch.cat([clip, t5.to(clip.dtype)], dim=-2),
                                torch.cat(pooled, dim=-1))

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any,
                denoiser: Any = None) -> torch.Tensor:
        transformer = denoiser if denoiser is not None else model.unet
        timestep = (t * SD3_TIMESTEPS).to(noisy.dtype)  # sigma x 1000, as the pipeline passes
        return transformer(hidden_states=noisy, timestep=timestep,
                           encoder_hidden_states=text.hidden, pooled_projections=text.pooled,
                           return_dict=False)[0]

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import StableDiffusion3Pipeline

        return StableDiffusion3Pipeline(
            scheduler=scheduler, vae=model.vae, text_encoder=model.text_encoder,
            tokenizer=model.tokenizer, text_encoder_2=model.text_encoder_2,
            tokenizer_2=model.tokenizer_2, text_encoder_3=model.text_encoder_3,
            tokenizer_3=model.tokenizer_3, transformer=denoiser)
