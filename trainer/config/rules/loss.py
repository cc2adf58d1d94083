"""The rules of the loss and noise options (trainer/objectives/losses.py): the settings each
needs, and the combinations that cannot work."""

from __future__ import annotations

from typing import Any


def problems(cfg: Any) -> list[str]:
    """The loss and noise options that need another setting."""
    tr, ds, pred = cfg.training, cfg.dataset, cfg.model.prediction_type
    for name in ("adaptive_noise_scale", "noise_offset_random_strength"):
        if getattr(tr, name) not in (None, False) and tr.noise_offset is None:
            return [f"training.{name} is set but training.noise_offset is not: it changes the "
                    f"noise offset; set noise_offset too or unset it"]
    if tr.min_timestep is not None and tr.max_timestep is not None \
            and tr.min_timestep >= tr.max_timestep:
        return [f"training.min_timestep ({tr.min_timestep}) must be smaller than "
                f"training.max_timestep ({tr.max_timestep}, exclusive)"]
    if tr.scale_v_pred_loss_like_noise_pred and pred == "epsilon":
        return ["training.scale_v_pred_loss_like_noise_pred is for v-prediction, but "
                "model.prediction_type is epsilon; unset one of them"]
    if tr.debiased_estimation_loss and tr.zero_terminal_snr and pred != "v_prediction":
        return ["training.debiased_estimation_loss with training.zero_terminal_snr divides by an "
                "SNR of 0 for an epsilon target; set model.prediction_type = 'v_prediction' or "
                "turn one of them off"]
    sources = [k for k, v in (("dataset.alpha_mask", ds.alpha_mask),
                              ("dataset.mask_data_dir", ds.mask_data_dir)) if v]
    if tr.masked_loss and len(sources) != 1 and ds.dataset_config is None:
        return ["training.masked_loss needs exactly one mask source: dataset.alpha_mask = true "
                "or dataset.mask_data_dir"
                + (f" (both are set: {', '.join(sources)})" if sources else "")]
    if sources and not tr.masked_loss:
        return [f"{sources[0]} is set but training.masked_loss is off: the mask would not be "
                f"used; turn masked_loss on or unset it"]
    return []
