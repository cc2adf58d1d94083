"""FLUX.1's keys in a kohya_ss GUI config, as the importer (``trainer/importers/kohya/flow.py``)
reads them: the switch, the component files, the flow-matching settings, what sd-scripts'
FLUX.1 trainers read that this studio does not, and block swap's count.

kohya_ss passes these keys to sd-scripts (``flux_train_network.py`` / ``flux_train.py``) only
with ``flux1_checkbox`` (or LoRA_type ``Flux1``). Its LoRA tab saves the text-encoder files as
``clip_l`` / ``t5xxl``, its DreamBooth tab as ``flux1_clip_l`` / ``flux1_t5xxl``.

``blocks_to_swap``: sd-scripts' ``enable_block_swap(N)`` swaps N // 2 double blocks and
(N - N // 2) x 2 single blocks; here the last units in forward order go first (the 38 single
blocks, then double blocks), so the count becomes the fewest units that hold at least as many
weights: a double block has 36 h^2 weights (two AdaLayerNormZero 6h projections, two q/k/v,
two outputs, two 4h MLPs) and 30 h biases, a single block 15 h^2 (3h modulation, 4h MLP in,
q/k/v, the (h + 4h) output) and 11 h biases: 2.4 single blocks' worth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import Rule

SWITCHES = {"flux1": ("flux1_checkbox",)}  # family -> the kohya_ss keys that pick it
LORA_TYPES = ("Flux1",)  # LoRA_type values that mean a FLUX.1 LoRA (networks.lora_flux)
RULES: dict[str, Rule] = {
    "ae": Rule("model.ae", c.to_text),
    "guidance_scale": Rule("flow.guidance_scale", c.to_float),
    "timestep_sampling": Rule("flow.timestep_sampling", c.to_text),
    "discrete_flow_shift": Rule("flow.discrete_flow_shift", c.to_float),
    "model_prediction_type": Rule("flow.model_prediction_type", c.to_text),
    "t5xxl_max_token_length": Rule("model.t5xxl_max_token_length", c.nonzero(c.to_int)),
    "train_t5xxl": Rule("network.train_t5xxl", c.to_bool, ("lora",)),
    "flux1_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", c.only_on),
}
# our key -> the tab's key for it, DreamBooth's name first
ENCODER_FILES = {"model.clip_l": ("flux1_clip_l", "clip_l"),
                 "model.t5xxl": ("flux1_t5xxl", "t5xxl")}

_RANKS = "per-part ranks and block choices of sd-scripts' lora_flux (one rank for all here)"
UNSUPPORTED: dict[str, str] = {
    "cpu_offload_checkpointing": "sd-scripts' FLUX.1 option that keeps the checkpointed "
                                 "activations in host memory; not available here "
                                 "(training.blocks_to_swap moves weights, not activations)",
    **dict.fromkeys(("flux_fused_backward_pass", "blockwise_fused_optimizers"),
                    "fused optimizer steps"),
    **dict.fromkeys(("img_attn_dim", "img_mlp_dim", "img_mod_dim", "txt_attn_dim",
                     "txt_mlp_dim", "txt_mod_dim", "single_dim", "single_mod_dim", "in_dims",
                     "train_double_block_indices", "train_single_block_indices"), _RANKS),
    **dict.fromkeys(("train_lora_ggpo", "ggpo_beta", "ggpo_sigma"), "GGPO regularization"),
    "apply_t5_attn_mask": "T5's attention mask: captions are encoded without it, as the "
                          "inference tools do (sd-scripts' docs advise against the mask)",
    "t5xxl_lr": "a T5 learning rate of its own: T5 trains at optimizer.text_encoder_lr",
    "enable_all_linear": "an option of LoRA_type Flux1 OFT, which this studio does not train",
    "model_type": "Chroma (FLUX.1's architecture without CLIP-L)",
}
# Values of UNSUPPORTED keys that mean "off" beyond empty / 0 / false
OFF_VALUES = {"model_type": ("flux",)}
NOT_NEEDED: dict[str, str] = {
    "flux1_cache_text_encoder_outputs_to_disk": "the text-encoder cache is kept by the trainer",
    "mem_eff_save": "how sd-scripts writes a FLUX.1 DreamBooth file (tensor by tensor, less "
                    "host memory); the file is the same",
}
# the keys kohya_ss passes only with this family's switch
ONLY = (*RULES, "flux1_clip_l", "flux1_t5xxl", "train_blocks", "split_mode",
        "split_qkv", "fp8_base_unet", "single_blocks_to_swap", "double_blocks_to_swap",
        "cpu_offload_checkpointing", "mem_eff_save", "apply_t5_attn_mask", "t5xxl_lr",
        "flux1_cache_text_encoder_outputs_to_disk", "flux_fused_backward_pass",
        "blockwise_fused_optimizers", "model_type", "enable_all_linear",
        "img_attn_dim", "img_mlp_dim", "img_mod_dim", "txt_attn_dim", "txt_mlp_dim",
        "txt_mod_dim", "single_dim", "single_mod_dim", "in_dims", "train_lora_ggpo",
        "ggpo_beta", "ggpo_sigma", "train_double_block_indices",
        "train_single_block_indices")
TIMESTEP_RANGE = False  # sd-scripts' FLUX.1 trainers do not read min / max_timestep

FLUX_SINGLE_BLOCKS = 38
_H = 3072  # FLUX.1's width: a double block's weights and biases, a single block's
FLUX_DOUBLE = 36 * _H * _H + 30 * _H + 4 * 128  # 339,831,296 (+ the q/k RMS norms)
FLUX_SINGLE = 15 * _H * _H + 11 * _H + 2 * 128  # 141,591,808


def flux_units(n: int) -> int:
    """sd-scripts' FLUX.1 ``blocks_to_swap = n`` as our unit count (see the module's notes)."""
    theirs = (n // 2) * FLUX_DOUBLE + (n - n // 2) * 2 * FLUX_SINGLE
    units, held = 0, 0
    while held < theirs:  # the last units first: the single blocks, then the double ones
        held += FLUX_SINGLE if units < FLUX_SINGLE_BLOCKS else FLUX_DOUBLE
        units += 1
    return units


def swap_units(n: int) -> tuple[int, Optional[str]]:
    """sd-scripts' ``blocks_to_swap = n`` as training.blocks_to_swap, with the note."""
    units = flux_units(n)
    return units, (f"sd-scripts swaps {n // 2} double and {(n - n // 2) * 2} single blocks; "
                   f"here the last blocks in forward order go, the singles first: {units} "
                   f"blocks hold at least as many weights")


def _split_qkv(ctx: Ctx, key: str) -> None:
    ctx.skip(key, "the attention's q, k and v each have a LoRA here (diffusers' split "
                  "modules), saved fused in the BFL layout, as sd-scripts' split_qkv = "
                  "true trains them" + ("" if c.to_bool(ctx.data[key]) is True else
                                        "; false (one LoRA on the fused qkv) is not "
                                        "available"))


# keys read by a handler of their own; train_blocks is finish()'s
HANDLERS: dict[str, Callable[[Ctx, str], Any]] = {"train_blocks": lambda ctx, key: None,
                                                   "split_qkv": _split_qkv}


def finish(ctx: Ctx) -> None:
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
