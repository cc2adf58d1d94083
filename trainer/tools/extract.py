"""Extract a LoRA from a fine-tuned model: the SVD of its difference to the base model.

For every layer that this studio's LoRA trains (:mod:`trainer.methods.lora`'s targets: the
attention and feed-forward layers of the UNet's transformer blocks and the text encoders'
attention and MLP layers; with ``conv_rank`` the ResNet and resampler convolutions too), the
difference ``W_tuned - W_base`` is flattened to [out, in*k*k], decomposed, truncated to the rank
(:mod:`trainer.tools.svd`; the best approximation at that rank) and written as ``lora_up`` /
``lora_down`` with ``alpha = rank``, so the scale is 1, as sd-scripts'
``extract_lora_from_models.py`` writes it. At a rank that reaches the layer's size the LoRA
reproduces the difference. Every module gets the rank asked for as its alpha, also a layer
smaller than that rank (its factors carry the difference of scale): diffusers 0.42's kohya
loader gives an attention layer whose alpha differs from the others the common alpha.

A text encoder whose weights changed by no more than ``min_diff`` anywhere is left out (it was
not trained); the UNet is always extracted. The file gets sd-scripts' minimum ``ss_*``
metadata, ``modelspec.*`` and fresh hashes, under the names :mod:`trainer.export.lora` writes,
which diffusers' ``load_lora_weights``, ComfyUI and AUTOMATIC1111 read.

FLUX.1 and SD 3.5 models (a diffusers folder, or a single file the loader reads) give their
family's LoRA: its layers and its file form (:mod:`trainer.tools.flow_extract`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.families import is_flow, spec
from trainer.tools import svd
from trainer.tools.common import (
    DTYPES,
    Progress,
    ToolError,
    load_model,
    model_modelspec,
    no_progress,
)
from trainer.tools.options import ExtractOptions
from trainer.tools.targets import Target, matches, model_targets


@dataclass
class ExtractedModule:
    name: str
    rank: int
    max_diff: float
    fro_kept: float  # share of the difference's Frobenius norm that the LoRA keeps


@dataclass
class ExtractReport:
    save_to: str
    family: str
    modules: list[ExtractedModule]
    skipped: list[str]  # text encoders (FLUX.1 / SD 3.5: unchanged layers) left out, and why
    seconds: float


def layer_rank(target: Target, opts: ExtractOptions) -> int | None:
    """The rank at which this layer is extracted, None when it is not a LoRA target."""
    from trainer.methods.lora import TEXT_ENCODER_TARGETS, UNET_CONV_TARGETS, UNET_TARGETS

    if target.part != "unet":
        return opts.rank if matches(target.path, TEXT_ENCODER_TARGETS) else None
    if matches(target.path, UNET_TARGETS):
        return opts.rank
    if opts.conv_rank and matches(target.path, UNET_CONV_TARGETS):
        return opts.conv_rank
    return None


Pair = tuple[Target, Target, int]  # base layer, tuned layer, rank


def layer_pairs(base: Any, tuned: Any, opts: ExtractOptions) -> list[Pair]:
    """(base layer, tuned layer, rank) of every layer to extract."""
    tuned_layers = {t.name: t for t, _ in model_targets(tuned)}
    out = []
    for target, _ in model_targets(base):
        rank = layer_rank(target, opts)
        if rank is None:
            continue
        other = tuned_layers.get(target.name)
        if other is None or other.module.weight.shape != target.module.weight.shape:
            raise ToolError(f"{target.name}: the tuned model has no layer of this shape; it "
                            f"must be a fine-tune of the base model (same family and size)")
        out.append((target, other, rank))
    return out


def difference(pair: Pair) -> torch.Tensor:
    base, tuned, _ = pair
    return tuned.module.weight.detach().float() - base.module.weight.detach().float()


def unchanged_encoders(pairs: list[Pair], min_diff: float) -> dict[str, float]:
    """Text encoders (te, te1, te2) whose largest change is at most ``min_diff``."""
    largest: dict[str, float] = {}
    for pair in pairs:
        part = pair[0].part
        if part != "unet":
            largest[part] = max(largest.get(part, 0.0), float(difference(pair).abs().max()))
    return {part: m for part, m in largest.items() if m <= min_diff}


def extract_layer(diff: torch.Tensor, rank: int, quantile: float | None
                  ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(lora_up, lora_down, share of the Frobenius norm kept) of one layer's difference, for
    ``alpha = rank``: a layer smaller than the rank (k < rank) carries ``k / rank`` in its
    factors, so that ``up @ down * rank / k`` is the truncated difference."""
    u, s, vh = svd.full_svd(diff.flatten(1))
    k = min(rank, len(s))
    up, down = svd.split_factors(u, s * (k / rank), vh, k)
    if quantile is not None:
        up, down = svd.clamp_quantile(up, down, quantile)
    if diff.dim() == 4:
        up, down = up.reshape(*up.shape, 1, 1), down.reshape(k, *diff.shape[1:])
    return up, down, svd.kept_energy(s, k)[0]


def extracted_metadata(base: Any, opts: ExtractOptions) -> dict[str, str]:
    from trainer.export.metadata import NETWORK_MODULE, base_model_version_str

    v_pred = base.prediction_type == "v_prediction"
    args = {"conv_dim": str(opts.conv_rank), "conv_alpha": str(float(opts.conv_rank))
            } if opts.conv_rank else {}
    meta = {
        "ss_network_module": NETWORK_MODULE,
        "ss_network_dim": str(opts.rank),
        "ss_network_alpha": str(float(opts.rank)),
        "ss_network_args": json.dumps(args),
        "ss_v2": str(spec(base.version).kohya_version == "sd_v2"),  # sd-scripts' --v2
        "ss_base_model_version": base_model_version_str(base.version, v_pred),
        "ss_sd_model_name": Path(opts.base).name,
        "ss_training_comment": f"extracted by SVD at rank {opts.rank} from "
                               f"{Path(opts.tuned).name} minus {Path(opts.base).name}",
    }
    meta.update(model_modelspec(base, Path(opts.save_to).stem, adapter="lora"))
    return meta


def extract(opts: ExtractOptions, progress: Progress = no_progress) -> ExtractReport:
    """Extract the LoRA of ``opts.tuned`` relative to ``opts.base`` into ``opts.save_to``."""
    from trainer.export.hashes import add_hashes
    from trainer.system.safe_write import save_safetensors_atomic

    started = time.perf_counter()
    progress(0, 1, "loading the models")
    base = load_model(opts.base, opts.config_dir)
    tuned = load_model(opts.tuned, opts.config_dir)
    if base.version != tuned.version:
        raise ToolError(f"the base model is {base.version} and the tuned one {tuned.version}: "
                        f"a LoRA is extracted from a fine-tune of the base model")
    if is_flow(base.version):
        return _extract_flow(opts, base, tuned, progress, started)
    pairs = layer_pairs(base, tuned, opts)
    skip = unchanged_encoders(pairs, opts.min_diff)
    pairs = [p for p in pairs if p[0].part not in skip]
    dtype, tensors, modules = DTYPES[opts.precision], {}, []
    for i, pair in enumerate(pairs):
        target, diff = pair[0], difference(pair)
        up, down, kept = extract_layer(diff, pair[2], opts.clamp_quantile)
        k = down.shape[0]
        tensors[f"{target.name}.lora_up.weight"] = up.to(dtype).contiguous()
        tensors[f"{target.name}.lora_down.weight"] = down.to(dtype).contiguous()
        tensors[f"{target.name}.alpha"] = torch.tensor(float(pair[2]), dtype=dtype)
        modules.append(ExtractedModule(target.name, k, float(diff.abs().max()), kept))
        progress(i + 1, len(pairs), "extracting")
    metadata = add_hashes(extracted_metadata(base, opts), tensors)
    save_safetensors_atomic(Path(opts.save_to).expanduser(), tensors, metadata)
    skipped = [f"{part}: largest change {m:.2g} <= min_diff {opts.min_diff:g}"
               for part, m in skip.items()]
    return ExtractReport(opts.save_to, base.version, modules, skipped,
                         time.perf_counter() - started)


def _extract_flow(opts: ExtractOptions, base: Any, tuned: Any, progress: Progress,
                  started: float) -> ExtractReport:
    """FLUX.1 / SD 3.5: the family's layers and file form (:mod:`trainer.tools.flow_extract`)."""
    from trainer.tools.flow_extract import flow_lora_tensors, save_flow_extract

    if opts.conv_rank:
        raise ToolError("conv_rank: FLUX.1 and SD 3.5 LoRAs have no convolution layers; leave "
                        "it unset")
    tensors, found, skipped = flow_lora_tensors(base, tuned, opts.rank, opts.min_diff,
                                                opts.clamp_quantile, DTYPES[opts.precision],
                                                progress)
    save_flow_extract(base, opts, tensors)
    return ExtractReport(opts.save_to, base.version, [ExtractedModule(*m) for m in found],
                         skipped, time.perf_counter() - started)


def format_extract(report: ExtractReport) -> str:
    kept = [m.fro_kept for m in report.modules] or [1.0]
    parts: dict[str, int] = {}
    for m in report.modules:
        denoiser = m.name.startswith(("lora_unet_", "lora_transformer_"))
        part = ("transformer" if is_flow(report.family) else "UNet") if denoiser \
            else "text encoder"
        parts[part] = parts.get(part, 0) + 1
    lines = [f"Extracted {len(report.modules)} modules ("
             + ", ".join(f"{n} {p}" for p, n in parts.items()) + f") from a {report.family} "
             f"model into {report.save_to} in {report.seconds:.1f} s",
             f"Frobenius norm of the difference kept: mean {sum(kept) / len(kept):.1%}, "
             f"lowest {min(kept):.1%}"]
    lines += [f"Left out {s}" for s in report.skipped]
    return "\n".join(lines)
