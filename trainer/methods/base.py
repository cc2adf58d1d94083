"""What the methods share: the save precision, and freezing the text encoder after N steps."""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.config import TrainConfig

SAVE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class MethodBase:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.trains_text_encoder = False

    @staticmethod
    def nonempty(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The parameter groups of an adapter method; none is an error that says what to do."""
        if not groups:
            raise ValueError("network.train_unet and network.train_text_encoder are both off "
                             "(or this model has no text encoder to train): nothing would "
                             "train; turn one on")
        return groups

    def trained_text_encoders(self, model: Any) -> list[tuple[str, Any, float]]:
        """(name, encoder, learning rate) of each text encoder this run trains: the first
        with ``network.train_text_encoder``; SDXL's and SD 3.5's second CLIP with
        ``train_text_encoder_2`` (unset: the same as the first) at ``text_encoder_2_lr``
        (unset: ``text_encoder_lr``); the T5 of FLUX.1 / SD 3.5 with ``network.train_t5xxl``
        at ``text_encoder_lr``."""
        from trainer.families import family_of

        net, opt = self.cfg.network, self.cfg.optimizer
        lr = opt.text_encoder_lr or opt.learning_rate
        family = family_of(model)
        wanted = {"text_encoder": (net.train_text_encoder, lr),
                  "text_encoder_2": (net.train_text_encoder if net.train_text_encoder_2 is None
                                     else net.train_text_encoder_2,
                                     opt.text_encoder_2_lr or lr),
                  family.t5_slot(): (self.trains_t5, lr)}
        return [(name, encoder, wanted[name][1])
                for name, encoder, _ in family.text_encoders(model)
                if wanted[name][0]]

    @property
    def trains_t5(self) -> bool:
        """Whether this run trains the T5 of FLUX.1 / SD 3.5 (``network.train_t5xxl``, with the
        text encoder's learning rate: ``network.train_text_encoder`` too), or Chroma's, its
        only text encoder (``network.train_text_encoder``)."""
        from trainer.config.rules.family import trains_t5

        return trains_t5(self.cfg)

    def whole_modules(self, model: Any) -> list[Any]:
        """The modules every weight of which this method trains (DreamBooth's): set-up keeps
        them in fp32 (or full_bf16's dtype) from the load on, never rounded to the compute
        dtype on the way, as the frozen ones are."""
        return []

    @property
    def save_dtype(self) -> torch.dtype:
        return SAVE_DTYPES[self.cfg.saving.save_precision]

    def after_step(self, model: Any, step: int) -> Optional[str]:
        """Freeze the text encoder once ``network.stop_text_encoder_training`` steps are done,
        as sd-scripts' ``stop_text_encoder_training`` does; the optimizer then skips its
        parameters (their gradients stay None)."""
        stop = self.cfg.network.stop_text_encoder_training
        if not self.trains_text_encoder or stop is None or step < stop:
            return None
        from trainer.families import family_of

        for _, encoder, _ in family_of(model).text_encoders(model):
            encoder.requires_grad_(False)
            encoder.eval()
        self.trains_text_encoder = False
        return f"Text encoder frozen after step {step} (network.stop_text_encoder_training)"
