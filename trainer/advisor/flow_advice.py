"""The advisor for FLUX.1 and SD 3.5: peak memory with each memory option, the time, and the
cheapest combination that fits the device ("16 GB: fp8 base, blocks_to_swap 8, batch 1").

The memory comes from :mod:`trainer.advisor.flow_memory` (a simulated step of small models of
the same width, extrapolated per block, plus the weights by option); every combination of
base precision, block swap and batch is arithmetic on cached simulations, so the search
answers in about a second once the simulations for a resolution are done.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.advisor.advice import CPU_HEAP, FITS_BELOW, GIB, RUNTIME, Advice, Memory, Timing
from trainer.advisor.flow_memory import _family, flow_weights
from trainer.advisor.flow_sizes import step_bytes, text_tokens, unit_bytes, weight_bytes
from trainer.advisor.rules import Recommendation, throughput

SWAP_STEP = 4
HOST_LINK = 25e9  # bytes/s host <-> device (PCIe 4 x16, pinned)
# optimizer state per trained parameter (fp32 LoRA weights): AdamW's two moments, 8-bit's
# two bytes, Adafactor's factored moment of a rank-r matrix (small), Lion/SGD one moment
STATE_BYTES = {"AdamW8bit": 2, "PagedAdamW8bit": 2, "Lion8bit": 1, "Adafactor": 0.1,
               "Lion": 4, "SGDNesterov": 4, "SGD": 4}


@dataclass(frozen=True)
class FlowOption:
    base: str = "full"
    swap: Optional[int] = None
    batch: int = 1
    checkpointing: bool = True

    def words(self) -> str:
        parts = [{"full": "bf16 base", "fp8": "fp8 base", "nf4": "NF4 base",
                  "int8": "int8 base"}[self.base]]
        if self.swap:
            parts.append(f"blocks_to_swap {self.swap}")
        parts.append(f"batch {self.batch}")
        if not self.checkpointing:
            parts.append("no checkpointing")
        return ", ".join(parts)

    def changes(self) -> dict[str, Any]:
        return {"model.base_precision": self.base, "training.blocks_to_swap": self.swap,
                "training.train_batch_size": self.batch,
                "training.gradient_checkpointing": self.checkpointing}


def flow_transformer_config(section: Any) -> Optional[dict]:
    """The transformer config of a FLUX.1 / SD 3.5 model (None for another family)."""
    from trainer.families import is_flow, role
    from trainer.models.loader import EMBEDDED_MODELS, resolve_model_path

    value = section.pretrained_model_name_or_path
    if value in EMBEDDED_MODELS:
        if not is_flow(EMBEDDED_MODELS[value]):
            return None
        from trainer.advisor.model_configs import cached
        from trainer.advisor.shipped import embedded_flow_config

        def config() -> dict:
            transformer = role(EMBEDDED_MODELS[value], "memory").tiny_components()["transformer"]
            return dict(transformer.config, _class_name=type(transformer).__name__)
        return cached("flow-config:" + value, lambda: embedded_flow_config(value) or config())
    path = Path(resolve_model_path(value))
    if path.is_dir():
        config = path / "transformer" / "config.json"
        return json.loads(config.read_text(encoding="utf-8")) if config.is_file() else None
    from trainer.families import detect_path
    from trainer.families.common.mmdit_detect import detect_flow_file, header_config
    from trainer.families.spec import ModelLoadError

    # model_version = "auto" reads the family from the header, as train does
    if section.model_version == "auto":
        try:
            if not detect_path(path).is_flow:
                return None
        except ModelLoadError:
            return None  # the SD readers report on it
    elif not is_flow(section.model_version):
        return None
    family = section.model_version if section.model_version != "auto" else \
        detect_path(path).family
    own = getattr(role(family, "memory"), "file_transformer_config", None)
    if own is not None:  # a family whose files the MMDiT reader does not read
        return own(section, path)
    info = detect_flow_file(path)  # the config the loader builds the transformer from
    given = Path(section.config_dir).expanduser() / "transformer" / "config.json" \
        if section.config_dir else None
    if given is not None and given.is_file():
        return json.loads(given.read_text(encoding="utf-8"))
    if not info.published_size:
        return header_config(info)
    folder = info.config_dir()
    return json.loads((folder / "transformer" / "config.json").read_text(encoding="utf-8"))


def flow_memory(config: dict, cfg: Any, size: tuple[int, int], option: FlowOption,
                capacity: Optional[int], backend: str = "cuda", c: int = 2) -> Memory:
    """The peak of a LoRA step with ``option``, line by line; on the CPU (``backend``) in host
    memory, against the machine's RAM; ``c`` bytes a weight in the compute precision."""
    w = flow_weights(config, cfg)
    state = STATE_BYTES.get(cfg.optimizer.optimizer_type, 8)
    layer_copy = 0
    if option.base != "full":  # the compute copies of the cast weights: one block's at a time
        layer_copy = c * max(w.fp8_units)
    if option.base == "fp8" and not option.checkpointing:  # autograd keeps every layer's
        layer_copy = c * (sum(w.fp8_units) + w.fp8_other)  # (trainer/advisor/base_weights.py)
    # simulated in bf16: fp32 compute keeps the same tensors at twice the width
    acts = step_bytes(config, cfg, size, option.batch, option.checkpointing) * c // 2
    name = "fp32" if c == 4 else "bf16"
    lines = [
        ("runtime: Python and the libraries" if backend == "cpu" else "runtime (CUDA context)",
         RUNTIME.get(backend, RUNTIME["cuda"])),
        (f"transformer weights ({option.base if option.base != 'full' else name}"
         + (f", {option.swap} blocks swapped" if option.swap else "") + ")",
         weight_bytes(w, option.base, option.swap, c)),
        ("compute-precision copies of the fp8 layers for the backward pass", layer_copy),
        ("LoRA weights and gradients (fp32)", 8 * w.lora),
        (f"optimizer state ({cfg.optimizer.optimizer_type})", int(state * w.lora)),
        ("activations", acts)]
    if backend == "cpu":
        lines.append(("the C heap's spare blocks (CPU)", int(CPU_HEAP * acts)))
    return Memory("training step", tuple(lines), capacity, option.checkpointing)


def swapped_bytes(config: dict, cfg: Any, option: FlowOption, c: int) -> int:
    """Bytes of the blocks that block swap keeps in host memory (every swapped one: the two
    in flight keep their host copies)."""
    units = unit_bytes(flow_weights(config, cfg), option.base, c)
    return int(sum(units[len(units) - option.swap:])) if option.swap else 0


def candidates(config: dict, batch: int) -> list[FlowOption]:
    """Every combination, cheapest (fastest) first: bf16, fp8, fp8 with more and more blocks
    swapped, NF4, NF4 with swap; at each, the configured batch before smaller ones (a smaller
    batch costs less than a block more to copy each step)."""
    from trainer.advisor.flow_memory import _block_counts

    units = sum(_block_counts(config))
    swaps = [None] + list(range(SWAP_STEP, units - 1, SWAP_STEP))
    batches = sorted({batch, max(1, batch // 2), 1}, reverse=True)
    plan = [("full", None)] + [("fp8", s) for s in swaps] + [("nf4", s) for s in swaps]
    return [FlowOption(base, swap, b) for base, swap in plan for b in batches]


def cheapest_fit(config: dict, cfg: Any, size: tuple[int, int], capacity: int,
                 batch: int, backend: str = "cuda",
                 c: int = 2) -> Optional[tuple[FlowOption, Memory]]:
    for option in candidates(config, batch):
        memory = flow_memory(config, cfg, size, option, capacity, backend, c)
        if memory.peak <= capacity * FITS_BELOW:
            return option, memory
    return None


def flow_timing(config: dict, cfg: Any, info: Any, precision: str, size: tuple[int, int],
                option: FlowOption) -> Timing:
    """Forward (2 flop per weight and token), backward to the inputs (2 more), the
    recomputation with checkpointing (2 more); the swap's copies overlap the compute."""
    from trainer.advisor.edit_sequence import edit_sequence

    w = flow_weights(config, cfg)
    edit = edit_sequence(cfg, size)  # an edit model's controls lengthen the sequence
    tokens = (size[0] // 16) * (size[1] // 16) + text_tokens(config, cfg, edit) \
        + (edit.image_tokens if edit else 0)  # as T5 is padded
    passes = 6 if option.checkpointing else 4
    flop = passes * w.total * tokens * option.batch
    rate, basis = throughput(info, precision)
    compute = flop / (rate * 1e12)
    swapped = sum(w.units[len(w.units) - (option.swap or 0):]) * (1 if option.base == "fp8"
                                                                   else 2)
    per_step = max(compute, 2 * swapped / HOST_LINK)
    return Timing(per_step, None, flop / 1e12, basis)


def flow_advise(advice: Advice, cfg: Any, info: Any, config: dict) -> None:
    """Fill ``advice`` for a transformer family's config on ``info``."""
    side = advice.steps.largest_bucket
    tr, m = cfg.training, cfg.model
    current = FlowOption(m.base_precision, tr.blocks_to_swap, tr.train_batch_size,
                         tr.gradient_checkpointing)
    other = FlowOption(current.base, current.swap, current.batch, not current.checkpointing)
    capacity, c = info.memory_bytes, 4 if advice.precision == "no" else 2
    advice.memory = flow_memory(config, cfg, side, current, capacity, info.backend, c)
    advice.other = flow_memory(config, cfg, side, other, capacity, info.backend, c)
    advice.timing = flow_timing(config, cfg, info, advice.precision, side, current)
    advice.other_timing = flow_timing(config, cfg, info, advice.precision, side, other)
    if advice.timing and advice.steps.total_steps:
        advice.timing = Timing(advice.timing.seconds_per_step,
                               advice.timing.seconds_per_step * advice.steps.total_steps,
                               advice.timing.tflop_per_step, advice.timing.basis)
    parts = _phases(advice, cfg, info, config, current, c)
    if info.backend != "cpu" and capacity is not None:
        _text_phase(advice, cfg, info, parts, capacity, c)
    if capacity is None or advice.memory.fits:
        return
    found = cheapest_fit(config, cfg, side, capacity, tr.train_batch_size, info.backend, c)
    if found is None:
        advice.recommendations.append(Recommendation(
            "Nothing fits this device", f"even NF4 with the most blocks swapped at batch 1 "
            f"needs more than {capacity / GIB:.0f} GB at {side[0]}x{side[1]} px; lower "
            f"dataset.resolution"))
        return
    option, memory = found
    advice.recommendations.insert(0, Recommendation(
        f"{capacity / GIB:.0f} GB: {option.words()}",
        f"the cheapest combination that fits: about {memory.peak / GIB:.1f} GiB at "
        f"{side[0]}x{side[1]} px", option.changes(), saves=advice.memory.peak - memory.peak))


def _text_width(config: dict, family: str) -> int:
    """The width of the cached text features: the family's memory role's, else the
    transformer's joint attention input (FLUX.1's and SD 3.5's T5 width)."""
    from trainer.families import role

    own = getattr(role(family, "memory"), "text_width", None)
    return own(config) if own is not None else config["joint_attention_dim"]


def _text_phase(advice: Advice, cfg: Any, info: Any, parts: dict, capacity: int,
                c: int) -> None:
    """A GPU's other peak: the captions are encoded first, the text encoders alone on the
    device, and they leave it before the first step; the device's peak is the larger of that
    phase and the step. Where the encoders do not fit: fp8 storage where it makes them fit
    (``model.fp8_text_encoders``), else a problem with the bytes the phase needs."""
    from trainer.advisor import host_memory as hm

    phase = next((p for p in advice.phases if p.name == "text cache"), None)
    if phase is None or phase.device is None or phase.device <= capacity * FITS_BELOW:
        return
    on_device = RUNTIME.get(info.backend, RUNTIME["cuda"])
    text = [p for p in parts if p != "vae"]
    fp8 = hm.fp8_stored(text)
    largest = max((parts[p].largest for p in fp8), default=0)
    from trainer.advisor.edit_sequence import edit_sequence

    edit = edit_sequence(cfg, advice.steps.largest_bucket, c)  # reading the controls
    in_fp8 = on_device + sum(parts[p].held(c, p in fp8) for p in text) + largest * c \
        + (edit.encode_bytes if edit else 0)
    names = ", ".join(text)
    if not cfg.model.fp8_text_encoders and in_fp8 <= capacity * FITS_BELOW:
        advice.recommendations.insert(0, Recommendation(
            f"{capacity / GIB:.0f} GB: fp8 text encoder",
            f"encoding the captions holds the text encoder ({names}) on the device: about "
            f"{phase.device / GIB:.1f} GiB, more than this card; in fp8 about "
            f"{in_fp8 / GIB:.1f} GiB", {"model.fp8_text_encoders": True},
            saves=phase.device - in_fp8))
        return
    least = min(phase.device, in_fp8)
    advice.problems.append(
        f"does not fit on the device while the captions are encoded: the text encoder "
        f"({names}) needs about {least / GIB:.1f} GiB"
        + (" even in fp8" if least == in_fp8 else "")
        + f", this card has {capacity / GIB:.0f} GB (the training step itself needs "
        f"{advice.memory.peak / GIB:.1f} GiB)")


def _phases(advice: Advice, cfg: Any, info: Any, config: dict, option: FlowOption,
            c: int) -> dict:
    """The RAM and the device phase by phase (:mod:`trainer.advisor.host_memory`); on the CPU
    the peak is the phase that holds the most."""
    from trainer.advisor import host_memory as hm
    from trainer.advisor.edit_sequence import edit_sequence
    from trainer.families import role, spec
    from trainer.system.device import system_memory

    family = _family(config)
    parts = hm.model_parts(cfg.model, family)
    w = flow_weights(config, cfg)
    edit = edit_sequence(cfg, advice.steps.largest_bucket, c)
    text = text_tokens(config, cfg, edit)
    held = hm.held(cfg, parts, weight_bytes(w, option.base, None, c), c,
                   "fp32" if c == 4 else "bf16", max(advice.steps.images, 1), text,
                   _text_width(config, family),
                   (edit.encode_words, edit.encode_bytes) if edit else None)
    assets = spec(family).assets(role(family, "memory").VARIANT)
    encode = hm.vae_encode_bytes(hm.vae_config_root(cfg.model, assets),
                                 advice.steps.largest_bucket)
    memory = advice.memory
    advice.phases = hm.flow_phases(info, held, list(memory.lines),
                                   swapped_bytes(config, cfg, option, c), memory.peak, encode,
                                   hm.text_first(cfg, info.backend))
    advice.ram = info.memory_bytes if info.backend == "cpu" else system_memory()
    peak = advice.host_peak()
    if info.backend == "cpu" and peak is not None and peak.host > memory.peak:
        advice.memory = Memory(peak.name, peak.lines, memory.capacity, memory.checkpointing)
        if advice.other is not None and peak.host > advice.other.peak:  # not a step's peak
            advice.other = Memory(peak.name, peak.lines, memory.capacity,
                                  advice.other.checkpointing)
    if not advice.fits_ram and peak is not None:
        advice.problems.append(
            f"does not fit in RAM: the {peak.name} phase holds about {peak.host / GIB:.1f} GiB "
            f"of host memory, this machine has {advice.ram / GIB:.1f} GiB"
            + ("" if cfg.model.base_precision != "full" else
               "; model.base_precision = 'fp8' stores the transformer in half of it"))
    return parts
