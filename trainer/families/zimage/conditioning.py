"""Z-Image's conditioning (Tongyi-MAI 2025; diffusers' ``ZImagePipeline``).

The prompt goes through Qwen3's chat template (one user turn, the generation prompt,
``enable_thinking=True``: no empty think block), is padded / cut to
``max_sequence_length`` (512) tokens and run with its attention mask; the hidden states of the
second-to-last layer (``hidden_states[-2]``) of the real tokens are the caption's features, one
row per token, of each caption's own length. ``encode`` returns them padded into one batch with
the mask (:meth:`TextConditioning.padded`); ``predict`` hands the transformer each caption's
rows (``text.rows()``), as the pipeline hands it its list.

The transformer reads a list of latents of shape [C, 1, H, W] (one frame), the timestep
``(1000 - t) / 1000`` with ``t`` the scheduler's timestep: 1 for clean latents, 0 for noise, so
``1 - sigma`` for our sigma ``t`` in [0, 1]; its output is the negated velocity, which the
pipeline and diffusers' ``train_dreambooth_lora_z_image.py`` negate. ``predict`` returns
``noise - latents`` as the flow objective (trainer/objectives/flow_matching.py) expects.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.models.text_conditioning import TextConditioning

MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline.encode_prompt's max_sequence_length


def chat_prompts(tokenizer: Any, captions: list[str]) -> list[str]:
    """The captions in the chat template, as ``ZImagePipeline._encode_prompt`` builds them."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                          add_generation_prompt=True, enable_thinking=True)
            for c in captions]


def qwen3_rows(encoder: Any, tokenizer: Any, captions: list[str],
               max_length: int = MAX_SEQUENCE_LENGTH) -> list[torch.Tensor]:
    """Each caption's real tokens' features from the second-to-last layer of Qwen3."""
    inputs = tokenizer(chat_prompts(tokenizer, captions), padding="max_length",
                       max_length=max_length, truncation=True, return_tensors="pt")
    ids = inputs.input_ids.to(encoder.device)
    mask = inputs.attention_mask.to(encoder.device).bool()
    hidden = encoder(input_ids=ids, attention_mask=mask,
                     output_hidden_states=True).hidden_states[-2]
    return [hidden[i][mask[i]] for i in range(hidden.shape[0])]


def transformer_call(transformer: Any, noisy: torch.Tensor, timestep: torch.Tensor,
                     features: list[torch.Tensor]) -> torch.Tensor:
    """The transformer's raw output for latents [B, C, H, W] at the DiT's own timestep
    (``(1000 - t) / 1000``), as the pipeline calls it; [B, C, H, W]."""
    frames = list(noisy.unsqueeze(2).unbind(dim=0))
    out = transformer(frames, timestep, features, return_dict=False)[0]
    return torch.stack(list(out), dim=0).squeeze(2)


class ZImageFamily:
    """Z-Image Turbo and Base: Qwen3 features of each caption's length, one stream."""

    name = "zimage"
    objective = "flow"
    takes_guidance = False  # no distilled guidance input
    guidance = None
    # a whole checkpoint's parts (trainer/families/zimage/checkpoint.py), and those of the file
    # as Comfy-Org ships it (z_image_turbo_bf16.safetensors: the transformer alone)
    checkpoint_parts = ("transformer", "vae", "qwen3")
    shipped_parts = ("transformer",)

    def __init__(self, guidance: Optional[float] = None) -> None:
        pass

    def checkpoint_name(self, variant: str) -> str:
        return f"z-image-{variant or 'turbo'}"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer)]

    def t5_slot(self) -> None:
        return None

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        length = getattr(model, "t5_max_length", 0) or MAX_SEQUENCE_LENGTH
        return TextConditioning.padded(qwen3_rows(model.text_encoder, model.tokenizer,
                                                  captions, length))

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None) -> torch.Tensor:
        """``noise - latents`` predicted for ``noisy`` [B, C, H, W] at sigmas ``t`` [B]."""
        transformer = denoiser if denoiser is not None else model.denoiser
        timestep = (1.0 - t).to(noisy.dtype)  # = (1000 - 1000 t) / 1000
        features = [row.to(noisy.dtype) for row in text.rows()]
        return -transformer_call(transformer, noisy, timestep, features)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import ZImagePipeline

        return ZImagePipeline(scheduler=scheduler, vae=model.vae,
                              text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                              transformer=denoiser)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def family(name: str = "zimage", guidance: Optional[float] = None) -> ZImageFamily:
    return ZImageFamily(guidance)
