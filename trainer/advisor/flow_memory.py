"""FLUX.1 and SD 3.5 memory with the memory options, and the cheapest that fits.

One training step of the transformer is simulated on the meta device (no weight exists) with
the run's LoRA injected: the tensors a step keeps alive at its peak, gradient checkpointing on
or off. Small models of the same width (one or two blocks of each kind) are simulated and the
whole model's peak extrapolated per block; each small model's step is a law of the size, the
batch and the rank (:func:`trainer.advisor.law.pixel_law`), cached on disk and shipped for the
families' models (:mod:`trainer.advisor.shipped`). What the memory options change is the
weights, so it is arithmetic on top of that, and every combination answers at once:

- frozen weights: 2 bytes a parameter in bf16; ``fp8`` 1 byte for the Linear weights that
  :func:`trainer.models.memory.store_fp8` casts (the embedders and the last projection stay bf16);
  ``nf4`` 0.5 byte plus a 4-byte absmax per 64 weights, ``int8`` 1 byte plus a row scale;
- ``blocks_to_swap = N``: the last N blocks' frozen weights leave the device but for the two
  in flight (the running one and the prefetched one);
- fp8 compute copies: layerwise casting holds one layer's bf16 weight at a time, and autograd
  keeps a block's worth of them for the backward pass (the block being recomputed);
- LoRA: fp32 weights and gradients, and the optimizer's state;
- text encoders and VAE: off the device once their outputs are cached (the flow presets do).

What differs between the families (their small models, the text tokens of a step, a step's
inputs, the release the laws are made at) is each family's memory role,
``trainer/families/<folder>/memory.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

import torch

from trainer.advisor.disk_cache import stored
from trainer.advisor.law import Law, Recording, pixel_law
from trainer.advisor.model_configs import cached, shape
from trainer.families import names, role

NF4_BYTES = 0.5 + 4 / 64  # a 4-bit code and an fp32 absmax per block of 64
INT8_BYTES = 1.0


@dataclass(frozen=True)
class FlowWeights:
    """Parameter counts of a transformer, by what the memory options do with them."""

    total: int
    units: tuple[int, ...]  # frozen parameters of each swap unit, in forward order
    fp8_units: tuple[int, ...]  # of those, the ones fp8 storage casts
    fp8_other: int  # cast outside the units (the final projection, say)
    quant_units: tuple[int, ...]  # Linear weights NF4 / int8 quantize, per unit
    lora: int  # adapter parameters for the config's rank


def transformer_class(config: dict) -> Any:
    import diffusers

    return getattr(diffusers, config["_class_name"])


def meta_transformer(config: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return transformer_class(config).from_config(config)


def _family(config: dict) -> str:
    """The flow family of a transformer config, by its diffusers class."""
    for name in names(objective="flow"):
        if config["_class_name"].startswith(role(name, "memory").TRANSFORMER_PREFIX):
            return name
    raise ValueError(f"{config['_class_name']}: not the transformer of a flow family")


def _memory(config: dict) -> Any:
    """The family's memory role (trainer/families/<folder>/memory.py): its small models, text
    tokens and a step's inputs."""
    return role(_family(config), "memory")


def _small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks`` (double, single) blocks for FLUX.1, (joint, 0) for SD 3.5."""
    return _memory(config).small(config, blocks)


def _shapes(config: dict) -> list[tuple[int, int]]:
    """The small models whose differences give one block of each kind."""
    return list(_memory(config).SHAPES)


def t5_tokens(config: dict) -> int:
    """T5's length at which the family's laws are made (FLUX.1-dev's 512, SD 3.5's 256); a
    family without T5 gives its text tokens of a step (``TEXT_TOKENS``: Z-Image's Qwen3)."""
    memory = _memory(config)
    return memory.T5_TOKENS or memory.TEXT_TOKENS


def clip_tokens(config: dict) -> int:
    """CLIP's tokens beside T5's (SD 3.5's 77; FLUX.1 none)."""
    return _memory(config).CLIP_TOKENS


def _block_counts(config: dict) -> tuple[int, int]:
    own = getattr(_memory(config), "block_counts", None)  # a family's own names of them
    if own is not None:
        return own(config)
    return config["num_layers"], config.get("num_single_layers", 0)


def _extrapolate(config: dict, values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per first-kind block, per second-kind block) from the small models."""
    return _memory(config).extrapolate(values)


def _with_adapters(model: torch.nn.Module, cfg: Any, rank: Optional[int] = None) -> int:
    """Stand-ins for peft's LoRA on the run's target modules (peft's own injection takes
    tens of seconds on a 12B-parameter model): same parameters, same saved tensors."""
    from types import SimpleNamespace

    from trainer.methods.lora import denoiser_lora_config

    family = _family({"_class_name": type(model).__name__})
    targets = denoiser_lora_config(cfg, SimpleNamespace(denoiser=model, version=family))
    rank, count = rank or cfg.network.network_dim, 0
    for name in targets.target_modules:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, _Adapted(base, rank))
        count += rank * (base.in_features + base.out_features)
    return count


class _Adapted(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear, rank: int):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False, device="meta")
        self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x))


def _count(model: torch.nn.Module) -> tuple[float, float, float, float]:
    """(all frozen, fp8-cast, quantized Linear weights, adapters) parameters of ``model``."""
    from trainer.models.memory import SKIP_PATTERNS

    skip = SKIP_PATTERNS
    frozen = cast = quant = lora = 0
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if "lora_" in name:
                lora += p.numel()
                continue
            frozen += p.numel()
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) \
                    and not any(re.search(s, name) for s in skip):
                cast += p.numel()
                quant += p.numel() if type(module) is torch.nn.Linear and pname == "weight" \
                    else 0
    return frozen, cast, quant, lora


def _small_model(config: dict, blocks: tuple[int, int], cfg: Any,
                 rank: Optional[int] = None) -> torch.nn.Module:
    model = meta_transformer(_small(config, blocks)).requires_grad_(False)
    _with_adapters(model, cfg, rank)
    return model


def _network(cfg: Any) -> dict[str, Any]:
    """What of the network shapes the stand-in adapters besides the rank: their modules."""
    return {"train_blocks": cfg.network.train_blocks}


def flow_weights(config: dict, cfg: Any) -> FlowWeights:
    """Parameter counts by kind, from small models of the same width (adapters of rank 1,
    times the rank); cached."""
    from dataclasses import replace

    def build() -> FlowWeights:
        counts = [_count(_small_model(config, b, cfg, 1)) for b in _shapes(config)]
        parts = [_extrapolate(config, [c[i] for c in counts]) for i in range(4)]
        doubles, singles = _block_counts(config)
        kinds = [1] * doubles + [2] * singles
        fixed = [int(p[0]) for p in parts]
        units = tuple(tuple(int(parts[i][k]) for k in kinds) for i in range(3))
        tail = _memory(config).FIXED_BLOCKS  # SD 3.5's last block: in the fixed part
        if tail:
            units = tuple(u[:-tail] for u in units)
            fixed = [f + tail * int(parts[i][1]) if i < 3 else f for i, f in enumerate(fixed)]
        lora = fixed[3] + doubles * parts[3][1] + singles * parts[3][2]
        total = fixed[0] + sum(units[0])
        return FlowWeights(int(total), units[0], units[1], fixed[1], units[2], int(lora))
    key = json.dumps(["flow-weights", shape(config), _network(cfg)], sort_keys=True)
    per_rank = stored(key, build, _to_lists, lambda d: FlowWeights(**{
        k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}), model=_model(config))
    return replace(per_rank, lora=per_rank.lora * cfg.network.network_dim)


def _model(config: dict) -> str:
    """The key of what is shipped about a transformer (:mod:`trainer.advisor.shipped`)."""
    return json.dumps(["flow", shape(config)], sort_keys=True)


def _to_lists(w: FlowWeights) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(w)


def _inputs(config: dict, size: tuple[int, int], batch: int) -> dict[str, Any]:
    w, h = size[0] // 8, size[1] // 8
    text = t5_tokens(config) + clip_tokens(config)
    own = getattr(_memory(config), "step_inputs", None)  # a transformer of other arguments
    if own is not None:
        return dict(own(config, w, h, batch, text), return_dict=False)
    meta = dict(device="meta", dtype=torch.bfloat16)
    common = dict(encoder_hidden_states=torch.zeros(batch, text, config["joint_attention_dim"],
                                                    **meta),
                  timestep=torch.zeros(batch, **meta), return_dict=False)
    if "pooled_projection_dim" in config:  # FLUX.1, SD 3.5 (Chroma reads none)
        common["pooled_projections"] = torch.zeros(batch, config["pooled_projection_dim"], **meta)
    return dict(_memory(config).image_inputs(config, w, h, batch, text), **common)


def _simulate(model: torch.nn.Module, config: dict, size: tuple[int, int], batch: int,
              checkpointing: bool, record: Optional[Recording] = None) -> int:
    """Peak bytes of one step's own tensors (bf16 compute) of ``model`` on the meta device;
    with ``record``, what :class:`trainer.advisor.law.Recording` keeps."""
    from trainer.advisor.footprint import FusedAttention, LiveBytes, _checkpoint_func

    torch.nn.Module.to(model, torch.bfloat16)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    if checkpointing:
        model.enable_gradient_checkpointing(_checkpoint_func())
    model.train()
    inputs = _inputs(config, size, batch)
    ignore = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    live = LiveBytes(ignore, record=record)
    with FusedAttention(), live:
        out = model(**inputs)[0]
        if isinstance(out, (list, tuple)):  # one output per image (Z-Image)
            out = torch.stack(list(out))
        out.float().pow(2).mean().backward()
        del out
    live.record = None  # what is freed later is not this step's
    if record is not None:
        record.ops = live.ops
    return live.peak


def simulate_flow_step(config: dict, cfg: Any, size: tuple[int, int], batch: int,
                       checkpointing: bool, full: bool = False) -> int:
    """Peak bytes of a LoRA step's own tensors (activations and their gradients, bf16), from
    small models of the same width: a step's memory grows by a fixed amount per block of each
    kind (the blocks' inputs kept for the backward pass, or all their activations without
    checkpointing). Each small model's peak comes from its law (:func:`flow_law`: any size,
    batch and rank), or simulated at these values where there is none. ``full`` simulates the
    whole model instead (the tests compare). Cached."""
    rank = cfg.network.network_dim

    def build() -> int:
        if full:
            model = meta_transformer(config).requires_grad_(False)
            _with_adapters(model, cfg)
            return _simulate(model, config, size, batch, checkpointing)
        peaks = []
        for blocks in _shapes(config):
            law = flow_law(config, blocks, cfg, checkpointing, batch) if rank > 1 else None
            peaks.append(law.peak((batch, size[1] // 16, size[0] // 16, rank, 1)) if law
                         else _simulate(_small_model(config, blocks, cfg), config, size,
                                        batch, checkpointing))
        fixed, first, second = _extrapolate(config, peaks)
        doubles, singles = _block_counts(config)
        return int(fixed + doubles * first + singles * second)
    key = json.dumps(["flow-step", config, cfg.network.model_dump(mode="json"), list(size),
                      batch, checkpointing, full], sort_keys=True)
    return cached(key, build)


FLOW_FIRST_SIDE = 32  # tokens a side (512 px) in the first of a law's simulations


def _first_side(config: dict) -> int:
    """The first simulation's tokens a side: 32, or fewer where SD 3.5's position embedding
    ends at twice that or before (at its end the crop is a no-op: other operations); even,
    so that 3/2 of it is whole."""
    most = config.get("pos_embed_max_size") or 4 * FLOW_FIRST_SIDE
    return min(FLOW_FIRST_SIDE, (most - 1) // 4 * 2)


def flow_law(config: dict, blocks: tuple[int, int], cfg: Any, checkpointing: bool,
             batch: int) -> Optional[Law]:
    """The law (:func:`trainer.advisor.law.pixel_law`) of a small model's step: from
    simulations at 512, 768 and 1024 px (:func:`_first_side`), at twice the batch (batch 1
    has a law of its own) and at 7 x the rank; cached and shipped."""
    side = _first_side(config)
    first = (1 if batch == 1 else 2, side, side, 4, 1)
    varied = (batch > 1, True, True, True, False)

    def build() -> Optional[Law]:
        records = {}
        for name, (b, side, rank) in {
                "base": (first[0], 2, first[3]), "pixels 3": (first[0], 3, first[3]),
                "pixels 4": (first[0], 4, first[3]), "batch": (2 * first[0], 2, first[3]),
                "rank": (first[0], 2, 7 * first[3])}.items():
            if (name == "batch" and not varied[0]):
                continue
            px = 16 * first[1] * side // 2
            records[name] = Recording()
            _simulate(_small_model(config, blocks, cfg, rank), config, (px, px), b,
                      checkpointing, records[name])
        return pixel_law(records, first, varied)
    key = json.dumps(["flow-law", shape(_small(config, blocks)), _network(cfg), checkpointing,
                      "batch 1" if batch == 1 else "batch 2+"], sort_keys=True)
    return stored(key, build, lambda law: law.to_json() if law else None,
                  lambda d: Law.from_json(d) if d else None, model=_model(config))


def weight_bytes(w: FlowWeights, base: str, swap: Optional[int]) -> int:
    """Device bytes of the frozen transformer for a base precision and a block swap."""
    def unit_bytes(i: int) -> float:
        n, cast, quant = w.units[i], w.fp8_units[i], w.quant_units[i]
        if base == "fp8":
            return 2 * n - cast
        if base == "nf4":
            return 2 * (n - quant) + NF4_BYTES * quant
        if base == "int8":
            return 2 * (n - quant) + INT8_BYTES * quant
        return 2 * n
    other = w.total - sum(w.units)
    total = 2 * other - (w.fp8_other if base == "fp8" else 0)
    swapped = range(len(w.units) - (swap or 0), len(w.units))
    resident = [unit_bytes(i) for i in range(len(w.units)) if i not in swapped]
    in_flight = sorted((unit_bytes(i) for i in swapped), reverse=True)[:2]
    return int(total + sum(resident) + sum(in_flight))
