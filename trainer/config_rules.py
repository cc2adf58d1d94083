"""Combinations of settings that cannot work, refused when a config is loaded, with the reason.

Called by :class:`trainer.config.TrainConfig`'s validator; each message names the settings and
what to change.
"""

from __future__ import annotations

from typing import Any


def mode_checks(cfg: Any) -> None:
    """Combinations of settings that cannot work, refused with the reason."""
    net, ds = cfg.network, cfg.dataset
    if cfg.mode == "textual_inversion":
        if not net.token_string or not net.token_string.strip():
            raise ValueError("network.token_string is required in textual_inversion mode")
        if any(c.isspace() for c in net.token_string):
            raise ValueError(f"network.token_string = {net.token_string!r}: one word without "
                             f"spaces, e.g. '<my-cat>'")
        if ds.reg_data_dir is not None:
            raise ValueError("dataset.reg_data_dir: regularization images are not used in "
                             "textual_inversion mode (only the token learns); unset it")
    elif cfg.mode == "dreambooth":
        if not (net.train_unet or net.train_text_encoder or net.train_text_encoder_2):
            raise ValueError("network.train_unet and network.train_text_encoder are both off: "
                             "nothing would train; turn one on")
        if cfg.saving.output_name in ("sample", "logs"):
            raise ValueError(f"saving.output_name = {cfg.saving.output_name!r}: DreamBooth "
                             f"writes a folder of that name, which is taken by the run's "
                             f"{cfg.saving.output_name} folder; choose another name")
    if cfg.mode != "textual_inversion" and net.stop_text_encoder_training is not None \
            and not net.train_unet:
        raise ValueError("network.stop_text_encoder_training is set but network.train_unet is "
                         "off: nothing would train after that step; turn train_unet on or "
                         "unset it")
    if ds.num_class_images is not None and ds.reg_data_dir is None:
        raise ValueError("dataset.num_class_images is set but dataset.reg_data_dir is not: set "
                         "the folder that keeps the class images")
