"""Chroma's conditioning (lodestones 2025; diffusers' ``ChromaPipeline``): T5-XXL alone.

- **Text** (``ChromaPipeline._get_t5_prompt_embeds``): T5's tokens padded to
  ``model.t5_max_length`` (512), T5 run **with** the tokenizer's attention mask; the
  transformer attends to every real token and the first padding token (``index <= length``:
  Chroma was trained so). :meth:`ChromaFamily.encode` returns the hidden states with that mask
  (``TextConditioning.mask``), so the text cache keeps each caption's real tokens and its one
  padding token.
- **Denoiser**: the latents packed into 2x2 patches (``img_ids`` their rows and columns,
  ``txt_ids`` zeros) and the sigma as the timestep (the pipeline passes ``t / 1000``); the
  modulations come from the timestep alone through the approximator (no guidance input, no
  pooled text). The text reaches it as sd-scripts' Chroma gives it: each caption trimmed to its
  real tokens and its one padding token, attended with no mask at all. A batch of one length
  runs as one call; a batch of several lengths runs a caption at a time (sd-scripts' Chroma
  attends a sample at a time too), since a boolean mask leaves the padding rows with nothing to
  attend to (NaN where a kernel does not guard them), and diffusers' gradient checkpointing
  drops the mask in the single blocks anyway.
- **The pipeline**: diffusers 0.42.1's ``ChromaPipeline`` builds the mask of those positions
  but hands it to the transformer as a float 0/1 tensor, which ``scaled_dot_product_attention``
  adds to the scores instead of masking (diffusers issue #12116). The samples use it with each
  prompt trimmed to its real tokens and one padding token (:func:`pipeline_class`), where the
  mask is all ones and adds the same to every score: what Chroma reads, with diffusers' own
  denoising loop, CFG and scheduler.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import torch

from trainer.models.text_conditioning import TextConditioning


class ChromaFamily:
    """Chroma1-HD / Base: T5-XXL with its padding masked, packed latents, no guidance input."""

    name = "chroma"
    objective = "flow"
    takes_guidance = False  # the approximator reads the timestep only (guidance 0 inside)
    # the parts of a whole checkpoint (trainer/families/chroma/checkpoint.py), and those of the
    # file as it is released (the transformer alone)
    checkpoint_parts = ("transformer", "vae", "t5xxl")
    shipped_parts = ("transformer",)

    def __init__(self, guidance: Optional[float] = None) -> None:
        self.guidance = None  # Chroma has no distilled guidance

    def checkpoint_name(self, variant: str) -> str:
        """The name of a loaded model's layout (``chroma1-hd``): its shipped configs'."""
        from trainer.families.chroma import CHROMA

        return CHROMA.variant(variant or CHROMA.variants[0].name).asset

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer)]

    def t5_slot(self) -> str:
        return "text_encoder"

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        """T5's last hidden states of the padded captions, run with the tokenizer's mask, and
        the transformer's mask (the real tokens and the first padding token), as
        ``ChromaPipeline.encode_prompt`` gives them."""
        encoder = model.text_encoder
        tokens = model.tokenizer(captions, padding="max_length", max_length=model.t5_max_length,
                                 truncation=True, return_tensors="pt")
        ids = tokens.input_ids.to(encoder.device)
        attention = tokens.attention_mask.to(encoder.device)
        hidden = encoder(ids, output_hidden_states=False, attention_mask=attention)[0]
        positions = torch.arange(attention.shape[1], device=attention.device)
        mask = (positions[None, :] <= attention.sum(dim=1)[:, None]).to(torch.int64)
        return TextConditioning(hidden, None, mask)

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None) -> torch.Tensor:
        """The transformer's output for ``noisy`` [B, C, h, w] at sigmas ``t`` [B], unpacked
        back to the latents' shape (see the module's notes on the text's lengths)."""
        from diffusers import ChromaPipeline

        transformer = denoiser if denoiser is not None else model.denoiser
        b, c, h, w = noisy.shape
        packed = ChromaPipeline._pack_latents(noisy, b, c, h, w)
        img_ids = ChromaPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device,
                                                           noisy.dtype)
        t = t.to(noisy.dtype)
        lengths = text.lengths()
        if len(set(lengths)) > 1:  # a caption at a time, each its own length (see above)
            out = torch.cat([_call(transformer, packed[i:i + 1], t[i:i + 1],
                                   text.hidden[i:i + 1, :n], img_ids)
                             for i, n in enumerate(lengths)])
        else:
            out = _call(transformer, packed, t, text.hidden[:, :lengths[0]], img_ids)
        return ChromaPipeline._unpack_latents(out, h, w, 1)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        return pipeline_class()(scheduler=scheduler, vae=model.vae,
                                text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                                transformer=denoiser)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def _call(transformer: Any, packed: torch.Tensor, t: torch.Tensor, hidden: torch.Tensor,
          img_ids: torch.Tensor) -> torch.Tensor:
    """One transformer call as ChromaPipeline makes it (the timestep is the sigma), on text
    without padding to mask."""
    txt_ids = torch.zeros(hidden.shape[1], 3, device=packed.device, dtype=packed.dtype)
    return transformer(hidden_states=packed, timestep=t, encoder_hidden_states=hidden,
                       txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]


@lru_cache(maxsize=1)
def pipeline_class() -> Any:
    """diffusers' ChromaPipeline whose prompts (and negative prompts) reach the transformer
    trimmed to the longest of them: a prompt's real tokens and its one padding token (see the
    module's notes). Named as diffusers' class, so the folders it saves name diffusers'."""
    from diffusers import ChromaPipeline as DiffusersChromaPipeline

    class ChromaPipeline(DiffusersChromaPipeline):
        def _get_t5_prompt_embeds(self, *args: Any, **kwargs: Any):
            embeds, mask = super()._get_t5_prompt_embeds(*args, **kwargs)
            longest = int(mask.sum(dim=1).max())
            return embeds[:, :longest], mask[:, :longest]

    return ChromaPipeline


def family(name: str = "chroma", guidance: Optional[float] = None) -> ChromaFamily:
    return ChromaFamily(guidance)
