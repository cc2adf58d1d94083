"""SD 3 / 3.5's keys in a kohya_ss GUI config, as the importer (``trainer/importers/kohya/
flow.py``) reads them: the switch, the component files, the flow-matching settings, what
sd-scripts' SD3 trainers read that this studio does not, and the objective they imply.

kohya_ss passes these keys to sd-scripts (``sd3_train_network.py`` / ``sd3_train.py``) only
with ``sd3_checkbox``. Its LoRA tab saves the text-encoder files as ``sd3_clip_l`` /
``sd3_t5xxl``, its DreamBooth tab as ``clip_l`` / ``t5xxl``.

What sd-scripts does that the file does not say is made explicit: its SD3 trainers draw sigmas
from the weighting scheme's density, shifted by ``--training_shift`` (1.0, which kohya_ss does
not save), and compare ``noisy - sigma * output`` with the latents (``sigma_scaled`` here).
"""

from __future__ import annotations

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import Rule

SWITCHES = {"sd3": ("sd3_checkbox",)}  # family -> the kohya_ss keys that pick it
LORA_TYPES: tuple[str, ...] = ()
RULES: dict[str, Rule] = {
    "clip_g": Rule("model.clip_g", c.to_text),
    "weighting_scheme": Rule("flow.weighting_scheme", c.to_text),
    "logit_mean": Rule("flow.logit_mean", c.to_float),
    "logit_std": Rule("flow.logit_std", c.to_float),
    "mode_scale": Rule("flow.mode_scale", c.to_float),
    "sd3_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", c.only_on),
}
# our key -> the tab's key for it, DreamBooth's name first
ENCODER_FILES = {"model.clip_l": ("sd3_clip_l", "clip_l"),
                 "model.t5xxl": ("sd3_t5xxl", "t5xxl")}

_DROPOUT = "caption dropout per text encoder (dataset.caption_dropout_rate drops whole captions)"
UNSUPPORTED: dict[str, str] = {
    "sd3_fused_backward_pass": "fused optimizer steps",
    **dict.fromkeys(("clip_l_dropout_rate", "sd3_clip_l_dropout_rate", "clip_g_dropout_rate",
                     "t5_dropout_rate", "sd3_t5_dropout_rate"), _DROPOUT),
    **dict.fromkeys(("sd3_enable_scaled_pos_embed", "enable_scaled_pos_embed",
                     "pos_emb_random_crop_rate"), "SD 3.5 medium's scaled positional embedding"),
    **dict.fromkeys(("save_clip", "save_t5xxl"), "text encoders inside the DreamBooth file "
                    "(the diffusers folder holds them)"),
}
NOT_NEEDED: dict[str, str] = {
    "sd3_cache_text_encoder_outputs_to_disk": "the text-encoder cache is kept by the trainer",
    "sd3_text_encoder_batch_size": "the text-encoder cache is kept by the trainer",
    "sd3_disable_mmap_load_safetensors": "memory handling that the trainer does itself",
    **dict.fromkeys(("t5xxl_device", "t5xxl_dtype"),
                    "sd-scripts' SD3 trainers no longer read it (its inference script does); "
                    "T5 runs on the training device at the run's precision "
                    "(model.fp8_text_encoders stores it in fp8)"),
}
# the keys kohya_ss passes only with this family's switch
ONLY = (*RULES, "sd3_clip_l", "sd3_t5xxl", "clip_g_dropout_rate", "clip_l_dropout_rate",
        "sd3_clip_l_dropout_rate", "t5_dropout_rate", "sd3_t5_dropout_rate",
        "sd3_enable_scaled_pos_embed", "enable_scaled_pos_embed", "pos_emb_random_crop_rate",
        "save_clip", "save_t5xxl", "t5xxl_device", "t5xxl_dtype", "sd3_fused_backward_pass",
        "sd3_text_encoder_batch_size", "sd3_disable_mmap_load_safetensors",
        "sd3_cache_text_encoder_outputs_to_disk")
TIMESTEP_RANGE = True  # sd-scripts' SD3 trainers read min / max_timestep
# sd-scripts' SD3 trainers: density of the weighting scheme, --training_shift 1.0, x0 target
OBJECTIVE = {"flow.timestep_sampling": "sigma", "flow.discrete_flow_shift": 1.0,
             "flow.model_prediction_type": "sigma_scaled"}


def finish(ctx: Ctx) -> None:
    """The objective sd-scripts' SD3 trainers use, which the file does not say."""
    for target, value in OBJECTIVE.items():
        ctx.set("sd3_checkbox", target, value, raw=True)
    ctx.note("sd3_checkbox", "sd-scripts' SD3 trainers draw the sigmas from the weighting "
                             "scheme's density with --training_shift 1.0 and train towards the "
                             "latents: flow.timestep_sampling = 'sigma', discrete_flow_shift = "
                             "1.0, model_prediction_type = 'sigma_scaled'")
