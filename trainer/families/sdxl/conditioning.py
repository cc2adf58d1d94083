"""SDXL's conditioning: two text encoders (CLIP ViT-L and OpenCLIP ViT-bigG with a projection)
read side by side from their penultimate hidden states, plus "added conditioning": the second
encoder's pooled, projected output and six size numbers per image (original height and width,
crop top and left, target height and width; Podell et al. 2023, "SDXL", section 2.2), which
diffusers' SDXL pipeline passes as ``added_cond_kwargs``. ``clip_skip`` counts from that
penultimate layer, as diffusers' ``clip_skip`` does for SDXL. Extends SD 1.x's family object.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.families.sd.conditioning import SD1Family, TextConditioning, _ids, _plain


class SDXLFamily(SD1Family):
    """SDXL: two text encoders, pooled text embeddings and size conditioning."""

    name = "sdxl"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer),
                ("text_encoder_2", model.text_encoder_2, model.tokenizer_2)]

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        import diffusers

        return diffusers.StableDiffusionXLPipeline(
            vae=model.vae, text_encoder=model.text_encoder, tokenizer=model.tokenizer,
            unet=denoiser, scheduler=scheduler, text_encoder_2=model.text_encoder_2,
            tokenizer_2=model.tokenizer_2)

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        from trainer.families.sd.long_prompts import encode_long

        hidden, pooled = [], None
        for _, encoder, tokenizer in self.text_encoders(model):
            def run(ids: torch.Tensor, encoder: Any = encoder) -> tuple[Any, Any]:
                out = encoder(ids.to(encoder.device), output_hidden_states=True)
                # the projected pooled output (text_embeds): the last encoder's is used
                return out.hidden_states[-(clip_skip + 1)], out[0]

            if _plain(model):
                states, pooled = run(_ids(tokenizer, captions, encoder.device))
            else:  # 150 / 225 tokens, weighted or unpadded captions (long_prompts.py)
                states, pooled = encode_long(tokenizer, captions, model.prompt_options, run)
            hidden.append(states)
        return TextConditioning(torch.cat(hidden, dim=-1), pooled)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]
                           ) -> Optional[dict[str, torch.Tensor]]:
        if size_ids is None or text.pooled is None:
            raise ValueError("SDXL needs the pooled text embedding and the size ids")
        return {"text_embeds": text.pooled,
                "time_ids": size_ids.to(text.pooled.device, text.pooled.dtype)}


def family(name: str = "sdxl", guidance: Optional[float] = None) -> SDXLFamily:
    return SDXLFamily()


def size_ids(original: tuple[int, int], crop_left_top: tuple[int, int],
             target: tuple[int, int]) -> list[int]:
    """SDXL's six size numbers from (width, height) pairs, in the order the UNet reads them:
    original height, width, crop top, left, target height, width (diffusers'
    ``_get_add_time_ids``: ``original_size + crops_coords_top_left + target_size``)."""
    (ow, oh), (left, top), (tw, th) = original, crop_left_top, target
    return [oh, ow, top, left, th, tw]
