"""Qwen-Image's conditioning (diffusers' ``QwenImagePipeline``): the prompt inside Qwen's chat
template with the pipeline's system turn, through Qwen2.5-VL-7B, its last hidden states, each
caption's real tokens without the template's first 34 (``prompt_template_encode_start_idx``),
at most 512 of them (the pipeline's ``max_sequence_length``), right-padded with their mask, which
the transformer reads (``encoder_hidden_states_mask``). The transformer reads the latents packed
into 2x2 patches with their grid as ``img_shapes`` and the sigma as its timestep (the pipeline
passes ``t / 1000``). The VAE's latents are 5-D (a frame axis) and normalized per channel,
``(z - latents_mean) / latents_std`` (:meth:`QwenImageFamily.encode_latents`; the pipeline's
decode inverts it): the step, the caches and the validation loss hold them 4-D, the frame axis
dropped. The edit variants (Edit, 2509, 2511) read control images too
(:mod:`trainer.families.qwen_image.edit`): in the text encoder and beside the target's tokens.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.models.text_conditioning import TextConditioning

# QwenImagePipeline's template, its dropped prefix and lengths (pipeline_qwenimage.py)
TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, "
            "texture, quantity, text, spatial relationships of the objects and background:"
            "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
DROP = 34  # prompt_template_encode_start_idx
TOKENIZER_MAX = 1024  # tokenizer_max_length (+ DROP)
MAX_SEQUENCE_LENGTH = 512  # __call__'s max_sequence_length


def latent_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE config's per-channel (mean, std) as [1, C, 1, 1] tensors like ``like``."""
    c = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, c, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, c, 1, 1)
    return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)


class QwenImageFamily:
    """Qwen-Image: Qwen2.5-VL hidden states with their mask, packed latents, sigma timesteps."""

    name = "qwen_image"
    objective = "flow"
    takes_guidance = False
    guidance = None
    # the parts of a whole checkpoint (checkpoint.py's names) and of the file as Comfy-Org
    # ships it (qwen_image_bf16.safetensors: the transformer alone)
    checkpoint_parts = ("transformer", "vae", "qwen25_7b")
    shipped_parts = ("transformer",)

    def checkpoint_name(self, variant: str) -> str:
        return "qwen-image"

    def text_encoders(self, model: Any) -> list[tuple[str, Any, Any]]:
        return [("text_encoder", model.text_encoder, model.tokenizer)]

    def t5_slot(self) -> Optional[str]:
        return None

    def encode(self, model: Any, captions: list[str], clip_skip: int,
               controls: Optional[list[torch.Tensor]] = None) -> TextConditioning:
        """``QwenImagePipeline.encode_prompt`` (``clip_skip`` does not apply); with
        ``controls`` (an edit model's pixels, one [B, 3, H, W] per reference index), the edit
        pipelines' (:func:`~trainer.families.qwen_image.edit.encode_edit`)."""
        from trainer.families.qwen_image import edit

        if controls or edit.is_edit(getattr(model, "variant", "base")):
            edit.check_controls(model.variant, model.description or model.variant,
                                len(controls or ()))
            return edit.encode_edit(model, captions, controls)
        encoder, tokenizer = model.text_encoder, model.tokenizer
        ids = tokenizer([TEMPLATE.format(c) for c in captions], max_length=TOKENIZER_MAX + DROP,
                        padding=True, truncation=True, return_tensors="pt").to(encoder.device)
        out = encoder(input_ids=ids.input_ids, attention_mask=ids.attention_mask,
                      output_hidden_states=True)
        hidden = out.hidden_states[-1]
        rows = [h[m.bool()][DROP:][:MAX_SEQUENCE_LENGTH]
                for h, m in zip(hidden, ids.attention_mask)]
        return TextConditioning.padded(rows)

    def control_problems(self, model: Any, counts: list[int]) -> list[str]:
        """What the loaded variant cannot train of the training images' control counts
        (Edit: one; 2509, 2511: one to three; the others none), checked when the run starts."""
        from trainer.families.qwen_image.edit import control_problem

        label = model.description or model.variant
        return list(dict.fromkeys(p for c in counts
                                  if (p := control_problem(model.variant, label, c))))

    def encode_latents(self, vae: Any, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] -> normalized latents [B, 16, H/8, W/8] (the mode)."""
        z = vae.encode(pixels.to(vae.device, vae.dtype).unsqueeze(2)).latent_dist.mode()[:, :, 0]
        mean, std = latent_stats(vae, z)
        return (z - mean) / std

    def predict(self, model: Any, noisy: torch.Tensor, t: torch.Tensor,
                text: TextConditioning, size_ids: Optional[torch.Tensor], cfg: Any = None,
                denoiser: Any = None, controls: Optional[list[torch.Tensor]] = None
                ) -> torch.Tensor:
        """The transformer's output for ``noisy`` [B, C, h, w] at sigmas ``t`` [B], as the
        pipeline calls it, unpacked back to the latents' shape. ``controls``: an edit model's
        reference latents (one [B, C, h', w'] per index), packed after the target's tokens
        with their own ``img_shapes``; the output keeps the target's tokens."""
        from diffusers import QwenImagePipeline

        from trainer.families.qwen_image.edit import pack_with_controls

        transformer = denoiser if denoiser is not None else model.denoiser
        b, c, h, w = noisy.shape
        packed, shapes, tokens = pack_with_controls(noisy, controls or [])
        mask = text.mask
        if mask is not None and bool(mask.all()):
            mask = None  # as encode_prompt gives it when no caption is padded
        out = transformer(hidden_states=packed, timestep=t.to(noisy.dtype),
                          encoder_hidden_states=text.hidden, encoder_hidden_states_mask=mask,
                          img_shapes=shapes, return_dict=False)[0]
        return QwenImagePipeline._unpack_latents(out[:, :tokens], h, w, 1)[:, :, 0]

    def pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        """The model's ``QwenImagePipeline`` (its folder's, and the samples' of a prompt alone;
        an edit variant's prompt with control images draws through :meth:`sample_pipeline`)."""
        from diffusers import QwenImagePipeline

        return QwenImagePipeline(scheduler=scheduler, vae=model.vae,
                                 text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                                 transformer=denoiser)

    def folder_pipeline(self, model: Any, denoiser: Any, scheduler: Any) -> Any:
        """The pipeline a trained model's diffusers folder names (DreamBooth): an edit
        variant's own (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``) with the
        model's image processor, so that the folder loads as that edit model again; the base
        model's ``QwenImagePipeline`` otherwise."""
        from trainer.families.qwen_image.edit import PIPELINES

        pipe = self.pipeline(model, denoiser, scheduler)
        if getattr(model, "variant", "base") not in PIPELINES:
            return pipe
        return _edit_pipeline(model, pipe)

    def sample_pipeline(self, model: Any, pipe: Any, args: dict[str, Any]
                        ) -> tuple[Any, dict[str, Any]]:
        """The pipeline and arguments that draw one sample. An edit variant's prompt with
        control images (``--ci``) goes to the variant's diffusers pipeline over ``pipe``'s
        modules and the model's processor, as diffusers draws it: ``QwenImageEditPipeline``
        with one image (Edit takes one), ``QwenImageEditPlusPipeline`` with up to three (2509,
        2511). A prompt without one (both edit pipelines need an image) and a model that takes
        none draw from the prompt alone through ``pipe`` (a control it cannot read is ignored,
        as the sample prompts ignore an option a family does not read)."""
        from trainer.families.qwen_image.edit import MAX_CONTROLS

        args = dict(args)
        images = args.pop("image", None)
        most = MAX_CONTROLS.get(getattr(model, "variant", "base"), 0)
        if not images or most == 0:
            return pipe, args
        images = images if isinstance(images, list) else [images]
        edit = _edit_pipeline(model, pipe)
        edit.set_progress_bar_config(disable=True)
        return edit, {**args, "image": images[0] if most == 1 else images[:most]}

    def sample_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """The samples' guidance is the pipeline's true CFG (``true_cfg_scale``, with a
        negative prompt; its ``guidance_scale`` is for a guidance-distilled model)."""
        out = dict(args)
        out["true_cfg_scale"] = out.pop("guidance_scale")
        return out

    def added_conditioning(self, text: TextConditioning, size_ids: Optional[torch.Tensor]):
        return None


def _edit_pipeline(model: Any, pipe: Any) -> Any:
    """The edit variant's own diffusers pipeline over ``pipe``'s modules and the model's image
    processor (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``)."""
    import diffusers

    from trainer.families.qwen_image.edit import PIPELINES

    return getattr(diffusers, PIPELINES[model.variant])(processor=model.processor,
                                                        **pipe.components)


def family(name: str = "qwen_image", guidance: Optional[float] = None) -> QwenImageFamily:
    return QwenImageFamily()
