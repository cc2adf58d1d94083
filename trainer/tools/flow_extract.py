"""Extract a FLUX.1 / SD 3.5 LoRA from a fine-tuned model: the family's layers and file form.

The layers are those the family's LoRA trains (:func:`trainer.tools.flow_targets.lora_targets`:
FLUX.1's double and single blocks and CLIP-L / T5, SD 3.5's joint blocks and CLIP-L / CLIP-G),
each difference ``W_tuned - W_base`` truncated to the rank by its SVD
(:mod:`trainer.tools.svd`), and the file is the one the trainer writes for the family:

- FLUX.1: sd-scripts' kohya keys on BFL's layout (:mod:`trainer.families.flux.lora`), ``alpha =
  rank``. A fused layer (``img_attn.qkv``, ``txt_attn.qkv``, ``linear1``) is extracted part by
  part (diffusers' q, k, v, the MLP's input), each at the rank, and written block-diagonally
  (:mod:`trainer.tools.fused`) with ``alpha`` = parts x rank: what a trained file holds, which
  diffusers splits back exactly.
- SD 3.5: the ``transformer.*`` / ``text_encoder(_2).*`` form (:mod:`trainer.families.sd3.lora`),
  the update wholly in ``lora_B @ lora_A``, no alpha.

A text encoder whose weights changed by no more than ``min_diff`` is left out, as for the SD
families, and so is a transformer layer that did not change at all (a DreamBooth run trains
every transformer layer; a fine-tune of some blocks leaves the others exactly equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import text_encoder_module_path
from trainer.families import role
from trainer.tools import fused, svd
from trainer.tools.common import Progress, ToolError
from trainer.tools.flow_targets import TRANSFORMER, lora_targets
from trainer.tools.targets import Target

PEFT_PREFIXES = {TRANSFORMER: "transformer", "te1": "text_encoder", "te2": "text_encoder_2"}
Module = tuple[str, int, float, float]  # name, rank, largest change, share of the norm kept


def pairs(base: Any, tuned: Any) -> list[tuple[Target, Target]]:
    """(base layer, tuned layer) of every layer the family's LoRA trains."""
    tuned_layers = {t.name: t for t in lora_targets(tuned)}
    out = []
    for target in lora_targets(base):
        other = tuned_layers.get(target.name)
        if other is None or other.weight().shape != target.weight().shape:
            raise ToolError(f"{target.name}: the tuned model has no layer of this shape; it "
                            f"must be a fine-tune of the base model (same family and size)")
        out.append((target, other))
    return out


def _difference(pair: tuple[Target, Target]) -> torch.Tensor:
    return pair[1].weight().detach().float() - pair[0].weight().detach().float()


def _truncate(diff: torch.Tensor, rank: int, scale: float, quantile: Optional[float]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(up, down, singular values, k): ``up @ down`` = the rank-k truncation x ``scale``."""
    u, s, vh = svd.full_svd(diff)
    k = min(rank, len(s))
    up, down = svd.split_factors(u, s * scale, vh, k)
    if quantile is not None:
        up, down = svd.clamp_quantile(up, down, quantile)
    return up, down, s, k


def _kept(values: list[tuple[torch.Tensor, int]]) -> float:
    every = torch.cat([s for s, _ in values]).double()
    kept = torch.cat([s[:k] for s, k in values]).double()
    total = every.pow(2).sum()
    return float((kept.pow(2).sum() / total).sqrt()) if total > 0 else 1.0


def kohya_layer(target: Target, diff: torch.Tensor, rank: int, quantile: Optional[float]
                ) -> tuple[dict[str, torch.Tensor], int, float]:
    """FLUX.1's tensors of one layer (by suffix), its rank and the norm kept; ``alpha / R`` is
    1 where every part reaches the rank (a smaller part carries ``k / rank``)."""
    rows = [layer.weight.shape[0] for layer in target.layers]
    alpha = float(len(rows) * rank)
    found = []
    start = 0
    for count in rows:
        found.append(svd.full_svd(diff[start:start + count]))
        start += count
    total = sum(min(rank, len(s)) for _, s, _ in found)
    parts, values = [], []
    for u, s, vh in found:
        k = min(rank, len(s))
        up, down = svd.split_factors(u, s * (total / alpha), vh, k)
        if quantile is not None:
            up, down = svd.clamp_quantile(up, down, quantile)
        parts.append((up, down))
        values.append((s, k))
    up, down = fused.fuse(parts, rows) if len(parts) > 1 else parts[0]
    return ({"lora_up.weight": up, "lora_down.weight": down, "alpha": torch.tensor(alpha)},
            total, _kept(values))


def peft_layer(target: Target, diff: torch.Tensor, rank: int, quantile: Optional[float]
               ) -> tuple[dict[str, torch.Tensor], int, float]:
    """SD 3.5's ``<prefix>.<path>.lora_A`` / ``lora_B`` of one layer (keys in full)."""
    up, down, s, k = _truncate(diff, rank, 1.0, quantile)
    path = target.path if target.part == TRANSFORMER else text_encoder_module_path(target.path)
    key = f"{PEFT_PREFIXES[target.part]}.{path}"
    return ({f"{key}.lora_A.weight": down, f"{key}.lora_B.weight": up}, k,
            _kept([(s, k)]))


def flow_lora_tensors(base: Any, tuned: Any, rank: int, min_diff: float,
                      quantile: Optional[float], dtype: torch.dtype, progress: Progress
                      ) -> tuple[dict[str, torch.Tensor], list[Module], list[str]]:
    """(tensors, extracted modules, what was left out and why) of the family's LoRA file."""
    found = pairs(base, tuned)
    diffs = [_difference(p) for p in found]
    largest: dict[str, float] = {}
    for (target, _), diff in zip(found, diffs):
        largest[target.part] = max(largest.get(target.part, 0.0), float(diff.abs().max()))
    quiet = {p for p, m in largest.items() if p != TRANSFORMER and m <= min_diff}
    skipped = [f"{p}: largest change {largest[p]:.2g} <= min_diff {min_diff:g}" for p in quiet]
    form = role(base.version, "targets").FILE_FORM  # trainer/families/<folder>/targets.py
    extracted = {"kohya": kohya_layer, "peft": peft_layer}[form]
    tensors: dict[str, torch.Tensor] = {}
    modules: list[Module] = []
    unchanged = 0
    for i, ((target, _), diff) in enumerate(zip(found, diffs)):
        progress(i + 1, len(found), "extracting")
        if target.part in quiet:
            continue
        change = float(diff.abs().max())
        if change == 0 and target.part == TRANSFORMER:  # nothing to add; a text encoder
            unchanged += 1  # keeps every layer: diffusers 0.42 infers the form of a kohya
            continue  # CLIP LoRA from its out_proj keys ("to_out_lora"), and fails without
        layer, k, kept = extracted(target, diff, rank, quantile)
        if form == "kohya":  # tensors by suffix under the kohya name
            layer = {f"{target.name}.{suffix}": t for suffix, t in layer.items()}
        tensors.update({key: t.to(dtype).contiguous() for key, t in layer.items()})
        modules.append((target.name, k, change, kept))
    if unchanged:
        skipped.append(f"{unchanged} transformer layers that did not change")
    if not tensors:
        raise ToolError("the tuned model's LoRA layers equal the base model's: nothing to "
                        "extract")
    return tensors, modules, skipped


def flow_metadata(base: Any, opts: Any) -> dict[str, str]:
    """sd-scripts' ``ss_*`` of an extracted file with the family's version and architecture
    (trainer/families/common/mmdit_lora_file.py adds them, and the hashes when it writes the
    file)."""
    return {
        "ss_network_dim": str(opts.rank),
        "ss_network_alpha": str(float(opts.rank)),
        "ss_network_args": "{}",
        "ss_sd_model_name": Path(opts.base).name,
        "ss_training_comment": f"extracted by SVD at rank {opts.rank} from "
                               f"{Path(opts.tuned).name} minus {Path(opts.base).name}",
        "modelspec.title": Path(opts.save_to).stem,
    }


def save_flow_extract(base: Any, opts: Any, tensors: dict[str, torch.Tensor]) -> None:
    from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora

    own = getattr(role(base.version, "lora"), "save_lora_file", None)
    if own is not None:  # a family that writes its file's metadata itself
        own(Path(opts.save_to).expanduser(), tensors, base, flow_metadata(base, opts))
        return
    save_flow_lora(Path(opts.save_to).expanduser(), tensors,
                   FlowLoraInfo(base.version, base.variant), flow_metadata(base, opts))
