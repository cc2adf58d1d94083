"""Combinations of settings that cannot work, refused when a config is loaded, with the reason.

Called by :class:`trainer.config.TrainConfig`'s validator; each message names the settings and
what to change.
"""

from __future__ import annotations

from typing import Any


def mode_checks(cfg: Any) -> None:
    """Combinations of settings that cannot work, refused with the reason."""
    from trainer.config.family_rules import family_checks

    net, ds = cfg.network, cfg.dataset
    dataset_config_checks(cfg)
    network_checks(cfg)
    family_checks(cfg)
    from trainer.config.memory_rules import memory_checks

    memory_checks(cfg)
    from trainer.config.distributed_rules import distributed_checks

    distributed_checks(cfg)
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
    loss_checks(cfg)
    from trainer.config.parity_rules import parity_checks

    parity_checks(cfg)
    from trainer.config.fused_rules import fused_checks

    fused_checks(cfg)
    from trainer.optim.optimizers import (
        optimizer_problems,  # optimizer and schedule that cannot pair
    )

    problem = optimizer_problems(cfg.optimizer)
    if problem:
        raise ValueError(problem)


def loss_checks(cfg: Any) -> None:
    """The loss and noise options (trainer/objectives/losses.py) that need another setting."""
    tr, ds, pred = cfg.training, cfg.dataset, cfg.model.prediction_type
    for name in ("adaptive_noise_scale", "noise_offset_random_strength"):
        if getattr(tr, name) not in (None, False) and tr.noise_offset is None:
            raise ValueError(f"training.{name} is set but training.noise_offset is not: it "
                             f"changes the noise offset; set noise_offset too or unset it")
    if tr.min_timestep is not None and tr.max_timestep is not None \
            and tr.min_timestep >= tr.max_timestep:
        raise ValueError(f"training.min_timestep ({tr.min_timestep}) must be smaller than "
                         f"training.max_timestep ({tr.max_timestep}, exclusive)")
    if tr.scale_v_pred_loss_like_noise_pred and pred == "epsilon":
        raise ValueError("training.scale_v_pred_loss_like_noise_pred is for v-prediction, but "
                         "model.prediction_type is epsilon; unset one of them")
    if tr.debiased_estimation_loss and tr.zero_terminal_snr and pred != "v_prediction":
        raise ValueError("training.debiased_estimation_loss with training.zero_terminal_snr "
                         "divides by an SNR of 0 for an epsilon target; set "
                         "model.prediction_type = 'v_prediction' or turn one of them off")
    sources = [k for k, v in (("dataset.alpha_mask", ds.alpha_mask),
                              ("dataset.mask_data_dir", ds.mask_data_dir)) if v]
    if tr.masked_loss and len(sources) != 1 and ds.dataset_config is None:
        raise ValueError("training.masked_loss needs exactly one mask source: "
                         "dataset.alpha_mask = true or dataset.mask_data_dir"
                         + (f" (both are set: {', '.join(sources)})" if sources else ""))
    if sources and not tr.masked_loss:
        raise ValueError(f"{sources[0]} is set but training.masked_loss is off: the mask would "
                         f"not be used; turn masked_loss on or unset it")


def dataset_config_checks(cfg: Any) -> None:
    """``dataset.dataset_config`` (an sd-scripts dataset TOML) names the run's folders itself."""
    from trainer.config.sections.base import EMBEDDED_DATASET

    ds = cfg.dataset
    if ds.dataset_config is None:
        return
    taken = [key for key, value in (
        ("dataset.train_data_dir", ds.train_data_dir not in (EMBEDDED_DATASET, "")),
        ("dataset.reg_data_dir", ds.reg_data_dir is not None),
        ("dataset.mask_data_dir", ds.mask_data_dir is not None)) if value]
    if taken:
        back = (f" (clear it or set it back to {EMBEDDED_DATASET})"
                if taken[0] == "dataset.train_data_dir" else "")
        raise ValueError(f"dataset.dataset_config and {taken[0]} are both set: the dataset TOML "
                         f"names its own folders (image_dir, is_reg, conditioning_data_dir in "
                         f"[[datasets.subsets]]); unset {taken[0]}{back} or unset "
                         f"dataset.dataset_config")
    if ds.num_class_images is not None:
        raise ValueError("dataset.num_class_images cannot be used with dataset.dataset_config: "
                         "class images are generated into dataset.reg_data_dir; generate them "
                         "in a run without the TOML, then add their folder as an is_reg subset")


# Network options and the network types that read them: peft's LoRA for "lora", lycoris-lora's
# modules for the rest (lycoris/modules/*.py: LoConModule, LohaModule, LokrModule, IA3Module,
# and NormModule for train_norm).
NETWORK_OPTIONS = {
    "factor": ("lokr",), "decompose_both": ("lokr",),
    "use_tucker": ("locon", "loha", "lokr", "dora"),
    "use_scalar": ("locon", "loha", "lokr", "dora", "glora"),
    # "lora": sd-scripts' LoRAModule meaning (trainer/methods/lora_regularize.py)
    "rank_dropout": ("lora", "locon", "loha", "lokr", "dora", "glora", "diag-oft"),
    "module_dropout": ("lora", "locon", "loha", "lokr", "ia3", "dora", "glora", "boft",
                       "diag-oft"),
    # IA3 scales the channels of named layers (keys, values, feed-forward): it has no rank
    # (network_dim / network_alpha are ignored), no convolution rank, no dropout on a low-rank
    # path, and no block whose norm layers train_norm would find
    "train_norm": ("locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    # OFT's convolution rank is its block size there; its alpha is the constraint (BOFTModule,
    # DiagOFTModule)
    "conv_dim": ("lora", "locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    "conv_alpha": ("lora", "locon", "loha", "lokr", "dora", "glora"),
    "network_dropout": ("lora", "locon", "loha", "lokr", "dora"),
    "constraint": ("boft", "diag-oft"), "rescaled": ("boft", "diag-oft"),
    # network.lycoris_preset picks the modules; ia3 is lycoris' "ia3" preset itself
    "lycoris_preset": ("locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    # LycorisBaseModule's bypass forward; LoConModule's skips DoRA's weight decomposition
    "bypass_mode": ("locon", "loha", "lokr", "glora", "boft", "diag-oft"),
}


def network_checks(cfg: Any) -> None:
    """A network option that the chosen network.network_type does not read is refused."""
    net = cfg.network
    if cfg.mode != "lora":
        return
    for name, types in NETWORK_OPTIONS.items():
        value = getattr(net, name)
        if value is None or value is False or net.network_type in types:
            continue
        raise ValueError(f"network.{name} is set but network.network_type = "
                         f"{net.network_type!r} does not use it (it applies to "
                         f"{', '.join(types)}); unset it or change network_type")
    from trainer.config.lycoris_rules import lycoris_preset_checks

    lycoris_preset_checks(net)
