"""DreamBooth: the UNet's own weights train (and the text encoder's, when asked).

Prior preservation is the data pipeline's: regularization images interleave with the training
images and their loss is weighted by ``training.prior_loss_weight``; missing class images are
generated before training (trainer/run/class_images.py). The result is saved as a single-file
checkpoint in the original layout (``<name>.safetensors``, what AUTOMATIC1111 and ComfyUI load)
and, for the final save (or every save with ``saving.intermediate_diffusers``), as a diffusers
folder ``<name>/`` beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.methods.base import MethodBase


class DreamBoothMethod(MethodBase):
    def prepare(self, model: Any) -> list[dict[str, Any]]:
        from trainer.methods.lora import family_text_encoders

        net, opt = self.cfg.network, self.cfg.optimizer
        encoders = self.trained_text_encoders(model)
        model.vae.requires_grad_(False)
        model.unet.requires_grad_(net.train_unet)
        for _, encoder, _ in family_text_encoders(model):
            encoder.requires_grad_(False)
        groups: list[dict[str, Any]] = []
        if net.train_unet:
            groups.append({"params": list(model.unet.parameters()),
                           "lr": opt.unet_lr or opt.learning_rate, "name": "unet"})
        for name, encoder, lr in encoders:
            encoder.requires_grad_(True)
            groups.append({"params": list(encoder.parameters()), "lr": lr, "name": name})
        self.trains_text_encoder = bool(encoders)
        if not groups:
            raise ValueError("nothing would train: network.train_unet is off and this model "
                             "has no text encoder that the settings train")
        return groups

    def save(self, path: Path, model: Any, facts: Any, final: bool = True) -> Path:
        from trainer.export.checkpoint import save_checkpoint
        from trainer.export.lora import unwrap
        from trainer.export.metadata import modelspec_metadata
        from trainer.export.pipeline_folder import save_pipeline_folder

        unet, text_encoder = unwrap(model.unet), unwrap(model.text_encoder)
        te2 = getattr(model, "text_encoder_2", None)
        te2 = unwrap(te2) if te2 is not None else None
        metadata = modelspec_metadata(self.cfg, facts, adapter=None)
        save_checkpoint(path, unet, model.vae, text_encoder, text_encoder_2=te2,
                        family=model.version, dtype=self.save_dtype, metadata=metadata)
        if final or self.cfg.saving.intermediate_diffusers:
            save_pipeline_folder(path.with_suffix(""), model, unet, text_encoder,
                                 self.save_dtype, text_encoder_2=te2)
        return path
