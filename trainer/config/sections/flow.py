"""[flow]: flow matching, the objective of FLUX.1 and SD 3.5 (trainer/objectives/flow.py).

The names and meanings are sd-scripts' (``flux_train_network.py``, ``sd3_train_network.py``), so
a kohya_ss config keeps its values. The defaults are the values that work, which are not all
sd-scripts' own: its docs (docs/flux_train_network.md) advise ``flux_shift`` (or ``shift`` with
3.1582), ``raw`` and guidance 1.0 for FLUX.1-dev, while its argparse defaults are ``sigma``,
``sigma_scaled`` and 3.5; each help text names sd-scripts' default. These settings are read only
when the base model is of a flow family: the GUI shows them only then, and a config of another
family that changes one is refused.
"""

from __future__ import annotations

from typing import Literal

from trainer.config.sections.base import FLOW, Section, setting

FLOW_MODES = ("lora", "dreambooth")  # textual inversion is refused for these families
TimestepSampling = Literal["sigma", "uniform", "sigmoid", "shift", "flux_shift"]
# "uniform" is sd-scripts' default name for no weighting (its help says it behaves as "none")
WeightingScheme = Literal["none", "uniform", "logit_normal", "mode", "cosmap", "sigma_sqrt"]
PredictionType = Literal["raw", "additive", "sigma_scaled"]


def _flow(default, help: str, **kw):
    return setting(default, help, families=FLOW, advanced=kw.pop("advanced", True),
                   modes=FLOW_MODES, **kw)


class FlowSection(Section):
    timestep_sampling: TimestepSampling = _flow(
        "flux_shift", "Where on the noise line each image is trained: sigma (the weighting "
        "scheme's density), uniform, sigmoid (sigmoid of a normal, times sigmoid_scale), shift "
        "(sigmoid, then discrete_flow_shift), flux_shift (sigmoid, then the model's shift for the "
        "image size: FLUX.1's, Qwen-Image's as musubi-tuner's qwen_shift). sd-scripts' default: "
        "sigma.", advanced=False, label="Timestep sampling")
    discrete_flow_shift: float = _flow(
        3.0, "Shift of the sigmas for timestep_sampling = shift or sigma (sd-scripts' "
        "--discrete_flow_shift, default 3.0; its docs suggest 3.1582 with shift).",
        gt=0, le=100, label="Flow shift")
    sigmoid_scale: float = _flow(
        1.0, "Scale of the normal draw before the sigmoid (sigmoid, shift, flux_shift).",
        gt=0, le=100, label="Sigmoid scale")
    weighting_scheme: WeightingScheme = _flow(
        "none", "Loss weighting over sigma (Esser et al. 2024, section 3.1): none, "
        "logit_normal, mode, cosmap, sigma_sqrt; with timestep_sampling = sigma it is also the "
        "density the sigmas are drawn from. sd-scripts' default: uniform (= none).",
        label="Weighting scheme")
    logit_mean: float = _flow(0.0, "Mean of logit_normal.", ge=-10, le=10,
                              label="Logit-normal mean")
    logit_std: float = _flow(1.0, "Standard deviation of logit_normal.", gt=0, le=10,
                             label="Logit-normal std")
    mode_scale: float = _flow(1.29, "Scale of the mode weighting scheme.", ge=0, le=10,
                              label="Mode scale")
    model_prediction_type: PredictionType = _flow(
        "raw", "How the transformer's output is read: raw (the velocity, noise - latents), "
        "additive (added to the noisy input), sigma_scaled (an estimate of the clean latents, "
        "noisy - sigma * output, compared with the latents and weighted by the scheme). "
        "sd-scripts' default: sigma_scaled; its docs advise raw.", label="Prediction type")
    guidance_scale: float = _flow(
        1.0, "FLUX.1-dev's and FLUX.2 [dev]'s guidance input while training (both are "
        "guidance-distilled; 1.0 is what sd-scripts' docs advise for FLUX.1 and what "
        "musubi-tuner trains FLUX.2 [dev] with; sd-scripts' and diffusers' defaults are 3.5). "
        "Ignored by schnell, FLUX.2 [klein] and SD 3.5.",
        advanced=False, ge=0, le=100, label="Guidance (FLUX.1-dev, FLUX.2 [dev])")
