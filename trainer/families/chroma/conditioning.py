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
  pooled text). The mask reaches the transformer as a **boolean** mask over the text tokens and
  ones over the image tokens. diffusers 0.42.1's pipeline passes the same positions as a float
  0/1 tensor, which ``scaled_dot_product_attention`` adds to the scores instead of masking
  (diffusers issue #12116); sd-scripts' Chroma trims each caption to its length + 1 and attends
  with no mask at all, which is what a boolean mask computes. A batch whose captions have one
  length is trimmed to it and runs with no mask; a batch of several lengths runs with the mask,
  and, where diffusers' gradient checkpointing would drop the mask in the single blocks
  (``ChromaTransformer2DModel.forward`` does not pass it there), one caption at a time.
"""

from __future__ import annotations

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
        back to the latents' shape (see the module's notes on the mask)."""
        from diffusers import ChromaPipeline

        transformer = denoiser if denoiser is not None else model.denoiser
        b, c, h, w = noisy.shape
        packed = ChromaPipeline._pack_latents(noisy, b, c, h, w)
        img_ids = ChromaPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device,
                                                           noisy.dtype)
        t = t.to(noisy.dtype)
        lengths = text.lengths()
        if len(set(lengths)) > 1 and _drops_mask(transformer):
            out = torch.cat([_call(transformer, packed[i:i + 1], t[i:i + 1],
                                   text.hidden[i:i + 1, :n], img_ids, None)
                             for i, n in enumerate(lengths)])
        else:
            longest = max(lengths)
            mask = None
            if len(set(lengths)) > 1:
                ones = torch.ones(b, packed.shape[1], dtype=torch.bool, device=noisy.device)
                mask = torch.cat([text.mask[:, :longest].bool(), ones], dim=1)
            out = _call(transformer, packed, t, text.hidden[:, :longest], img_ids, mask)
        return ChromaPipeline._unpack_latents(out, h, w, 1)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import ChromaPipeline

        return ChromaPipeline(scheduler=scheduler, vae=model.vae, text_encoder=model.text_encoder,
                              tokenizer=model.tokenizer, transformer=denoiser)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def _call(transformer: Any, packed: torch.Tensor, t: torch.Tensor, hidden: torch.Tensor,
          img_ids: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """One transformer call as ChromaPipeline makes it (the timestep is the sigma)."""
    txt_ids = torch.zeros(hidden.shape[1], 3, device=packed.device, dtype=packed.dtype)
    return transformer(hidden_states=packed, timestep=t, encoder_hidden_states=hidden,
                       txt_ids=txt_ids, img_ids=img_ids, attention_mask=mask,
                       return_dict=False)[0]


def _drops_mask(transformer: Any) -> bool:
    """Whether this call runs diffusers' gradient checkpointing, whose single blocks are
    called without the attention mask."""
    inner = transformer
    while hasattr(inner, "module") and isinstance(inner.module, torch.nn.Module):
        inner = inner.module  # DDP / accelerate wrappers
    base = getattr(inner, "base_model", None)  # a peft model
    inner = getattr(base, "model", inner) if base is not None else inner
    return torch.is_grad_enabled() and bool(getattr(inner, "gradient_checkpointing", False))


def family(name: str = "chroma", guidance: Optional[float] = None) -> ChromaFamily:
    return ChromaFamily(guidance)
