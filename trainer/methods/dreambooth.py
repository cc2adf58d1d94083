"""DreamBooth: the denoiser's own weights train (and the text encoders', when asked).

Prior preservation is the data pipeline's: regularization images interleave with the training
images and their loss is weighted by ``training.prior_loss_weight``; missing class images are
generated before training (trainer/run/class_images.py). The result is saved as a single-file
checkpoint in the original layout (``<name>.safetensors``, what AUTOMATIC1111 and ComfyUI load)
and, for the final save (or every save with ``saving.intermediate_diffusers``), as a diffusers
folder ``<name>/`` beside it. FLUX.1's file is in Black Forest Labs' layout, SD 3.5's in
Stability's (trainer/families/common/mmdit_checkpoint.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.families import family, family_of, names, spec
from trainer.methods.base import MethodBase

# a whole checkpoint's parts per transformer family (trainer/tools/merge.py reads them; the
# family objects hold them)
FLOW_PARTS = {name: family(name).checkpoint_parts for name in names(denoiser="transformer")}


class DreamBoothMethod(MethodBase):
    def whole_modules(self, model: Any) -> list[Any]:
        unet = [model.denoiser] if self.cfg.network.train_unet else []
        return unet + [encoder for _, encoder, _ in self.trained_text_encoders(model)]

    def prepare(self, model: Any) -> list[dict[str, Any]]:
        net, opt = self.cfg.network, self.cfg.optimizer
        encoders = self.trained_text_encoders(model)
        model.vae.requires_grad_(False)
        model.denoiser.requires_grad_(net.train_unet)
        for _, encoder, _ in family_of(model).text_encoders(model):
            encoder.requires_grad_(False)
        groups: list[dict[str, Any]] = []
        if net.train_unet and opt.block_lr is not None:  # SDXL: sd-scripts' --block_lr
            from trainer.methods.block_lr import block_groups

            groups += block_groups(model.denoiser, opt.block_lr)
        elif net.train_unet:
            groups.append({"params": list(model.denoiser.parameters()),
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
        if spec(model.version).denoiser == "transformer":  # the MMDiT single-file writer
            return self._save_flow(path, model, facts, final)
        from trainer.export.lora import unwrap
        from trainer.export.metadata import modelspec_metadata
        from trainer.families.sd.checkpoint import save_checkpoint
        from trainer.families.sd.pipeline_folder import save_pipeline_folder

        unet, text_encoder = unwrap(model.denoiser), unwrap(model.text_encoder)
        te2 = getattr(model, "text_encoder_2", None)
        te2 = unwrap(te2) if te2 is not None else None
        metadata = modelspec_metadata(self.cfg, facts, adapter=None)
        save_checkpoint(path, unet, model.vae, text_encoder, text_encoder_2=te2,
                        family=model.version, dtype=self.save_dtype, metadata=metadata)
        if final or self.cfg.saving.intermediate_diffusers:
            save_pipeline_folder(path.with_suffix(""), model, unet, text_encoder,
                                 self.save_dtype, text_encoder_2=te2)
        return path

    def _save_flow(self, path: Path, model: Any, facts: Any, final: bool) -> Path:
        """FLUX.1 / SD 3.5: one file in the original layout (BFL's transformer alone, or SAI's
        transformer + VAE, as those models ship; with every component, ComfyUI's "all in one"
        form, when a text encoder trained) and the diffusers folder."""
        from trainer.export.lora import unwrap
        from trainer.families.sd.pipeline_folder import save_flow_pipeline_folder

        transformer = unwrap(model.denoiser)
        trained = {name: unwrap(encoder) for name, encoder, _ in
                   self.trained_text_encoders(model)}
        components = {"transformer": transformer, "vae": model.vae}
        family = family_of(model)
        for name, _, _ in family.text_encoders(model):
            components[name] = trained.get(name, getattr(model, name))
        parts = family.checkpoint_parts if trained else family.shipped_parts
        flow_checkpoint_writer(model)(path, components, flow_checkpoint_family(model),
                                      parts=parts, dtype=self.save_dtype)
        if final or self.cfg.saving.intermediate_diffusers:
            save_flow_pipeline_folder(path.with_suffix(""), model, transformer, trained,
                                      self.save_dtype)
        return path


def flow_checkpoint_family(model: Any) -> str:
    """trainer/families/common/mmdit_checkpoint.py's family name of a loaded FLUX.1 / SD 3.x
    model (``flux1-dev``, ``sd35-large``)."""
    return family_of(model).checkpoint_name(model.variant)


def flow_checkpoint_writer(model: Any) -> Any:
    """The writer of a transformer family's single file: its ``checkpoint`` role's
    ``save_checkpoint`` where it has one, else the MMDiT layouts' (FLUX.1, SD 3.x)."""
    from trainer.families import role
    from trainer.families.common.mmdit_checkpoint import save_flow_checkpoint

    own = role(model.version, "checkpoint")
    return own.save_checkpoint if own is not None else save_flow_checkpoint
