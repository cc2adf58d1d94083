"""What a LoRA, LyCORIS or embedding file holds, in words and numbers.

The report gives the network type (from the tensors' suffixes, refined by ``ss_network_module``
and ``ss_network_args`` as sd-scripts and LyCORIS write them), the model family (from
``ss_base_model_version`` / ``modelspec.architecture``, else from the key names and the layer
widths: a cross-attention input of 768 is SD 1.x, 1024 SD 2.x, 2048 SDXL; FLUX.1's BFL block
names and SD 3.5's joint / ``transformer.*`` blocks tell the flow families), rank and alpha per
module, the modules per model part and per UNet block as sd-scripts counts them
(:mod:`trainer.tools.block_ranks`), each module's update norm (:meth:`LoraModule.norm`), and
the training facts of the ``ss_*`` / ``modelspec.*`` metadata in readable form
(:mod:`trainer.tools.metadata_view`).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from trainer.families import FAMILIES, names, role, spec
from trainer.tools.block_ranks import BlockRank, format_blocks, unet_blocks
from trainer.tools.lora_file import LoraFile, LoraModule, read_lora
from trainer.tools.metadata_view import shown, training_facts, training_tags
from trainer.tools.options import InspectOptions

ENCODER_WIDTHS = {"clip_l": 768, "open_clip": 1024, "clip_g": 1280}  # hidden states' widths
PART_NAMES = {"unet": "UNet", "te": "text encoder", "te1": "text encoder 1",
              "te2": "text encoder 2", "transformer": "transformer", "te3": "T5",
              "other": "other"}
KIND_NAMES = {"lora": "LoRA", "loha": "LoHa", "lokr": "LoKr", "full": "full weight difference",
              "ia3": "(IA)^3", "unknown": "unknown"}
METADATA_SHOWN = 2_000  # characters of each raw metadata value in the report (a file's tag
# frequency can be megabytes); the facts and tags are read from the whole values
SGM_BLOCKS = ("lora_unet_input_blocks_", "lora_unet_middle_block_", "lora_unet_output_blocks_")
SD3_VERSIONS = ("medium", "5-medium", "5-large")  # sd-scripts' SD3 ss_base_model_version


@dataclass
class ModuleStat:
    name: str
    part: str
    kind: str
    rank: Optional[int]
    alpha: Optional[float]
    norm: float
    conv: bool


@dataclass
class InspectReport:
    path: str
    network_type: str
    family: str  # sd1 / sd2 / sdxl / unknown
    family_reason: str
    modules: list[ModuleStat] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    tags: list[tuple[str, int]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    unknown_keys: list[str] = field(default_factory=list)
    embedding: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (n, dim)
    blocks: list[BlockRank] = field(default_factory=list)  # SD families: sd-scripts' blocks

    def parts(self) -> dict[str, int]:
        return dict(collections.Counter(m.part for m in self.modules))


def family_label(family: str) -> str:
    """What people call a family's LoRA files: the family's targets role's ``LABEL`` (SD 3 /
    3.5 files serve both), else the family's label; an unknown family as it is."""
    if family not in FAMILIES:
        return family
    return getattr(role(family, "targets"), "LABEL", None) or spec(family).label


def unet_widths(one_encoder: bool) -> dict[int, str]:
    """The UNet families by the width of their text encoders' hidden states together (the
    UNet's cross-attention input: 768 SD 1.x, 1024 SD 2.x, 2048 SDXL); with ``one_encoder``,
    only the families of one text encoder (the width of an embedding's vectors)."""
    out = {}
    for name in names(denoiser="unet"):
        encoders = spec(name).text_encoders
        if not one_encoder or len(encoders) == 1:
            out[sum(ENCODER_WIDTHS[e] for e in encoders)] = name
    return out


CROSS_ATTENTION_WIDTHS = unet_widths(one_encoder=False)
TEXT_WIDTHS = unet_widths(one_encoder=True)


def summary(values: list[Any]) -> Optional[tuple[Any, Any, Any]]:
    """(min, max, most common) of the values that are known."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return min(known), max(known), collections.Counter(known).most_common(1)[0][0]


def in_features(module: LoraModule) -> Optional[int]:
    t = module.tensors
    if "lora_down.weight" in t:
        return t["lora_down.weight"].shape[1]
    if "hada_w1_b" in t:
        return t["hada_w1_b"].shape[1]
    if "diff" in t:
        return t["diff"].shape[1]
    return None


def family_from_metadata(meta: dict[str, str]) -> Optional[str]:
    version = meta.get("ss_base_model_version", "")
    arch = meta.get("modelspec.architecture", "")
    if version in SD3_VERSIONS:
        return "sd3"
    for name in names(denoiser="transformer"):  # a transformer family's own version string
        if version and version == spec(name).kohya_version:
            return name
    for prefix, family in (("sdxl", "sdxl"), ("sd_v2", "sd2"), ("sd_v1", "sd1"),
                           ("flux1", "flux1")):
        if version.startswith(prefix):
            return family
    for name in names(denoiser="transformer"):  # a family's own sd-scripts / musubi version
        if version and version == spec(name).kohya_version:
            return name
    for prefix, family in (("stable-diffusion-xl", "sdxl"), ("stable-diffusion-v2", "sd2"),
                           ("stable-diffusion-v1", "sd1"), ("stable-diffusion-3", "sd3"),
                           ("flux-1", "flux1")):
        if arch.startswith(prefix):
            return family
    return None


def family_from_tensors(lora: LoraFile) -> tuple[str, str]:
    if lora.embedding:
        if "clip_g" in lora.embedding:
            return "sdxl", "clip_l and clip_g vectors"
        dim = lora.embedding["emb_params"].shape[-1]
        return TEXT_WIDTHS.get(dim, "unknown"), f"vectors of width {dim}"
    modules = lora.modules
    for family in names(denoiser="transformer"):  # layers whose names and shapes tell
        tells = getattr(role(family, "targets"), "tells", None)
        why = tells(modules) if tells is not None else None
        if why:
            return family, f"{family_label(family)} {why}"
    for family in names(denoiser="transformer"):  # layer names only one family has
        markers = getattr(role(family, "targets"), "MARKERS", ())
        if markers and any(m in n for n in modules for m in markers):
            return family, f"{family_label(family)} layer names ({markers[0]}...)"
    for family in names(denoiser="transformer"):  # each family's block names: its targets role
        prefixes = role(family, "targets").BLOCK_PREFIXES
        if any(n.startswith(prefixes) for n in modules):
            return family, f"{family_label(family)} block names ({prefixes[0]}...)"
    if any(m.part in ("te1", "te2") for m in modules.values()) or any(
            n.startswith(SGM_BLOCKS) for n in modules):
        return "sdxl", "SDXL key names (lora_te1_/lora_te2_, input_blocks)"
    for suffix, widths, what in (("attn2_to_k", CROSS_ATTENTION_WIDTHS, "cross-attention"),
                                 ("self_attn_q_proj", TEXT_WIDTHS, "text encoder")):
        for name, module in modules.items():
            width = in_features(module) if name.endswith(suffix) else None
            if width is not None:
                return widths.get(width, "unknown"), f"{what} width {width}"
    return "unknown", "no metadata and no layer that tells"


def detect_family(lora: LoraFile) -> tuple[str, str]:
    """(family, how it was told)."""
    family = family_from_metadata(lora.metadata)
    if family:
        return family, "from the metadata"
    family, why = family_from_tensors(lora)
    return family, f"from the tensors: {why}"


def network_type(lora: LoraFile) -> str:
    if lora.embedding:
        n = next(iter(lora.embedding.values())).shape[0]
        return f"textual-inversion embedding, {n} vector{'s' * (n != 1)}"
    kinds = collections.Counter(m.kind for m in lora.modules.values())
    words = [KIND_NAMES[k] for k in sorted(kinds, key=lambda k: (-kinds[k], k))]
    if "lora" in kinds and any(m.is_conv for m in lora.modules.values()):
        words[words.index("LoRA")] = "LoRA with 3x3 convolutions (LoCon)"
    module = lora.metadata.get("ss_network_module", "")
    if module == "networks.dylora":
        return "DyLoRA: " + " + ".join(words)
    if module.startswith("lycoris"):
        try:
            algo = json.loads(lora.metadata.get("ss_network_args") or "{}").get("algo")
        except (ValueError, AttributeError):
            algo = None
        return f"LyCORIS{f' ({algo})' if algo else ''}: " + " + ".join(words)
    return " + ".join(words)


def inspect(opts: InspectOptions) -> InspectReport:
    lora = read_lora(opts.path)
    family, reason = detect_family(lora)
    report = InspectReport(str(lora.path), network_type(lora), family, reason,
                           metadata={shown(k, 200): shown(v, METADATA_SHOWN)
                                     for k, v in lora.metadata.items()},
                           unknown_keys=lora.unknown)
    report.embedding = {k: tuple(v.shape) for k, v in lora.embedding.items()}
    report.modules = [ModuleStat(m.name, m.part, m.kind, m.rank, m.alpha, m.norm(), m.is_conv)
                      for m in lora.modules.values()]
    report.blocks = unet_blocks(report.modules, family)
    report.facts = training_facts(lora.metadata)
    report.tags = training_tags(lora.metadata)[: opts.top_tags]
    return report


def _summary_line(label: str, values: list[Any]) -> Optional[str]:
    s = summary(values)
    if s is None:
        return None
    low, high, common = s
    return f"{label}: {common:g}" + ("" if low == high else f" (min {low:g}, max {high:g})")


def format_inspect(report: InspectReport, top_modules: int = 10,
                   escape: Callable[[Any], str] = shown) -> str:
    """The report as Markdown that reads as plain text in a terminal too. Every value that comes
    from the file (names, metadata, tags) goes through ``escape``: cut and made printable for a
    terminal by default; the GUI passes an escape for Markdown."""
    e = escape
    mods = report.modules
    lines = [f"### {e(report.path)}", f"- Type: {e(report.network_type)}",
             f"- Family: {family_label(report.family)} "
             f"({e(report.family_reason)})"]
    if mods:
        parts = ", ".join(f"{PART_NAMES[p]} {n}" for p, n in report.parts().items())
        lines.append(f"- Modules: {len(mods)} ({parts})")
        for label, group in (("Rank", [m for m in mods if not m.conv]),
                             ("Conv rank", [m for m in mods if m.conv])):
            rank = _summary_line(label, [m.rank for m in group])
            alpha = _summary_line("alpha", [m.alpha for m in group])
            if rank or alpha:
                lines.append("- " + "; ".join(x for x in (rank, alpha) if x))
    for key, shape in report.embedding.items():
        lines.append(f"- {e(key)}: {shape[0]} vectors of width {shape[1]}")
    if report.unknown_keys:
        lines.append(f"- {len(report.unknown_keys)} other keys, e.g. "
                     f"{e(report.unknown_keys[0])}")
    lines += format_blocks(report.blocks, report.family)  # block-wise ranks
    if report.facts:
        lines += ["", "#### Training"] + [f"- {k}: {e(v)}" for k, v in report.facts]
    if report.tags:
        lines += ["", "#### Most frequent tags"]
        lines.append(", ".join(f"{e(shown(tag, 60))} ({n})" for tag, n in report.tags))
    if mods:
        lines += ["", f"#### Largest updates (Frobenius norm, of {len(mods)})"]
        for m in sorted(mods, key=lambda m: -m.norm)[:top_modules]:
            lines.append(f"- {e(m.name)}: {m.norm:.4g}")
    return "\n".join(lines)
