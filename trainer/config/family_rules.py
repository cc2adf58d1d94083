"""Settings that a model family cannot use, refused with the reason.

A config knows its family when ``model.model_version`` names it or the model is an embedded one;
then these checks run when the config loads. Otherwise the run calls :func:`family_problems`
again once the model is loaded and its family detected, before anything trains, so a FLUX.1
checkpoint given as a path gets the same messages.

The flow families (FLUX.1, SD 3.5) train with flow matching (the ``[flow]`` section): the DDPM
noise and loss options (trainer/objectives/losses.py) have no meaning there, and sd-scripts'
FLUX.1 and SD3 trainers do not read them either.
"""

from __future__ import annotations

from typing import Any, Optional

from trainer.config.sections.base import EMBEDDED_FLUX, EMBEDDED_MODEL, EMBEDDED_SD3, EMBEDDED_SDXL
from trainer.config.sections.flow import FLOW_FAMILIES

EMBEDDED_FAMILIES = {EMBEDDED_MODEL: "sd1", EMBEDDED_SDXL: "sdxl", EMBEDDED_FLUX: "flux1",
                     EMBEDDED_SD3: "sd3"}
FAMILY_NAMES = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL", "flux1": "FLUX.1",
                "sd3": "SD 3.5"}
# training.<name>: the value that means "off"; any other is a DDPM option
DDPM_ONLY = {"zero_terminal_snr": False, "noise_offset": None, "noise_offset_random_strength":
             False, "adaptive_noise_scale": None, "multires_noise_iterations": None,
             "min_snr_gamma": None, "min_timestep": None, "max_timestep": None,
             "debiased_estimation_loss": False, "scale_v_pred_loss_like_noise_pred": False}


def known_family(cfg: Any) -> Optional[str]:
    """The family the config names (model_version, or an embedded model); None for auto."""
    if cfg.model.model_version != "auto":
        return cfg.model.model_version
    return EMBEDDED_FAMILIES.get(cfg.model.pretrained_model_name_or_path)


def family_problems(cfg: Any, family: str, precision: Optional[str] = None) -> list[str]:
    """What ``cfg`` asks of a ``family`` model that it cannot do; ``precision`` is the resolved
    mixed precision when known (the run), else ``training.mixed_precision``."""
    from trainer.config.network_rules import network_extra_problems  # LoRA+, block-wise, ...
    from trainer.config.parity_rules import block_lr_family_problems, caption_family_problems

    name = FAMILY_NAMES[family]
    extra = network_extra_problems(cfg.network, family) if cfg.mode == "lora" else []
    extra += block_lr_family_problems(cfg, family, name)
    if family not in FLOW_FAMILIES:
        unread = [f"model.{key}" for key in ("ae", "clip_l", "clip_g", "t5xxl")
                  if getattr(cfg.model, key) is not None]
        unread += ["network.train_t5xxl"] if cfg.network.train_t5xxl else []
        return extra + [f"{key} is set but {name} does not read it (FLUX.1 / SD 3.5 only); "
                        f"unset it" for key in unread]
    problems = extra
    if cfg.mode == "textual_inversion":
        problems.append(f"mode = 'textual_inversion' is not available for {name}: its prompts "
                        f"go through T5 as well as CLIP, and the tools that load embeddings do "
                        f"not read one for these models; train a LoRA instead")
    setting = cfg.training.mixed_precision
    if family == "flux1" and (precision or setting) == "fp16":
        chose = "" if setting == "fp16" else " (chosen for this device)"
        problems.append(f"training.mixed_precision = 'fp16'{chose} cannot train FLUX.1: its "
                        f"activations overflow fp16 (NaN losses or an empty LoRA, as sd-scripts' "
                        f"users report); use 'bf16', or 'no' (fp32)")
    tr = cfg.training
    for key, off in DDPM_ONLY.items():
        if getattr(tr, key) != off:
            problems.append(f"training.{key} is a DDPM option; {name} trains with flow "
                            f"matching (the [flow] section); unset it")
    if tr.loss_type in ("huber", "smooth_l1") and tr.huber_schedule == "snr":
        problems.append(f"training.huber_schedule = 'snr' needs a DDPM noise schedule; {name} "
                        f"trains with flow matching: use 'constant' or 'exponential'")
    if cfg.model.prediction_type is not None:
        problems.append(f"model.prediction_type is a DDPM setting; for {name} set "
                        f"flow.model_prediction_type instead")
    if cfg.model.clip_skip != 1:
        problems.append(f"model.clip_skip = {cfg.model.clip_skip}: {name} reads its text "
                        f"encoders' own outputs; set it back to 1")
    problems += caption_family_problems(cfg, name)  # issue 21: weighted / long captions
    if family == "sd3" and cfg.model.ae is not None:
        problems.append("model.ae is the FLUX.1 autoencoder setting; an SD 3.5 single file "
                        "holds its VAE (or set model.vae)")
    if family == "flux1" and cfg.model.clip_g is not None:
        problems.append("model.clip_g is for SD 3.5; FLUX.1 has no CLIP-G; unset it")
    if family == "sd3" and cfg.network.train_t5xxl:
        problems.append("network.train_t5xxl: an SD 3.5 LoRA of T5 would load in ComfyUI but "
                        "not in diffusers (its SD3 loader reads no T5 keys), so the studio does "
                        "not train one; unset it")
    if cfg.mode == "lora" and cfg.network.network_type != "lora":
        problems.append(f"network.network_type = {cfg.network.network_type!r}: the LyCORIS "
                        f"types are not available for {name} yet; use 'lora'")
    if cfg.network.conv_dim is not None:
        problems.append(f"network.conv_dim: {name}'s transformer has no convolutions to adapt; "
                        f"unset it")
    if cfg.network.train_t5xxl and not cfg.network.train_text_encoder:
        problems.append("network.train_t5xxl needs network.train_text_encoder (T5 trains with "
                        "the text-encoder learning rate); turn it on or unset train_t5xxl")
    return problems


def family_checks(cfg: Any) -> None:
    """Raise the first problem of the family the config names; nothing when it names none."""
    family = known_family(cfg)
    if family is None:
        return
    problems = family_problems(cfg, family)
    if problems:
        raise ValueError(problems[0])
