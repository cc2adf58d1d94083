"""Chroma's keys in a kohya_ss GUI config, as the importer (``trainer/importers/kohya/flow.py``)
reads them (torch-free).

kohya_ss trains Chroma from its FLUX.1 tab: ``flux1_checkbox`` (or LoRA_type ``Flux1``) with
``model_type = "chroma"`` (sd-scripts' ``flux_train_network.py --model_type chroma``), so the
switch is FLUX.1's and :data:`SELECT` makes it Chroma's. What sd-scripts' Chroma reads differs
from FLUX.1's: no CLIP-L (``clip_l`` is not read), no guidance input (its docs train with
``--guidance_scale 0.0``), T5's attention mask always applied (``apply_t5_attn_mask`` must be on:
sd-scripts asserts it), and T5 trains only with ``train_t5xxl`` (Chroma has no CLIP-L for
``network.train_text_encoder`` to train: here T5, its only text encoder, trains with it, so a file
without ``train_t5xxl`` imports with the text encoder off, as sd-scripts runs it).

``blocks_to_swap``: sd-scripts swaps N // 2 double and (N - N // 2) x 2 single blocks, as for
FLUX.1; Chroma's blocks hold no modulation: a double block has 24 h^2 weights (two q/k/v, two
outputs, two 4h MLPs), a single block 12 h^2 (q/k/v + the 4h MLP in, the 5h output): two
single blocks' worth each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import Rule

SWITCHES = {"chroma": ("flux1_checkbox",)}  # FLUX.1's tab ...
SELECT = {"model_type": ("chroma",)}  # ... with the value that makes it a Chroma run
LORA_TYPES = ("Flux1",)  # LoRA_type values of networks.lora_flux (which trains Chroma too)
RULES: dict[str, Rule] = {
    "ae": Rule("model.ae", c.to_text),
    "timestep_sampling": Rule("flow.timestep_sampling", c.to_text),
    "discrete_flow_shift": Rule("flow.discrete_flow_shift", c.to_float),
    "model_prediction_type": Rule("flow.model_prediction_type", c.to_text),
    "t5xxl_max_token_length": Rule("model.t5xxl_max_token_length", c.nonzero(c.to_int)),
    "train_t5xxl": Rule("network.train_t5xxl", c.to_bool, ("lora",)),
    "flux1_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", c.only_on),
}
ENCODER_FILES = {"model.t5xxl": ("flux1_t5xxl", "t5xxl")}  # DreamBooth's name first

_RANKS = "per-part ranks and block choices of sd-scripts' lora_flux (one rank for all here)"
UNSUPPORTED: dict[str, str] = {
    "cpu_offload_checkpointing": "sd-scripts' option that keeps the checkpointed activations "
                                 "in host memory; not available here (training.blocks_to_swap "
                                 "moves weights, not activations)",
    **dict.fromkeys(("flux_fused_backward_pass", "blockwise_fused_optimizers"),
                    "fused optimizer steps"),
    **dict.fromkeys(("img_attn_dim", "img_mlp_dim", "txt_attn_dim", "txt_mlp_dim",
                     "single_dim", "in_dims", "train_double_block_indices",
                     "train_single_block_indices"), _RANKS),
    **dict.fromkeys(("train_lora_ggpo", "ggpo_beta", "ggpo_sigma"), "GGPO regularization"),
    "t5xxl_lr": "a T5 learning rate of its own: T5 trains at optimizer.text_encoder_lr",
    "enable_all_linear": "an option of LoRA_type Flux1 OFT, which this studio does not train",
}
_NO_MODULATION = "Chroma's blocks have no modulation layer (its approximator makes them)"
NOT_NEEDED: dict[str, str] = {
    "model_type": "'chroma' picks Chroma (model.model_version = 'chroma')",
    "guidance_scale": "Chroma has no guidance input (sd-scripts trains it with 0.0)",
    **dict.fromkeys(("clip_l", "flux1_clip_l"), "Chroma has no CLIP-L (T5-XXL only)"),
    **dict.fromkeys(("img_mod_dim", "txt_mod_dim", "single_mod_dim"), _NO_MODULATION),
    "flux1_cache_text_encoder_outputs_to_disk": "the text-encoder cache is kept by the trainer",
    "mem_eff_save": "how sd-scripts writes a DreamBooth file (tensor by tensor, less host "
                    "memory); the file is the same",
}
# the keys kohya_ss passes only with the FLUX.1 tab's switch
ONLY = (*RULES, "flux1_clip_l", "flux1_t5xxl", "train_blocks", "split_mode",
        "split_qkv", "fp8_base_unet", "single_blocks_to_swap", "double_blocks_to_swap",
        "cpu_offload_checkpointing", "mem_eff_save", "apply_t5_attn_mask", "t5xxl_lr",
        "flux1_cache_text_encoder_outputs_to_disk", "flux_fused_backward_pass",
        "blockwise_fused_optimizers", "model_type", "enable_all_linear", "guidance_scale",
        "img_attn_dim", "img_mlp_dim", "img_mod_dim", "txt_attn_dim", "txt_mlp_dim",
        "txt_mod_dim", "single_dim", "single_mod_dim", "in_dims", "train_lora_ggpo",
        "ggpo_beta", "ggpo_sigma", "train_double_block_indices", "train_single_block_indices")
TIMESTEP_RANGE = False  # sd-scripts' FLUX.1 / Chroma trainers do not read min / max_timestep

SINGLE_BLOCKS = 38
_H = 3072
DOUBLE = 24 * _H * _H + 18 * _H + 4 * 128  # (+ the q/k RMS norms)
SINGLE = 12 * _H * _H + 8 * _H + 2 * 128


def swap_units(n: int) -> tuple[int, Optional[str]]:
    """sd-scripts' ``blocks_to_swap = n`` as training.blocks_to_swap (the fewest units, the
    single blocks first, that hold at least as many weights), with the note."""
    theirs = (n // 2) * DOUBLE + (n - n // 2) * 2 * SINGLE
    units, held = 0, 0
    while held < theirs:
        held += SINGLE if units < SINGLE_BLOCKS else DOUBLE
        units += 1
    return units, (f"sd-scripts swaps {n // 2} double and {(n - n // 2) * 2} single blocks; "
                   f"here the last blocks in forward order go, the singles first: {units} "
                   f"blocks hold at least as many weights")


def _split_qkv(ctx: Ctx, key: str) -> None:
    ctx.skip(key, "the attention's q, k and v each have a LoRA here (diffusers' split "
                  "modules), saved fused in the BFL layout, as sd-scripts' split_qkv = "
                  "true trains them" + ("" if c.to_bool(ctx.data[key]) is True else
                                        "; false (one LoRA on the fused qkv) is not "
                                        "available"))


def _mask(ctx: Ctx, key: str) -> None:
    on = c.to_bool(ctx.data[key]) is True
    ctx.skip(key, "T5's padding is always masked for Chroma here, as its pipeline does"
             + ("" if on else " (sd-scripts refuses Chroma without apply_t5_attn_mask)"))


# keys read by a handler of their own; train_blocks is finish()'s
HANDLERS: dict[str, Callable[[Ctx, str], Any]] = {"train_blocks": lambda ctx, key: None,
                                                   "split_qkv": _split_qkv,
                                                   "apply_t5_attn_mask": _mask}


def finish(ctx: Ctx) -> None:
    """train_blocks as for FLUX.1 (kohya_ss passes it only as "single" with split_mode), and
    T5 off without train_t5xxl (see the module's notes)."""
    net = ctx.out.get("network", {})
    if ctx.mode == "lora" and net.get("train_text_encoder") and not net.get("train_t5xxl"):
        ctx.set("text_encoder_lr", "network.train_text_encoder", False)
        ctx.note("text_encoder_lr", "sd-scripts trains Chroma's T5, its only text encoder, "
                                    "only with train_t5xxl: network.train_text_encoder off")
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
