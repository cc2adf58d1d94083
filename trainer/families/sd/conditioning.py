"""What differs per model family when a prompt becomes the UNet's conditioning.

SD 1.x and 2.x have one CLIP text encoder: the UNet reads its last hidden states (or, with
``clip_skip = n``, the n-th last, through the final layer norm, as sd-scripts and AUTOMATIC1111
do). SDXL has two (CLIP ViT-L and OpenCLIP ViT-bigG with a projection): the UNet reads both
encoders' penultimate hidden states side by side, plus "added conditioning": the second
encoder's pooled, projected output and six size numbers per image (original height and width,
crop top and left, target height and width; Podell et al. 2023, "SDXL", section 2.2), which
diffusers' SDXL pipeline passes as ``added_cond_kwargs``. ``clip_skip`` counts from that
penultimate layer, as diffusers' ``clip_skip`` does for SDXL.

:func:`trainer.families.family_of` gives the family object of a loaded model; the step, the
text cache, the samples and the methods ask it instead of branching on the version themselves.
SDXL's object (``trainer/families/sdxl/conditioning.py``) extends this one.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.models.text_conditioning import TextConditioning  # noqa: F401 - re-exported


def _ids(tokenizer: Any, captions: list[str], device: Any) -> torch.Tensor:
    return tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length,
                     truncation=True, return_tensors="pt").input_ids.to(device)


def _plain(model: Any) -> bool:
    """Captions as CLIP takes them: 75 tokens, unweighted, padded to 77."""
    opts = getattr(model, "prompt_options", None)
    return opts is None or opts.plain


class SD1Family:
    """SD 1.x and 2.x: one CLIP text encoder."""

    name = "sd1"
    objective = "ddpm"
    takes_guidance = False  # reads a distilled guidance value (its LoRA files record it)
    guidance = None  # no distilled guidance

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        """(attribute name, encoder, tokenizer) of each text encoder."""
        return [("text_encoder", model.text_encoder, model.tokenizer)]

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        from trainer.models.loader import text_embeddings

        encoder = model.text_encoder
        if not _plain(model):  # 150 / 225 tokens, weighted or unpadded captions
            from trainer.families.sd.long_prompts import encode_long

            hidden, _ = encode_long(model.tokenizer, captions, model.prompt_options, lambda ids: (
                text_embeddings(encoder, ids.to(encoder.device), clip_skip), None))
            return TextConditioning(hidden)
        ids = _ids(model.tokenizer, captions, encoder.device)
        return TextConditioning(text_embeddings(encoder, ids, clip_skip))

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]
                           ) -> Optional[dict[str, torch.Tensor]]:
        return None

    def t5_slot(self) -> Optional[str]:
        return None  # no T5 in the SD families

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None) -> torch.Tensor:
        """The UNet's prediction for ``noisy`` at integer timesteps ``t``."""
        unet = denoiser if denoiser is not None else model.denoiser
        added = self.added_conditioning(text, size_ids)
        return unet(noisy, t, text.hidden, added_cond_kwargs=added).sample

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        import diffusers

        return diffusers.StableDiffusionPipeline(
            vae=model.vae, text_encoder=model.text_encoder, tokenizer=model.tokenizer,
            unet=denoiser, scheduler=scheduler, safety_checker=None, feature_extractor=None,
            requires_safety_checker=False)


def family(name: str = "sd1", guidance: Optional[float] = None) -> SD1Family:
    """SD 1.x and 2.x share one family object (their differences are the loaded encoder's)."""
    return SD1Family()
