"""SD 3 and 3.5's conditioning (Esser et al. 2024; diffusers' ``StableDiffusion3Pipeline``):
the penultimate hidden states of CLIP-L and CLIP-G side by side, padded to T5's width and
followed by T5's tokens along the sequence; the two pooled, projected outputs joined as
``pooled_projections``; the timestep is sigma x 1000; the latents go in unpacked, as
``(latents - shift_factor) * scaling_factor`` of the 16-channel VAE.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from trainer.families.common.t5 import CLIP_LENGTH, t5_hidden, tokens
from trainer.models.text_conditioning import TextConditioning

SD3_TIMESTEPS = 1000


class SD3Family:
    """SD 3 and 3.5: CLIP-L + CLIP-G + T5-XXL joined, unpacked latents, timestep sigma x 1000."""

    name = "sd3"
    objective = "flow"
    takes_guidance = False  # reads a distilled guidance value (its LoRA files record it)
    guidance = None  # no distilled guidance
    # the parts of a whole checkpoint (trainer/families/common/mmdit_checkpoint.py's names), and
    # those of the file as Stability ships it (the transformer and the VAE)
    checkpoint_parts = ("transformer", "vae", "clip_l", "clip_g", "t5xxl")
    shipped_parts = ("transformer", "vae")

    def checkpoint_name(self, variant: str) -> str:
        """mmdit_checkpoint.py's name of a loaded model's layout (``sd35-large``)."""
        return {"5-large": "sd35-large", "5-medium": "sd35-medium"}.get(variant, "sd3-medium")

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer),
                ("text_encoder_2", model.text_encoder_2, model.tokenizer_2),
                ("text_encoder_3", model.text_encoder_3, model.tokenizer_3)]

    def t5_slot(self) -> str:
        return "text_encoder_3"

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        hidden, pooled = [], []
        for _, encoder, tokenizer in self.text_encoders(model)[:2]:
            out = encoder(tokens(tokenizer, captions, CLIP_LENGTH, encoder.device),
                          output_hidden_states=True)
            pooled.append(out[0])  # the projected pooled output (text_embeds)
            hidden.append(out.hidden_states[-2])  # the penultimate layer, as the pipeline
        t5 = t5_hidden(model, model.text_encoder_3, model.tokenizer_3, captions)
        clip = torch.cat(hidden, dim=-1)
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return TextConditioning(torch.cat([clip, t5.to(clip.dtype)], dim=-2),
                                torch.cat(pooled, dim=-1))

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None) -> torch.Tensor:
        transformer = denoiser if denoiser is not None else model.denoiser
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

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def family(name: str = "sd3", guidance: Optional[float] = None) -> SD3Family:
    return SD3Family()
