"""kohya_ss's memory options: ``fp8_base`` / ``fp8_base_unet`` ->
``model.base_precision = "fp8"`` (and ``model.fp8_text_encoders``), ``blocks_to_swap`` (and
FLUX.1's deprecated ``split_mode``) -> ``training.blocks_to_swap``, as sd-scripts reads them:

- ``fp8_base``: the network trainers (train_network.py, flux_/sd3_train_network.py) store the
  frozen denoiser in fp8, and the text encoders too unless ``fp8_base_unet`` (FLUX.1 / SD3:
  T5-XXL, ``model.fp8_text_encoders`` here; SD's CLIP encoders stay at the compute precision
  here, with a note). The DreamBooth / fine-tune and textual-inversion trainers do not read it.
  kohya_ss passes ``fp8_base_unet`` with ``flux1_checkbox`` only.
- ``blocks_to_swap``: kohya_ss passes it for FLUX.1 and SD3 only (0 is dropped). SD3 swaps its
  last N joint blocks, as here; a family whose blocks count otherwise converts the count in its
  kohya role (``swap_units``: FLUX.1's, trainer/families/flux/kohya.py). Block swap needs
  gradient checkpointing here (sd-scripts swaps without it), which the import turns on, with a
  note.
- ``split_mode`` (FLUX.1, deprecated): sd-scripts sets ``blocks_to_swap = 18`` unless it is
  given. ``single_blocks_to_swap`` / ``double_blocks_to_swap`` are read by flux_train.py
  (DreamBooth) only, as ``double + single // 2`` blocks.
- DreamBooth keeps every block on the device here (block swap moves frozen weights; sd-scripts
  swaps a full fine-tune's blocks with its fused backward pass; the one here frees gradients,
  not weights).
"""

from __future__ import annotations

from trainer.families import spec
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.families import role_value
from trainer.importers.kohya.flow import BOTH, MEMORY_KEYS, family_of, not_passed
from trainer.importers.kohya.report import Ctx

KEYS = MEMORY_KEYS  # derived.DERIVED: the keys memory() records
SPLIT_MODE_BLOCKS = 18  # sd-scripts' flux_train_network.py for --split_mode
_FULL_FINE_TUNE = ("block swap for a full fine-tune (sd-scripts swaps DreamBooth's blocks with "
                   "its fused backward pass, which steps each block while it is on the "
                   "device): here DreamBooth keeps every block on the device; "
                   "training.blocks_to_swap is for LoRA")


def _passed(key: str, family: str | None) -> bool:
    """Whether kohya_ss passes ``key`` with the family's switch."""
    return family is not None and (key in BOTH or key in role_value(family, "ONLY", ()))


def _count(ctx: Ctx, key: str) -> int:
    value = ctx.num(key) if key in ctx.data else None
    return int(value) if value and value > 0 else 0


def memory(ctx: Ctx) -> None:
    """Every memory key of the file: mapped, or reported with the reason."""
    try:
        family = family_of(ctx.data)
    except ValueError as exc:  # flow reports it too
        ctx.problems.append(str(exc))
        return
    _fp8(ctx, family)
    _swap(ctx, family)


def _fp8(ctx: Ctx, family: str | None) -> None:
    base = "fp8_base" in ctx.data and c.to_bool(ctx.raw("fp8_base")) is True
    unet = "fp8_base_unet" in ctx.data and c.to_bool(ctx.raw("fp8_base_unet")) is True
    if "fp8_base_unet" in ctx.data and not _passed("fp8_base_unet", family):
        ctx.skip("fp8_base_unet", not_passed("fp8_base_unet"))
        unet = False
    for key, on in (("fp8_base", base), ("fp8_base_unet", unet)):
        if key not in ctx.data or key in ctx.report.keys():
            continue
        if not on:
            ctx.unset(key)
        elif ctx.mode == "dreambooth":
            ctx.skip(key, "sd-scripts' DreamBooth and fine-tune trainers do not read it: they "
                          "train the base weights, which stay at full precision")
        elif ctx.mode == "textual_inversion":
            ctx.skip(key, "sd-scripts' textual-inversion trainers do not read it")
        else:
            ctx.set(key, "model.base_precision", "fp8")
    if ctx.mode != "lora" or not (base or unet):
        return
    if family is not None and spec(family).has_t5 and base and not unet:
        ctx.set("fp8_base", "model.fp8_text_encoders", True)
        ctx.note("fp8_base", "the denoiser and the T5-XXL text encoder stored in fp8 "
                             "(model.base_precision, model.fp8_text_encoders), as sd-scripts "
                             "does without fp8_base_unet")
    elif family is None and base:
        ctx.note("fp8_base", "the UNet's frozen weights are stored in fp8; the CLIP text "
                             "encoders stay at the compute precision here (sd-scripts stores "
                             "them in fp8 as well): 0.1 GB more here for SD 1.x / 2.x, 0.7 GB "
                             "for SDXL")


SWAP_KEYS = ("blocks_to_swap", "split_mode", "double_blocks_to_swap", "single_blocks_to_swap")
LEGACY = ("double_blocks_to_swap", "single_blocks_to_swap")


def _swap(ctx: Ctx, family: str | None) -> None:
    keys = [k for k in SWAP_KEYS if k in ctx.data]
    for key in keys:
        if not _passed(key, family):
            ctx.skip(key, not_passed(key))
    keys = [k for k in keys if k not in ctx.report.keys()]
    if not keys:
        return
    n = _count(ctx, "blocks_to_swap") if "blocks_to_swap" in keys else 0
    split = "split_mode" in keys and c.to_bool(ctx.raw("split_mode")) is True
    legacy = {k: _count(ctx, k) for k in LEGACY if k in keys}
    for key in keys:  # off in the file (kohya_ss drops 0, "" and false)
        if {"blocks_to_swap": n, "split_mode": split}.get(key, legacy.get(key)) in (0, False):
            ctx.unset(key)
    if ctx.mode == "dreambooth":
        _swap_dreambooth(ctx, n, split, legacy)
    else:
        _swap_network(ctx, family, n, split, legacy)


def _swap_dreambooth(ctx: Ctx, n: int, split: bool, legacy: dict[str, int]) -> None:
    """flux_train.py / sd3_train.py: blocks_to_swap, else double + single // 2 (flux_train)."""
    if split:
        ctx.skip("split_mode", "a LoRA option (sd-scripts' flux_train_network.py); its "
                               "DreamBooth trainer does not read it")
    if n:
        ctx.refuse("blocks_to_swap", _FULL_FINE_TUNE)
    counted = legacy.get("double_blocks_to_swap", 0) + legacy.get("single_blocks_to_swap", 0) // 2
    for key in (k for k, v in legacy.items() if v):
        ctx.skip(key, "blocks_to_swap is set: flux_train.py ignores it then") if n else \
            ctx.refuse(key, f"{_FULL_FINE_TUNE} (flux_train.py swaps {counted} blocks for it)")


def _swap_network(ctx: Ctx, family: str | None, n: int, split: bool,
                  legacy: dict[str, int]) -> None:
    for key in (k for k, v in legacy.items() if v):
        ctx.skip(key, "read by sd-scripts' FLUX.1 DreamBooth (flux_train.py) only, deprecated "
                      "there; its LoRA trainer reads blocks_to_swap")
    owner = "blocks_to_swap"
    if split and n:
        ctx.skip("split_mode", "blocks_to_swap is set: sd-scripts ignores split_mode then")
    elif split:
        owner, n = "split_mode", SPLIT_MODE_BLOCKS
        ctx.note(owner, f"deprecated in sd-scripts, which swaps {n} blocks for it "
                        f"(blocks_to_swap = {n}); train_blocks = 'single' as kohya_ss sets it")
    if not n:
        return
    if ctx.mode != "lora":
        ctx.skip(owner, f"a LoRA / fine-tune option of sd-scripts; not used in {ctx.mode} mode")
        return
    convert = role_value(family, "swap_units")
    units, note = convert(n) if convert else (n, None)
    ctx.set(owner, "training.blocks_to_swap", units)
    if note:
        ctx.note(owner, note)
    if ctx.out.get("training", {}).get("gradient_checkpointing") is not True:
        ctx.set(owner, "training.gradient_checkpointing", True)
        ctx.note(owner, "training.gradient_checkpointing turned on: block swap needs it here "
                        "(the backward pass brings each block back as it recomputes it)")
