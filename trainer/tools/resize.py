"""Lower a LoRA's rank by SVD, to a fixed rank or by the energy kept per module.

For each LoRA module, ``up @ down`` is decomposed (:func:`trainer.tools.svd.lowrank_svd`, exact
and cheap for a product of thin factors), truncated to the chosen rank k and split back into
``up' [out, k]`` and ``down' [k, in]``, so that the new update is the truncation of the old one.
As in sd-scripts' ``resize_lora.py``, the new alpha keeps the scale: ``alpha / r * R`` with R
the rank asked for. With a dynamic method k differs between modules, and a module whose k is not
R carries ``k / R`` in its factors instead of its own alpha: every module of a group (linear,
convolution) then has the same alpha, because diffusers 0.42's kohya loader gives an attention
layer whose alpha differs from the others the common alpha. 3x3 convolution modules (LoCon)
take ``conv_rank``; a 1x1 convolution (SD 1.x's ``proj_in``) is trained with the linear rank
and resized with it.

A newer family's file written by a peer (musubi-tuner's, ai-toolkit's, diffusers' form: the
family's lora role's ``own_form_tensors``, :mod:`trainer.families.common.lora_forms`) is written
in the family's own form, the one ComfyUI loads. FLUX.1's and SD 3.5's files stay in their
form: SD 3.5's ``transformer.*`` (peft) modules are written back under their keys with the scale
folded into ``lora_B`` and no alpha (:mod:`trainer.families.sd3.lora`). FLUX.1's (and
sd-scripts' SD3, Z-Image's native qkv) fused layers written
block-diagonally (:mod:`trainer.tools.fused`: q, k, v and linear1's MLP part, each with its own
rank) are resized part by part to the rank asked for and fused again, alpha = the file's
``alpha / r`` x the new total rank; a dense fused layer (sd-scripts' default) is one module.

The file keeps its metadata with ``ss_network_dim`` / ``ss_network_alpha`` updated (``Dynamic``
for a dynamic method, as sd-scripts writes), the conv rank in ``ss_network_args``, a line in
``ss_training_comment``, and fresh ``sshs_*`` / ``modelspec.hash_sha256`` hashes.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from trainer.tools import fused, svd
from trainer.tools.common import DTYPES, Progress, ToolError, no_progress
from trainer.tools.inspect import detect_family
from trainer.tools.lora_file import LoraModule, in_own_form, read_lora
from trainer.tools.options import ResizeOptions

PEFT_NAMES = {"lora_down.weight": "lora_A.weight", "lora_up.weight": "lora_B.weight"}


@dataclass
class ResizedModule:
    name: str
    conv: bool
    old_rank: int  # a fused FLUX.1 / SD3 module (``parts`` > 1): the largest part's
    new_rank: int
    alpha: float
    fro_kept: float  # share of the update's Frobenius norm kept
    sum_kept: float  # share of the sum of its singular values kept
    error: float  # Frobenius norm of (old update - new update), alpha / rank included
    parts: int = 1  # the layers diffusers splits it into, each resized on its own


@dataclass
class ResizeReport:
    path: str
    save_to: str
    modules: list[ResizedModule]
    dim: str  # ss_network_dim as written
    alpha: str
    seconds: float
    kept_as_is: list[str] = field(default_factory=list)  # modules of another type (LoHa, ...)

    @property
    def mean_fro_kept(self) -> float:
        return sum(m.fro_kept for m in self.modules) / max(1, len(self.modules))


def _factors(module: LoraModule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD of the module's unscaled update ``up @ down`` as a 2-D matrix."""
    t = module.tensors
    if "lora_mid.weight" in t:  # Tucker form: decompose the whole update
        return svd.full_svd(module.product().flatten(1))
    return svd.lowrank_svd(t["lora_up.weight"].flatten(1).float(),
                           t["lora_down.weight"].flatten(1).float())


def resize_module(module: LoraModule, rank: int, method: Optional[str], param: Optional[float],
                  dtype: torch.dtype, alpha: Optional[float]) -> tuple[dict[str, torch.Tensor],
                                                                    ResizedModule]:
    """The module's new tensors (by suffix) with the given ``alpha``, and what was kept;
    ``alpha=None``: the factors carry the whole scale and no alpha is written (the peft form of
    SD 3.5 files, :mod:`trainer.families.sd3.lora`)."""
    u, s, vh = _factors(module)
    s = s[: module.rank]  # a resize never raises the rank (Tucker: the rest are zeros)
    k = svd.choose_rank(s, min(rank, module.rank), method, param)
    if alpha is None:
        factor = module.scale
    else:
        alpha = float(torch.tensor(alpha, dtype=dtype))  # as stored, so the factors match it
        factor = module.scale * k / alpha if alpha else 0.0
    up, down = svd.split_factors(u, s * factor, vh, k)
    old_down = module.tensors["lora_down.weight"]
    out_shape = module.tensors["lora_up.weight"].shape
    kernel = old_down.shape[2:] if "lora_mid.weight" not in module.tensors else (
        module.tensors["lora_mid.weight"].shape[2:])
    tensors = {
        "lora_down.weight": down.reshape(k, -1, *kernel).to(dtype).contiguous(),
        "lora_up.weight": up.reshape(out_shape[0], k, *out_shape[2:]).to(dtype).contiguous(),
    }
    if alpha is not None:
        tensors["alpha"] = torch.tensor(alpha, dtype=dtype)
    fro, total = svd.kept_energy(s, k)
    error = svd.discarded_norm(s, k) * abs(module.scale)
    return tensors, ResizedModule(module.name, module.is_conv, module.rank, k,
                                  float(k) if alpha is None else alpha, fro, total, error)


def fused_blocks(module: LoraModule) -> Optional[tuple[list[int], list[fused.Block]]]:
    """(part rows, blocks) of a fused FLUX.1 / SD3 module written block-diagonally
    (:mod:`trainer.tools.fused`), else None."""
    t = module.tensors
    if module.peft_key or "lora_mid.weight" in t or t["lora_up.weight"].dim() != 2:
        return None
    up, down = t["lora_up.weight"], t["lora_down.weight"]
    rows = fused.part_rows(module.name, up.shape[0], down.shape[1])
    blocks = fused.block_parts(up, rows) if rows else None
    return (rows, blocks) if blocks else None


def resize_fused(module: LoraModule, rows: list[int], blocks: list[fused.Block], rank: int,
                 method: Optional[str], param: Optional[float], dtype: torch.dtype,
                 scale: float) -> tuple[dict[str, torch.Tensor], ResizedModule]:
    """A fused module resized part by part (each to ``rank``, or by the dynamic method) and
    written block-diagonally again; its alpha is ``scale`` x the new total rank, so that
    ``alpha / rank`` stays the file's common scale, as the trainer writes it."""
    up = module.tensors["lora_up.weight"].float()
    down = module.tensors["lora_down.weight"].float()
    found = []  # (u, s, vh, k) per part; k = 0 for a part without an update
    for block in blocks:
        if not len(block.cols):
            found.append((None, torch.zeros(0), None, 0))
            continue
        u, s, vh = svd.lowrank_svd(up[block.rows][:, block.cols], down[block.cols])
        s = s[: len(block.cols)]
        found.append((u, s, vh, svd.choose_rank(s, min(rank, len(block.cols)), method, param)))
    total = sum(k for *_, k in found)
    alpha = float(torch.tensor(scale * total, dtype=dtype))
    factor = module.scale * total / alpha if alpha else 0.0
    parts = []
    for (u, s, vh, k), count in zip(found, rows):
        if not k:
            parts.append((up.new_zeros(count, 0), down.new_zeros(0, down.shape[1])))
        else:
            parts.append(svd.split_factors(u, s * factor, vh, k))
    new_up, new_down = fused.fuse(parts, rows)
    tensors = {"lora_down.weight": new_down.to(dtype).contiguous(),
               "lora_up.weight": new_up.to(dtype).contiguous(),
               "alpha": torch.tensor(alpha, dtype=dtype)}
    every = torch.cat([s for _, s, _, _ in found]).double()
    kept = torch.cat([s[:k] for _, s, _, k in found]).double()
    fro = float(kept.pow(2).sum().sqrt() / every.pow(2).sum().sqrt()) if every.any() else 1.0
    share = float(kept.sum() / every.sum()) if every.any() else 1.0
    error = float(sum(svd.discarded_norm(s, k) ** 2 for _, s, _, k in found) ** 0.5)
    return tensors, ResizedModule(module.name, False, max(len(b.cols) for b in blocks),
                                  max(k for *_, k in found), alpha, fro, share,
                                  error * abs(module.scale), parts=len(blocks))


def _common(values: list[float]) -> Optional[float]:
    return collections.Counter(values).most_common(1)[0][0] if values else None


def resized_metadata(metadata: dict[str, str], modules: list[ResizedModule],
                     opts: ResizeOptions) -> dict[str, str]:
    """The input's metadata with the new rank, alpha, conv rank and a comment."""
    out = dict(metadata)
    old = max(m.old_rank for m in modules)
    linear = [m for m in modules if not m.conv and m.parts == 1]  # a fused module's alpha
    conv = [m for m in modules if m.conv]  # counts its parts' ranks
    out["ss_network_alpha"] = str(_common([m.alpha for m in linear or modules]))
    if opts.dynamic_method:
        out["ss_network_dim"] = "Dynamic"
        note = f"resized dynamically by {opts.dynamic_method} {opts.dynamic_param:g} from {old}"
    else:
        out["ss_network_dim"] = str(opts.rank)
        note = f"rank resized from {old} to {opts.rank}"
    try:
        args = json.loads(out.get("ss_network_args") or "{}")
    except ValueError:
        args = None
    if isinstance(args, dict) and conv and "conv_dim" in args:
        args["conv_dim"] = str(max(m.new_rank for m in conv))
        args["conv_alpha"] = str(_common([m.alpha for m in conv]))
        out["ss_network_args"] = json.dumps(args)
    comment = out.get("ss_training_comment")
    out["ss_training_comment"] = note + (f"; {comment}" if comment not in (None, "None") else "")
    out.pop("sshs_model_hash", None)
    out.pop("sshs_legacy_hash", None)
    return out


def group_alphas(modules: list[LoraModule], opts: ResizeOptions) -> dict[bool, float]:
    """The new alpha of the linear (False) and the 3x3 convolution (True) modules: their most
    common scale ``alpha / rank`` times the rank asked for."""
    out = {}
    for conv in (False, True):
        scales = [m.scale for m in modules if m.is_conv == conv and m.kind == "lora"]
        rank = opts.conv_rank if conv and opts.conv_rank else opts.rank
        if scales:
            out[conv] = _common(scales) * rank
    return out


def resize(opts: ResizeOptions, progress: Progress = no_progress) -> ResizeReport:
    """Resize ``opts.path`` and write ``opts.save_to``."""
    from trainer.export.hashes import add_hashes
    from trainer.system.safe_write import save_safetensors_atomic

    started = time.perf_counter()
    lora = read_lora(opts.path)
    if lora.embedding:
        raise ToolError(f"{lora.path}: an embedding has no rank to resize")
    lora = in_own_form(lora, detect_family(lora)[0])  # a peer's form: written as the family's
    dtype = DTYPES[opts.precision] if opts.precision else (lora.dtype or torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    done: list[ResizedModule] = []
    alphas = group_alphas(list(lora.modules.values()), opts)
    as_is = []
    for i, module in enumerate(lora.modules.values()):
        if module.kind != "lora":  # LoHa, LoKr, full: copied as they are, as sd-scripts does
            tensors.update({f"{module.name}.{k}": v.to(dtype) if v.is_floating_point() else v
                            for k, v in module.tensors.items()})
            as_is.append(module.name)
            continue
        rank = opts.conv_rank if module.is_conv and opts.conv_rank else opts.rank
        method, param = opts.dynamic_method, opts.dynamic_param
        split = fused_blocks(module)
        if module.peft_key:  # SD 3.5's transformer.* form: written back so, alpha folded
            new, info = resize_module(module, rank, method, param, dtype, None)
            tensors.update({f"{module.peft_key}.{PEFT_NAMES[k]}": v for k, v in new.items()})
        elif split:  # FLUX.1's fused qkv / linear1: one rank per part, as the trainer writes
            new, info = resize_fused(module, *split, rank, method, param, dtype,
                                     alphas.get(False, rank) / opts.rank)
            tensors.update({f"{module.name}.{k}": v for k, v in new.items()})
        else:
            new, info = resize_module(module, rank, method, param, dtype,
                                      alphas.get(module.is_conv, 1.0))
            tensors.update({f"{module.name}.{k}": v for k, v in new.items()})
        done.append(info)
        progress(i + 1, len(lora.modules), "resizing")
    if not done:
        raise ToolError(f"{lora.path}: no LoRA (lora_down / lora_up) modules to resize")
    metadata = add_hashes(resized_metadata(lora.metadata, done, opts), tensors)
    save_safetensors_atomic(Path(opts.save_to).expanduser(), tensors, metadata)
    return ResizeReport(str(lora.path), opts.save_to, done, metadata["ss_network_dim"],
                        metadata["ss_network_alpha"], time.perf_counter() - started, as_is)


def format_resize(report: ResizeReport) -> str:
    kept = [m.fro_kept for m in report.modules]
    lines = [f"Resized {report.path} -> {report.save_to} in {report.seconds:.1f} s",
             f"network dim {report.dim}, alpha {report.alpha}; Frobenius norm kept: mean "
             f"{report.mean_fro_kept:.1%}, lowest {min(kept):.1%}"
             + (f"; {len(report.kept_as_is)} modules of another type copied as they are"
                if report.kept_as_is else ""),
             f"{'module':<72} {'rank':>9} {'alpha':>7} {'fro kept':>9} {'sum kept':>9}"]
    for m in report.modules:
        rank = f"{m.old_rank}->{m.new_rank}" + (f" x{m.parts}" if m.parts > 1 else "")
        lines.append(f"{m.name:<72} {rank:>9} {m.alpha:>7.3g} "
                     f"{m.fro_kept:>9.1%} {m.sum_kept:>9.1%}")
    return "\n".join(lines)
