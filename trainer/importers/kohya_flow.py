"""kohya_ss's FLUX.1 and SD3 keys: the family switch, the component files, the flow-matching
settings, and what this studio does not do yet.

kohya_ss (lora_gui / dreambooth_gui ``train_model``) passes each of these keys to sd-scripts only
with its family's switch: ``flux1_checkbox`` for ``flux_train_network.py`` / ``flux_train.py``,
``sd3_checkbox`` for ``sd3_train_network.py`` / ``sd3_train.py``; a key of the other family (or
of either, in an SD file) is reported as not needed. Its two tabs name the text-encoder files
differently: the LoRA tab saves FLUX.1's as ``clip_l`` / ``t5xxl`` and SD3's as ``sd3_clip_l`` /
``sd3_t5xxl``, the DreamBooth tab the reverse (``flux1_clip_l`` / ``flux1_t5xxl`` and ``clip_l`` /
``t5xxl``), so the key read is the family's own for the file's tab.

What sd-scripts does that the file does not say is made explicit: its SD3 trainers draw sigmas
from the weighting scheme's density, shifted by ``--training_shift`` (1.0, which kohya_ss does
not save), and compare ``noisy - sigma * output`` with the latents (``sigma_scaled`` here).
sd-scripts' FLUX.1 and SD3 trainers read none of the DDPM options (noise offset, min-SNR,
timestep range for FLUX.1...): those the kohya_ss form still saves are reported as not needed
instead of imported, as the config would refuse them (trainer/config/rules/family.py).
The memory options (fp8 base weights, block swap) are kohya_memory.py's.
"""

from __future__ import annotations

from typing import Any

from trainer.config.rules.family import objective_options
from trainer.families import label
from trainer.importers import kohya_convert as c
from trainer.importers.kohya_report import Ctx, is_off
from trainer.importers.kohya_table import Rule

SWITCHES = {"flux1_checkbox": "flux1", "sd3_checkbox": "sd3"}
FLUX_LORA_TYPES = ("Flux1",)  # LoRA_type values that mean a FLUX.1 LoRA (networks.lora_flux)


def _on(value: Any) -> Any:
    """kohya_ss passes a cache switch only when on; off leaves the studio's default."""
    return True if c.to_bool(value) is True else c.UNSET


FLUX_RULES: dict[str, Rule] = {
    "ae": Rule("model.ae", c.to_text),
    "guidance_scale": Rule("flow.guidance_scale", c.to_float),
    "timestep_sampling": Rule("flow.timestep_sampling", c.to_text),
    "discrete_flow_shift": Rule("flow.discrete_flow_shift", c.to_float),
    "model_prediction_type": Rule("flow.model_prediction_type", c.to_text),
    "t5xxl_max_token_length": Rule("model.t5xxl_max_token_length", c.nonzero(c.to_int)),
    "train_t5xxl": Rule("network.train_t5xxl", c.to_bool, ("lora",)),
    "flux1_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", _on),
}
SD3_RULES: dict[str, Rule] = {
    "clip_g": Rule("model.clip_g", c.to_text),
    "weighting_scheme": Rule("flow.weighting_scheme", c.to_text),
    "logit_mean": Rule("flow.logit_mean", c.to_float),
    "logit_std": Rule("flow.logit_std", c.to_float),
    "mode_scale": Rule("flow.mode_scale", c.to_float),
    "sd3_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", _on),
}
# (our key, {family: the tab's key for it, DreamBooth's name first})
ENCODER_FILES = {"model.clip_l": {"flux1": ("flux1_clip_l", "clip_l"),
                                  "sd3": ("sd3_clip_l", "clip_l")},
                 "model.t5xxl": {"flux1": ("flux1_t5xxl", "t5xxl"),
                                 "sd3": ("sd3_t5xxl", "t5xxl")}}

_RANKS = "per-part ranks and block choices of sd-scripts' lora_flux (one rank for all here)"
_DROPOUT = "caption dropout per text encoder (dataset.caption_dropout_rate drops whole captions)"
UNSUPPORTED: dict[str, str] = {
    "cpu_offload_checkpointing": "sd-scripts' FLUX.1 option that keeps the checkpointed "
                                 "activations in host memory; not available here "
                                 "(training.blocks_to_swap moves weights, not activations)",
    **dict.fromkeys(("flux_fused_backward_pass", "sd3_fused_backward_pass",
                     "blockwise_fused_optimizers"), "fused optimizer steps"),
    **dict.fromkeys(("img_attn_dim", "img_mlp_dim", "img_mod_dim", "txt_attn_dim",
                     "txt_mlp_dim", "txt_mod_dim", "single_dim", "single_mod_dim", "in_dims",
                     "train_double_block_indices", "train_single_block_indices"), _RANKS),
    **dict.fromkeys(("clip_l_dropout_rate", "sd3_clip_l_dropout_rate", "clip_g_dropout_rate",
                     "t5_dropout_rate", "sd3_t5_dropout_rate"), _DROPOUT),
    **dict.fromkeys(("train_lora_ggpo", "ggpo_beta", "ggpo_sigma"), "GGPO regularization"),
    **dict.fromkeys(("sd3_enable_scaled_pos_embed", "enable_scaled_pos_embed",
                     "pos_emb_random_crop_rate"), "SD 3.5 medium's scaled positional embedding"),
    "apply_t5_attn_mask": "T5's attention mask: captions are encoded without it, as the "
                          "inference tools do (sd-scripts' docs advise against the mask)",
    "t5xxl_lr": "a T5 learning rate of its own: T5 trains at optimizer.text_encoder_lr",
    **dict.fromkeys(("save_clip", "save_t5xxl"), "text encoders inside the DreamBooth file "
                    "(the diffusers folder holds them)"),
    "enable_all_linear": "an option of LoRA_type Flux1 OFT, which this studio does not train",
    "model_type": "Chroma (FLUX.1's architecture without CLIP-L)",
}
NOT_NEEDED: dict[str, str] = {
    **dict.fromkeys(("flux1_cache_text_encoder_outputs_to_disk",
                     "sd3_cache_text_encoder_outputs_to_disk"),
                    "the text-encoder cache is kept by the trainer"),
    "sd3_text_encoder_batch_size": "the text-encoder cache is kept by the trainer",
    "sd3_disable_mmap_load_safetensors": "memory handling that the trainer does itself",
    **dict.fromkeys(("t5xxl_device", "t5xxl_dtype"),
                    "sd-scripts' SD3 trainers no longer read it (its inference script does); "
                    "T5 runs on the training device at the run's precision "
                    "(model.fp8_text_encoders stores it in fp8)"),
    "mem_eff_save": "how sd-scripts writes a FLUX.1 DreamBooth file (tensor by tensor, less "
                    "host memory); the file is the same",
    **dict.fromkeys(("show_timesteps", "show_timesteps_resolution"),
                    "a kohya_ss preview of the timestep distribution"),
}
FLUX_ONLY = (*FLUX_RULES, "flux1_clip_l", "flux1_t5xxl", "train_blocks", "split_mode",
             "split_qkv", "fp8_base_unet", "single_blocks_to_swap", "double_blocks_to_swap",
             "cpu_offload_checkpointing", "mem_eff_save", "apply_t5_attn_mask", "t5xxl_lr",
             "flux1_cache_text_encoder_outputs_to_disk", "flux_fused_backward_pass",
             "blockwise_fused_optimizers", "model_type", "enable_all_linear",
             "img_attn_dim", "img_mlp_dim", "img_mod_dim", "txt_attn_dim", "txt_mlp_dim",
             "txt_mod_dim", "single_dim", "single_mod_dim", "in_dims", "train_lora_ggpo",
             "ggpo_beta", "ggpo_sigma", "train_double_block_indices",
             "train_single_block_indices")
SD3_ONLY = (*SD3_RULES, "sd3_clip_l", "sd3_t5xxl", "clip_g_dropout_rate", "clip_l_dropout_rate",
            "sd3_clip_l_dropout_rate", "t5_dropout_rate", "sd3_t5_dropout_rate",
            "sd3_enable_scaled_pos_embed", "enable_scaled_pos_embed", "pos_emb_random_crop_rate",
            "save_clip", "save_t5xxl", "t5xxl_device", "t5xxl_dtype", "sd3_fused_backward_pass",
            "sd3_text_encoder_batch_size", "sd3_disable_mmap_load_safetensors",
            "sd3_cache_text_encoder_outputs_to_disk")
BOTH = ("clip_l", "t5xxl", "blocks_to_swap", "show_timesteps", "show_timesteps_resolution")
# the memory options: kohya_memory.py reads them (with the family this module finds)
MEMORY_KEYS = ("fp8_base", "fp8_base_unet", "blocks_to_swap", "single_blocks_to_swap",
               "double_blocks_to_swap", "split_mode")
KEYS = tuple(k for k in dict.fromkeys((*SWITCHES, *FLUX_ONLY, *SD3_ONLY, *BOTH))
             if k not in MEMORY_KEYS)
# sd-scripts' SD3 trainers: density of the weighting scheme, --training_shift 1.0, x0 target
SD3_OBJECTIVE = {"flow.timestep_sampling": "sigma", "flow.discrete_flow_shift": 1.0,
                 "flow.model_prediction_type": "sigma_scaled"}


def family_of(data: dict[str, Any]) -> str | None:
    """The flow family a kohya_ss file trains ("flux1", "sd3"), or None."""
    found = [fam for key, fam in SWITCHES.items() if c.to_bool(data.get(key, False)) is True]
    if data.get("LoRA_type") in FLUX_LORA_TYPES:
        found.append("flux1")
    found = list(dict.fromkeys(found))
    if len(found) > 1:
        raise ValueError("flux1_checkbox and sd3_checkbox are both on: a model is one or the "
                         "other")
    return found[0] if found else None


def flow(ctx: Ctx) -> None:
    """Every FLUX.1 / SD3 key of the file: mapped, or reported with the reason."""
    try:
        family = family_of(ctx.data)
    except ValueError as exc:
        ctx.problems.append(str(exc))
        return
    for key in (k for k in SWITCHES if k in ctx.data):
        if SWITCHES[key] == family:
            ctx.set(key, "model.model_version", family)
        else:
            ctx.unset(key)
    if family is not None:
        _drop_sdxl_cache(ctx)
    owned = {"flux1": FLUX_ONLY, "sd3": SD3_ONLY}.get(family or "", ())
    others = [k for k in KEYS if k in ctx.data and k not in SWITCHES]
    if family is not None:
        _encoder_files(ctx, family)
        others = [k for k in others if k not in ctx.report.keys()]
    for key in others:
        if key in owned or (family is not None and key in BOTH):
            _owned_key(ctx, key, family)
        else:
            ctx.skip(key, _not_passed(key, family))
    if family == "flux1":
        _train_blocks(ctx)
    elif family == "sd3":
        _sd3_objective(ctx)
    if family is not None:
        drop_ddpm_options(ctx, family)


def _not_passed(key: str, family: str | None) -> str:
    names = [label(f) for f, keys in (("flux1", FLUX_ONLY), ("sd3", SD3_ONLY))
             if key in keys or key in BOTH]
    switch = " / ".join(k for k, f in SWITCHES.items() if label(f) in names)
    return f"a {' / '.join(names)} setting; kohya_ss passes it only with {switch}"


def _drop_sdxl_cache(ctx: Ctx) -> None:
    """kohya_ss passes sdxl_cache_text_encoder_outputs only with sdxl: the family's own cache
    switch decides (mapped after this)."""
    key = "sdxl_cache_text_encoder_outputs"
    for entry in [m for m in ctx.report.mapped if m[0] == key]:
        ctx.report.mapped.remove(entry)
        ctx.report.same_as_default.discard(key)
        ctx.out.get("dataset", {}).pop("cache_text_encoder_outputs", None)
        ctx.skip(key, "an SDXL setting; kohya_ss passes it only with sdxl")


def _encoder_files(ctx: Ctx, family: str) -> None:
    for target, by_family in ENCODER_FILES.items():
        mine = next((k for k in by_family[family] if k in ctx.data), None)
        if mine is None:
            continue
        ctx.apply(mine, Rule(target, c.to_text))
        other = "sd3" if family == "flux1" else "flux1"
        for key in by_family[other]:
            if key in ctx.data and key not in ctx.report.keys():
                ctx.skip(key, f"the {label(other)} file in this kohya_ss tab; kohya_ss "
                              f"passes it only with its switch")


def _owned_key(ctx: Ctx, key: str, family: str) -> None:
    rule = {**FLUX_RULES, **SD3_RULES}.get(key)
    value = ctx.data[key]
    if rule is not None:
        ctx.apply(key, rule)
    elif key in NOT_NEEDED:
        ctx.skip(key, NOT_NEEDED[key])
    elif key in UNSUPPORTED:
        ctx.unset(key) if is_off(value) or value in ("flux", "") else \
            ctx.refuse(key, UNSUPPORTED[key])
    elif key == "train_blocks":
        pass  # _train_blocks
    elif key == "split_qkv":
        ctx.skip(key, "the attention's q, k and v each have a LoRA here (diffusers' split "
                      "modules), saved fused in the BFL layout, as sd-scripts' split_qkv = "
                      "true trains them" + ("" if c.to_bool(value) is True else
                                            "; false (one LoRA on the fused qkv) is not "
                                            "available"))
    else:
        ctx.skip(key, _not_passed(key, family))


def _train_blocks(ctx: Ctx) -> None:
    """kohya_ss passes train_blocks only as "single" with split_mode (deprecated); otherwise
    sd-scripts trains all blocks, whatever the form's train_blocks says."""
    split = "split_mode" in ctx.data and c.to_bool(ctx.data["split_mode"]) is True
    if "train_blocks" not in ctx.data or ctx.mode != "lora":
        if "train_blocks" in ctx.data:
            ctx.skip("train_blocks", f"a LoRA setting, not used in {ctx.mode} mode")
        return
    blocks = "single" if split else "all"
    ctx.set("train_blocks", "network.train_blocks", blocks)
    if ctx.data["train_blocks"] != blocks:
        ctx.note("train_blocks", f"kohya_ss passes it only as 'single' with split_mode, so "
                                 f"sd-scripts trained {blocks!r} blocks: imported as {blocks!r}")


def _sd3_objective(ctx: Ctx) -> None:
    for target, value in SD3_OBJECTIVE.items():
        ctx.set("sd3_checkbox", target, value, raw=True)
    ctx.note("sd3_checkbox", "sd-scripts' SD3 trainers draw the sigmas from the weighting "
                             "scheme's density with --training_shift 1.0 and train towards the "
                             "latents: flow.timestep_sampling = 'sigma', discrete_flow_shift = "
                             "1.0, model_prediction_type = 'sigma_scaled'")


# The SD families' prompt options (trainer/data/weighted captions, long prompts): the value
# that means "off"; the kohya_ss form saves them for every family
SD_PROMPT_OPTIONS = {"dataset.max_token_length": None, "dataset.weighted_captions": False,
                     "dataset.no_token_padding": False}


def drop_ddpm_options(ctx: Ctx, family: str) -> None:
    """The DDPM options that the file set (mapped by the SD rules) are not read by sd-scripts'
    flow trainers: move them from the config to "not needed" (SD3's timestep range, which
    sd-scripts does read, is refused unless it is the full 0-1000)."""
    name = label(family)
    targets = {**objective_options("ddpm", "training"), **objective_options("ddpm", "sampling")}
    targets["model.prediction_type"] = None
    targets.update(SD_PROMPT_OPTIONS)
    for entry in list(ctx.report.mapped):
        key, raw, target, value = entry
        if target not in targets or value == targets[target]:
            continue
        section, _, field = target.partition(".")
        ctx.out.get(section, {}).pop(field, None)
        ctx.targets.pop(target, None)
        ctx.report.mapped.remove(entry)
        ctx.report.same_as_default.discard(key)
        if family == "sd3" and target == "training.max_timestep" and value == 1000:
            ctx.skip(key, "the full range: flow matching samples all of it here")
        elif family == "sd3" and target in ("training.min_timestep", "training.max_timestep"):
            ctx.refuse(key, "a narrower timestep range for SD 3.5 (flow matching samples the "
                            "whole range here)", raw)
        elif target in SD_PROMPT_OPTIONS:
            ctx.skip(key, f"a CLIP prompt option of the SD families; {name} reads 77 CLIP "
                          f"tokens and model.t5xxl_max_token_length T5 tokens")
        else:
            ctx.skip(key, f"a DDPM option; {name} trains with flow matching and sd-scripts' "
                          f"{name} trainer does not read it either")
