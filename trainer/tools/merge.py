"""Merge LoRAs into a base model and save it as a checkpoint and/or a diffusers folder.

Each LoRA module's update (:meth:`LoraModule.delta`: ``up @ down * alpha / r`` for LoRA, the
LyCORIS forms for LoHa / LoKr / full) times the LoRA's weight is added to the layer that its
kohya name designates (:mod:`trainer.tools.targets`): ``W <- W + weight * delta``, computed in
fp32 and stored in the model's dtype. This is what sd-scripts' ``merge_lora.py`` and diffusers'
``fuse_lora`` do; the update is computed here, not through diffusers, so that LyCORIS files merge
too and so that the tests can hold the result to diffusers' loader as an independent reference.

FLUX.1 and SD 3.5 bases (a diffusers folder, or a single file the loader reads) take their
families' LoRA files: FLUX.1's kohya keys on BFL's layout, whose fused layers add their rows to
diffusers' split ones, SD 3.5's ``transformer.*`` and sd-scripts' SD3 keys, diffusers' form of
either (:mod:`trainer.tools.flow_targets`); they are saved as their pipeline folder and / or one
file in the family's original layout (:mod:`trainer.families.common.mmdit_checkpoint`).

The checkpoint is written in the original single-file layout (:mod:`trainer.families.sd.checkpoint`)
with ``modelspec.*`` metadata whose ``merged_from`` lists the base and the LoRAs (with their
weights), as sd-scripts fills it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.families import is_flow
from trainer.tools.common import (
    DTYPES,
    Progress,
    ToolError,
    load_model,
    model_modelspec,
    no_progress,
)
from trainer.tools.flow_targets import TRANSFORMER, family_name_table
from trainer.tools.lora_file import LoraFile, LoraModule, read_lora
from trainer.tools.options import MergeOptions
from trainer.tools.targets import Target, swap_halves


@dataclass
class MergedLora:
    path: str
    weight: float
    applied: int = 0
    unmatched: list[str] = field(default_factory=list)


@dataclass
class MergeReport:
    base: str
    family: str
    loras: list[MergedLora]
    outputs: list[str]
    seconds: dict[str, float]


def fit(delta: torch.Tensor, weight: torch.Tensor, name: str) -> torch.Tensor:
    """``delta`` in the layer weight's shape: a linear LoRA on a 1x1 convolution (or the
    reverse) and the flat LyCORIS updates are reshaped; anything else is an error."""
    if delta.shape == weight.shape:
        return delta
    if delta.numel() == weight.numel():
        return delta.reshape(weight.shape)
    raise ToolError(f"{name}: the LoRA's update is {tuple(delta.shape)} but the model's layer "
                    f"is {tuple(weight.shape)}: a LoRA for another model family?")


@torch.no_grad()
def add_module(target: Target, module: LoraModule, weight: float) -> None:
    """``W <- W + weight * delta`` (and the bias of a full-weight module). A fused target
    (FLUX.1 / SD3: :mod:`trainer.tools.flow_targets`) gets each diffusers layer its rows of
    the update, the halves swapped back where the original layout swaps them."""
    delta = fit(module.delta(), target.weight(), module.name)
    if target.swap:
        delta = swap_halves(delta)
    start = 0
    for layer in target.layers:
        rows = delta[start:start + layer.weight.shape[0]]
        start += layer.weight.shape[0]
        if layer.weight.dtype == torch.float32:
            layer.weight.add_(rows, alpha=weight)
        else:
            layer.weight.copy_((layer.weight.float() + weight * rows).to(layer.weight.dtype))
    layer = target.module
    if "diff_b" in module.tensors and layer.bias is not None and not target.pieces:
        bias = module.tensors["diff_b"].float().reshape(layer.bias.shape)
        layer.bias.copy_((layer.bias.float() + weight * bias).to(layer.bias.dtype))


def apply_lora(table: dict[str, Target], lora: LoraFile, weight: float,
               progress: Progress = no_progress, done: int = 0, total: int = 0) -> MergedLora:
    """Add one LoRA file to the model whose :func:`name_table` is ``table``."""
    merged = MergedLora(str(lora.path), weight)
    for i, (name, module) in enumerate(lora.modules.items()):
        target = table.get(name)
        if target is None:
            merged.unmatched.append(name)
        else:
            add_module(target, module, weight)
            merged.applied += 1
        progress(done + i + 1, total, f"merging {lora.path.name}")
    if not merged.applied:
        raise ToolError(f"{lora.path}: none of its {len(lora.modules)} modules is a layer of "
                        f"the base model (names such as {next(iter(lora.modules))}): a LoRA "
                        f"for another model family?")
    return merged


def title_of(path: Path, metadata: dict[str, str]) -> str:
    return metadata.get("modelspec.title") or metadata.get("ss_output_name") or path.stem


def merged_metadata(model: Any, base: str, loras: list[tuple[LoraFile, float]],
                    title: str) -> dict[str, str]:
    """``modelspec.*`` of the merged checkpoint, ``merged_from`` = base, LoRA (weight), ..."""
    sources = [Path(base).stem if Path(base).is_file() else Path(base).name]
    sources += [f"{title_of(f.path, f.metadata)} ({w:g})" for f, w in loras]
    if is_flow(model.version):  # the file's other modelspec keys: flow_checkpoint
        return {"modelspec.title": title, "modelspec.merged_from": ", ".join(sources)}
    meta = model_modelspec(model, title, adapter=None)
    meta["modelspec.merged_from"] = ", ".join(sources)
    return meta


def save_flow_merged(model: Any, opts: MergeOptions, metadata: dict[str, str],
                     text_merged: bool) -> list[str]:
    """A merged FLUX.1 / SD 3.5 model as one file in the original layout (BFL's, Stability's:
    trainer/families/common/mmdit_checkpoint.py) and / or its diffusers pipeline folder. The file
    holds what the model ships as (FLUX.1 the transformer, SD 3.5 the transformer and the VAE),
    and every component when a text encoder was merged, as DreamBooth writes it."""
    from trainer.families import family_of
    from trainer.families.sd.pipeline_folder import save_flow_pipeline_folder
    from trainer.methods.dreambooth import (
        FLOW_PARTS,
        flow_checkpoint_family,
        flow_checkpoint_writer,
    )

    dtype, outputs = DTYPES[opts.precision], []
    encoders = {name: enc for name, enc, _ in family_of(model).text_encoders(model)}
    if opts.save_to:
        # without a merged text encoder, the parts the family's released file holds (the
        # default of trainer/families/common/mmdit_checkpoint.py's flow_state_dict)
        parts = FLOW_PARTS[model.version] if text_merged else None
        components = {"transformer": model.denoiser, "vae": model.vae, **encoders}
        flow_checkpoint_writer(model)(Path(opts.save_to).expanduser(), components,
                                      flow_checkpoint_family(model), metadata, parts=parts,
                                      dtype=dtype)
        outputs.append(opts.save_to)
    if opts.save_folder:
        save_flow_pipeline_folder(Path(opts.save_folder).expanduser(), model, model.denoiser,
                                  encoders, dtype)
        outputs.append(opts.save_folder)
    return outputs


def save_merged(model: Any, opts: MergeOptions, metadata: dict[str, str]) -> list[str]:
    from trainer.families.sd.checkpoint import save_checkpoint
    from trainer.families.sd.pipeline_folder import save_pipeline_folder

    dtype, outputs = DTYPES[opts.precision], []
    if opts.save_to:
        save_checkpoint(Path(opts.save_to).expanduser(), model.denoiser, model.vae,
                        model.text_encoder, text_encoder_2=model.text_encoder_2,
                        family=model.version, dtype=dtype, metadata=metadata)
        outputs.append(opts.save_to)
    if opts.save_folder:
        save_pipeline_folder(Path(opts.save_folder).expanduser(), model, model.denoiser,
                             model.text_encoder, dtype, text_encoder_2=model.text_encoder_2)
        outputs.append(opts.save_folder)
    return outputs


def merge(opts: MergeOptions, progress: Progress = no_progress) -> MergeReport:
    """Apply ``opts.loras`` with ``opts.weights`` to ``opts.base`` and save the result."""
    started = time.perf_counter()
    files = [read_lora(p) for p in opts.loras]
    for f in files:
        if f.embedding:
            raise ToolError(f"{f.path}: a textual-inversion embedding, not a LoRA; load it "
                            f"beside the model instead of merging it")
    weights = opts.weights or [1.0] * len(files)
    progress(0, 1, "loading the base model")
    model = load_model(opts.base, opts.config_dir)
    loaded = time.perf_counter()
    table = family_name_table(model)
    total, done, merged = sum(len(f.modules) for f in files), 0, []
    for f, w in zip(files, weights):
        merged.append(apply_lora(table, f, w, progress, done, total))
        done += len(f.modules)
    applied = time.perf_counter()
    progress(total, total, "saving")
    title = Path(opts.save_to or opts.save_folder or "merged").stem
    metadata = merged_metadata(model, opts.base, list(zip(files, weights)), title)
    if is_flow(model.version):
        text_merged = any(table[name].part != TRANSFORMER for f in files for name in f.modules
                          if name in table)
        outputs = save_flow_merged(model, opts, metadata, text_merged)
    else:
        outputs = save_merged(model, opts, metadata)
    seconds = {"load": loaded - started, "merge": applied - loaded,
               "save": time.perf_counter() - applied}
    return MergeReport(opts.base, model.version, merged, outputs, seconds)


def format_merge(report: MergeReport) -> str:
    lines = [f"Merged into {report.base} ({report.family}):"]
    for lora in report.loras:
        lines.append(f"- {Path(lora.path).name} x {lora.weight:g}: {lora.applied} modules")
        if lora.unmatched:
            shown = ", ".join(lora.unmatched[:5]) + (" ..." if len(lora.unmatched) > 5 else "")
            lines.append(f"  {len(lora.unmatched)} modules not in the model, skipped: {shown}")
    lines += [f"Wrote {out}" for out in report.outputs]
    lines.append("Time: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items()))
    return "\n".join(lines)
