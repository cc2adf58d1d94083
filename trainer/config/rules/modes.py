"""The rules of the training modes (textual inversion, DreamBooth) and of an sd-scripts dataset
TOML: what a mode needs, and the settings it would not use."""

from __future__ import annotations

from typing import Any


def problems(cfg: Any) -> list[str]:
    """What the training mode needs or cannot use."""
    net, ds = cfg.network, cfg.dataset
    if cfg.mode == "textual_inversion":
        if not net.token_string or not net.token_string.strip():
            return ["network.token_string is required in textual_inversion mode"]
        if any(c.isspace() for c in net.token_string):
            return [f"network.token_string = {net.token_string!r}: one word without spaces, "
                    f"e.g. '<my-cat>'"]
        if ds.reg_data_dir is not None:
            return ["dataset.reg_data_dir: regularization images are not used in "
                    "textual_inversion mode (only the token learns); unset it"]
    elif cfg.mode == "dreambooth":
        if not (net.train_unet or net.train_text_encoder or net.train_text_encoder_2):
            return ["network.train_unet and network.train_text_encoder are both off: nothing "
                    "would train; turn one on"]
        if cfg.saving.output_name in ("sample", "logs"):
            return [f"saving.output_name = {cfg.saving.output_name!r}: DreamBooth writes a "
                    f"folder of that name, which is taken by the run's "
                    f"{cfg.saving.output_name} folder; choose another name"]
    if cfg.mode != "textual_inversion" and net.stop_text_encoder_training is not None \
            and not net.train_unet:
        return ["network.stop_text_encoder_training is set but network.train_unet is off: "
                "nothing would train after that step; turn train_unet on or unset it"]
    if ds.num_class_images is not None and ds.reg_data_dir is None:
        return ["dataset.num_class_images is set but dataset.reg_data_dir is not: set the "
                "folder that keeps the class images"]
    return []


def dataset_config_problems(cfg: Any) -> list[str]:
    """``dataset.dataset_config`` (an sd-scripts dataset TOML) names the run's folders itself."""
    from trainer.config.sections.base import EMBEDDED_DATASET

    ds = cfg.dataset
    if ds.dataset_config is None:
        return []
    taken = [key for key, value in (
        ("dataset.train_data_dir", ds.train_data_dir not in (EMBEDDED_DATASET, "")),
        ("dataset.reg_data_dir", ds.reg_data_dir is not None),
        ("dataset.mask_data_dir", ds.mask_data_dir is not None),
        ("dataset.control_dir", ds.control_dir is not None)) if value]
    if taken:
        back = (f" (clear it or set it back to {EMBEDDED_DATASET})"
                if taken[0] == "dataset.train_data_dir" else "")
        return [f"dataset.dataset_config and {taken[0]} are both set: the dataset TOML names "
                f"its own folders (image_dir, is_reg, conditioning_data_dir, "
                f"control_directory in [[datasets.subsets]]); unset {taken[0]}{back} or "
                f"unset dataset.dataset_config"]
    if ds.num_class_images is not None:
        return ["dataset.num_class_images cannot be used with dataset.dataset_config: class "
                "images are generated into dataset.reg_data_dir; generate them in a run "
                "without the TOML, then add their folder as an is_reg subset"]
    return []
