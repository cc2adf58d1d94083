"""FLUX.1's conditioning (Black Forest Labs 2024; diffusers' ``FluxPipeline``): CLIP-L's pooled
output and T5-XXL's last hidden states (``model.t5_max_length`` tokens: 512 for dev, 256 for
schnell). The transformer reads the latents packed into 2x2 patches (one token of 4 x 16
channels each) with their row and column as ``img_ids``, zeros as ``txt_ids``, the sigma itself
as its timestep, and, for the guidance-distilled dev, the guidance value
(``flow.guidance_scale``, given to the family object when it is built). It reads
``(latents - shift_factor) * scaling_factor`` from its 16-channel VAE
(:func:`trainer.run.step.encode_images` applies the VAE config's shift).

FLUX.1 Kontext (:class:`KontextFamily`) reads the latents of a reference image after the
target's, packed alike, with position ids whose first coordinate is 1, and its output is cut back
to the target's tokens (diffusers' ``FluxKontextPipeline``): the loss sees the target alone.

The family object has the methods of :class:`trainer.families.sd.conditioning.SD1Family`, so
the step, the text cache, the validation loss and the samples ask it instead of branching.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.families.common.t5 import CLIP_LENGTH, t5_hidden, tokens
from trainer.families.flux import KONTEXT
from trainer.models.text_conditioning import TextConditioning


class FluxFamily:
    """FLUX.1 dev and schnell: CLIP-L pooled + T5-XXL, packed latents, guidance for dev."""

    name = "flux1"
    objective = "flow"
    takes_guidance = True  # reads a distilled guidance value (its LoRA files record it)
    # the parts of a whole checkpoint (trainer/families/common/mmdit_checkpoint.py's names), and
    # those of the file as BFL ships it (the transformer alone)
    checkpoint_parts = ("transformer", "vae", "clip_l", "t5xxl")
    shipped_parts = ("transformer",)

    def __init__(self, guidance: Optional[float] = None) -> None:
        # the distilled guidance the dev transformer reads (flow.guidance_scale)
        self.guidance = guidance

    def checkpoint_name(self, variant: str) -> str:
        """mmdit_checkpoint.py's name of a loaded model's layout (``flux1-dev``)."""
        return f"flux1-{variant}"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer),
                ("text_encoder_2", model.text_encoder_2, model.tokenizer_2)]

    def t5_slot(self) -> str:
        return "text_encoder_2"

    def encode(self, model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
        clip = model.text_encoder
        ids = tokens(model.tokenizer, captions, CLIP_LENGTH, clip.device)
        pooled = clip(ids, output_hidden_states=False).pooler_output
        hidden = t5_hidden(model, model.text_encoder_2, model.tokenizer_2, captions)
        return TextConditioning(hidden, pooled)

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None) -> torch.Tensor:
        """The transformer's output for ``noisy`` [B, C, h, w] at sigmas ``t`` [B], unpacked
        back to the latents' shape. The guidance is the family's own (given when it was
        built); ``cfg``'s ``flow.guidance_scale`` only for a family built without one."""
        return self._call(model, noisy, t, text, cfg, denoiser, [])

    def _call(self, model: Any, noisy: torch.Tensor, t: torch.Tensor, text: TextConditioning,
              cfg: Any, denoiser: Any, references: list[torch.Tensor]) -> torch.Tensor:
        """The transformer on the packed target followed by the packed ``references`` (their
        position ids' first coordinate 1, diffusers' ``FluxKontextPipeline.prepare_latents``);
        the output cut back to the target's tokens and unpacked."""
        from diffusers import FluxPipeline

        transformer = denoiser if denoiser is not None else model.denoiser
        b, c, h, w = noisy.shape
        packed = [FluxPipeline._pack_latents(noisy, b, c, h, w)]
        ids = [FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device,
                                                      noisy.dtype)]
        for ref in references:
            rh, rw = ref.shape[-2:]
            packed.append(FluxPipeline._pack_latents(ref.to(noisy.dtype), b, c, rh, rw))
            ref_ids = FluxPipeline._prepare_latent_image_ids(b, rh // 2, rw // 2, noisy.device,
                                                             noisy.dtype)
            ref_ids[..., 0] = 1
            ids.append(ref_ids)
        txt_ids = torch.zeros(text.hidden.shape[1], 3, device=noisy.device, dtype=noisy.dtype)
        guidance = None
        if transformer.config.guidance_embeds:
            value = self.guidance if self.guidance is not None else cfg.flow.guidance_scale
            guidance = torch.full((b,), float(value), device=noisy.device, dtype=noisy.dtype)
        out = transformer(hidden_states=torch.cat(packed, dim=1), timestep=t.to(noisy.dtype),
                          guidance=guidance, pooled_projections=text.pooled,
                          encoder_hidden_states=text.hidden, txt_ids=txt_ids,
                          img_ids=torch.cat(ids, dim=0), return_dict=False)[0]
        return FluxPipeline._unpack_latents(out[:, :packed[0].shape[1]], h, w, 1)

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import FluxPipeline

        return FluxPipeline(scheduler=scheduler, vae=model.vae, text_encoder=model.text_encoder,
                            tokenizer=model.tokenizer, text_encoder_2=model.text_encoder_2,
                            tokenizer_2=model.tokenizer_2, transformer=denoiser)

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


class KontextFamily(FluxFamily):
    """FLUX.1 Kontext [dev]: FLUX.1-dev's call with the reference image's latents after the
    target's (edit training's controls, trainer/run/step.py); without one, FLUX.1-dev's."""

    name = KONTEXT

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None, controls: Optional[list[torch.Tensor]] = None
                ) -> torch.Tensor:
        """FLUX.1's output for the target ``noisy`` with the latents of its reference
        (``controls``: one [B, C, h', w'] tensor, its own size) read beside it; the loss then
        sees the target's tokens only."""
        return self._call(model, noisy, t, text, cfg, denoiser, list(controls or []))

    def sample_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """A sample at the size asked (--w / --h, else the dataset's): FluxKontextPipeline
        scales its output to ``max_area`` (1024 x 1024 unless told) at the asked aspect."""
        return {**args, "max_area": args["width"] * args["height"]}

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        from diffusers import FluxKontextPipeline

        return FluxKontextPipeline(scheduler=scheduler, vae=model.vae,
                                   text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                                   text_encoder_2=model.text_encoder_2,
                                   tokenizer_2=model.tokenizer_2, transformer=denoiser)


def family(name: str = "flux1", guidance: Optional[float] = None) -> FluxFamily:
    return (KontextFamily if name == KONTEXT else FluxFamily)(guidance)
