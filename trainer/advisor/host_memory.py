"""The machine's memory (RAM) phase by phase for FLUX.1 / SD 3.5, beside the device's.

Every weight passes through host memory on its way to the device, so a run can fit a 24 GB
card and still not load on a machine with 32 GB of RAM. The run's phases, as
trainer/run/session.py, trainer/run/text_first.py and trainer/run/caches.py order them:

- **load**: the text encoders and the VAE, and the transformer unless it is built later
  (text first: a LoRA run on a single file whose captions are all cached); each is held as
  the loader stores it: fp8 where ``model.fp8_text_encoders`` / ``model.base_precision``
  store it (trainer/models/memory.py), else the compute precision; plus one group of tensors
  being read (trainer/models/streamed_load.py);
- **text cache**: every caption encoded, the encoders then let go (text first) or kept (on
  the CPU, where they have no device to leave) or moved back to the host (a GPU);
- **transformer** (text first): built from its file beside the VAE and the cached outputs;
- **latent cache**: a GPU encodes before the first step with the VAE alone on the device;
  the CPU between the first epoch's steps, beside everything the step holds;
- **step**: on the CPU the whole step is in RAM (:func:`trainer.advisor.flow_advice.
  flow_memory`); on a GPU the host keeps the swapped blocks and what left the device.

The components' sizes come from the files' safetensors headers (no weight is read), the
transformer's from :func:`trainer.advisor.flow_memory.flow_weights`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.advisor.advice import RUNTIME, RUNTIME_LOADING, Phase
from trainer.advisor.model_configs import cached

NOT_ENCODING = ("activations", "the C heap", "compute-precision copies")  # a step's own lines
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class Part:
    """A component's weights: how many, and how many fp8 storage can hold in one byte."""

    params: int
    fp8: int = 0
    largest: int = 0  # the three largest fp8-held tensors (one T5 feed-forward block)

    def held(self, c: int, fp8: bool) -> int:
        """Bytes as loaded: ``c`` a weight in the compute precision, fp8 ones in one."""
        return self.fp8 + (self.params - self.fp8) * c if fp8 else self.params * c


def _fp8_held(part: str, key: str, shape: list[int], skip: tuple[str, ...]) -> bool:
    """Whether fp8 text-encoder storage holds this tensor of a text encoder: the Linear
    weights, not the norms, the embeddings or T5's position bias (``skip``:
    trainer/models/memory.py's T5_SKIP; the other encoders' embedders are kept as
    :data:`trainer.models.memory.SKIP_PATTERNS` keeps them)."""
    return part not in ("vae", "clip_l", "clip_g") and key.endswith(".weight") \
        and len(shape) == 2 and not any(re.search(p, key) for p in skip)


def fp8_stored(encoders: list[str]) -> list[str]:
    """The text encoders that ``model.fp8_text_encoders`` stores in fp8: T5 where the family
    has it (FLUX.1, SD 3.5, Chroma: not CLIP), else its one decoder LLM (Qwen-Image, Z-Image,
    FLUX.2; trainer/models/memory.py)."""
    return ["t5xxl"] if "t5xxl" in encoders else [p for p in encoders if p not in ("clip_l",
                                                                                   "clip_g")]


def _count(tensors: dict[str, Any], part: str, prefix: str = "", read: Any = None) -> Part:
    """A part's weights under ``prefix``, those the loader reads (``read``: all by default)."""
    from trainer.models.memory import T5_SKIP

    params, held = 0, []
    for key, entry in tensors.items():
        if not key.startswith(prefix) or entry.get("dtype") not in DTYPE_BYTES:
            continue
        if read is not None and not read(key):
            continue
        n = 1
        for side in entry["shape"]:
            n *= side
        params += n
        if _fp8_held(part, key, entry["shape"], T5_SKIP):
            held.append(n)
    return Part(params, sum(held), sum(sorted(held)[-3:]))


def _header(path: Path) -> dict[str, Any]:
    from trainer.families.common.files import read_safetensors_header

    return read_safetensors_header(path).tensors


def folder_parts(family: str) -> dict[str, str]:
    """A diffusers folder's component folders -> the parts they hold: the family's text
    encoders in the pipeline's order (``text_encoder``, ``text_encoder_2``, ...), the VAE."""
    from trainer.families import spec

    encoders = spec(family).text_encoders
    return {**{"text_encoder" + (f"_{i + 1}" if i else ""): slot
               for i, slot in enumerate(encoders)}, "vae": "vae"}


def _folder_parts(root: Path, family: str) -> dict[str, Part]:
    out = {}
    for folder, part in folder_parts(family).items():
        counts = [_count(_header(f), part) for f in sorted((root / folder).glob("*.safetensors"))]
        if counts:
            out[part] = Part(sum(c.params for c in counts), sum(c.fp8 for c in counts),
                             max(c.largest for c in counts))
    return out


def _file_parts(section: Any, path: Path, family: str) -> dict[str, Part]:
    from trainer.families import detect_path, role, spec

    own = getattr(role(family, "memory"), "file_parts", None)
    if own is not None:  # a family that says where its file's parts are itself (and, as a
        # third entry, which of their keys its loader reads)
        return {part: _count(_header(where[0]), part, *where[1:])
                for part, where in own(section, path).items()}
    info = detect_path(path).header  # the family's record: its parts' key prefixes
    main = _header(path)
    settings = {part: getattr(section, name.split(".", 1)[1], None)
                for part, name in spec(family).part_settings.items()}
    out = {}
    for part, given in settings.items():
        if given:
            out[part] = _count(_header(Path(given).expanduser()), part)
        elif part in info.prefixes:
            out[part] = _count(main, part, info.prefixes[part])
    return out


def _root(section: Any) -> Path:
    """The model's folder or file (the embedded twin's folder, where a run has built it)."""
    from trainer.models.loader import EMBEDDED_MODELS

    value = section.pretrained_model_name_or_path
    if value in EMBEDDED_MODELS:
        from trainer.config.paths import data_home

        return data_home() / "embedded" / value.split(":", 1)[1]
    return Path(value).expanduser()


def vae_config_root(section: Any, assets: Path) -> Path:
    """The folder whose ``vae/config.json`` the loader builds the VAE from: the model's own
    folder, ``model.config_dir``, else the family's shipped configs (``assets``)."""
    for root in (_root(section), Path(section.config_dir or "").expanduser()):
        if (root / "vae" / "config.json").is_file():
            return root
    return assets


def model_parts(section: Any, family: str) -> dict[str, Part]:
    """The VAE and text encoders of ``section``'s FLUX.1 / SD 3.5 model, from the headers of
    its files (a diffusers folder's, or the single file and its component settings); empty
    where they cannot be read (the loader reports on them); cached per file."""
    path = _root(section)
    stamp = [str(p) + ":" + str(_mtime(p)) for p in
             (path, section.ae, section.clip_l, getattr(section, "clip_g", None), section.t5xxl,
              section.vae, getattr(section, "text_encoder", None)) if p]

    def build() -> dict[str, Part]:
        try:
            if path.is_dir():
                return _folder_parts(path, family)
            return _file_parts(section, path, family)
        except (OSError, ValueError):
            return {}
    return cached(json.dumps(["host-parts", family, stamp]), build)


def _mtime(p: Any) -> Optional[int]:
    try:
        return Path(p).expanduser().stat().st_mtime_ns
    except OSError:
        return None


def text_first(cfg: Any, backend: str) -> bool:
    """Whether the run encodes every caption and lets the text encoders go before the
    transformer is built (a single file: trainer/run/text_first.py)."""
    from trainer.data.text_cache import text_first_applies
    from trainer.models.loader import EMBEDDED_MODELS

    value = cfg.model.pretrained_model_name_or_path
    single = value not in EMBEDDED_MODELS and Path(value).expanduser().is_file()
    return single and text_first_applies(cfg, backend)


def _millions(n: int) -> str:
    return f"{n / 1e6:.0f} M" if n >= 1e8 else f"{n / 1e6:.2g} M"


@dataclass(frozen=True)
class Held:
    """What the phases add up: each entry (what, bytes) once."""

    runtime: tuple[str, int]
    text: list[tuple[str, int]]
    vae: tuple[str, int]
    transformer: tuple[str, int]
    outputs: tuple[str, int]
    encoding: tuple[str, int]  # what encoding the captions adds
    # what reading an edit model's control images adds to the encode (Qwen-Image-Edit's
    # Qwen2.5-VL: trainer/advisor/edit_sequence.py); none elsewhere
    reading: Optional[tuple[str, int]] = None


def held(cfg: Any, parts: dict[str, Part], transformer: int, c: int, name: str,
         captions: int, text_tokens: int, width: int,
         reading: Optional[tuple[str, int]] = None) -> Held:
    """The host's entries for the phases: the runtime, each text encoder, the VAE, the
    transformer (``transformer`` bytes as stored), the cached text outputs; ``reading``:
    what the text encoder's reading of the control images adds while it encodes."""
    from trainer.config.rules.family import trains_t5

    fp8_te = cfg.model.fp8_text_encoders and not trains_t5(cfg)  # Chroma's: train_text_encoder
    text = []
    encoders = [p for p in parts if p != "vae"]  # the family's text encoders' slots
    stored_fp8 = fp8_stored(encoders)
    for part in encoders:
        fp8 = fp8_te and part in stored_fp8
        text.append((f"{part}: {_millions(parts[part].params)}"
                     + (" (fp8 storage)" if fp8 else f" x {name}"),
                     parts[part].held(c, fp8)))
    vae = parts.get("vae", Part(0))  # unknown where the files cannot be read
    largest = max((parts[p].largest for p in stored_fp8), default=0)
    copies = (f"{name} copies of the text encoder's fp8 layers while it encodes (its three "
              f"largest)", largest * c if fp8_te else 0)
    outputs = captions * (text_tokens * width * c + 2 * width * c)
    return Held(("runtime: Python and the libraries", RUNTIME["cpu"]), text,
                (f"VAE: {_millions(vae.params)} x {name}", vae.held(c, False)),
                (f"transformer ({cfg.model.base_precision} storage)", transformer),
                (f"cached text outputs: {captions} caption(s)", outputs), copies,
                reading if reading and reading[1] else None)


def flow_phases(info: Any, h: Held, step_lines: list[tuple[str, int]],
                swapped: int, step_device: Optional[int], encode: int,
                first: bool) -> list[Phase]:
    """The phases of a run (see the module's notes). ``step_lines``: the step's lines (on
    the CPU all in RAM; on a GPU the device's, whose peak is ``step_device``), ``swapped``:
    bytes of the blocks that block swap keeps on the host, ``encode``: a VAE encode's peak,
    ``first``: text first."""
    from trainer.models.streamed_load import GROUP_BYTES

    cpu = info.backend == "cpu"
    largest = max([b for _, b in h.text] + [h.vae[1], h.transformer[1]])
    reading = ("one group of tensors being read", min(GROUP_BYTES, largest))
    on_device = RUNTIME.get(info.backend, RUNTIME["cuda"])
    runtime = ("runtime: Python and the libraries a load imports", RUNTIME_LOADING)
    loaded = [runtime, *h.text, h.vae] + ([] if first else [h.transformer])
    encoding = [h.encoding] + ([h.reading] if h.reading else [])
    phases = [Phase("load", tuple(loaded + [reading]), None if cpu else on_device),
              Phase("text cache", tuple(loaded + [h.outputs, *encoding]),
                    None if cpu else on_device + sum(b for _, b in h.text)
                    + sum(b for _, b in encoding))]
    if first:
        phases.append(Phase("transformer", (runtime, h.vae, h.outputs, h.transformer,
                                            reading), None if cpu else on_device))
    kept = [] if first else h.text  # without text first the encoders stay in RAM
    if cpu:
        step = tuple(list(step_lines) + kept + [h.vae, h.outputs])
        encoding = tuple([x for x in step if not x[0].startswith(NOT_ENCODING)]
                         + [("VAE encode: one image", encode)])
        return phases + [Phase("latent cache", encoding, None), Phase("step", step, None)]
    on_host = [h.runtime, h.outputs, *kept, h.vae]
    if swapped:
        on_host.append(("swapped blocks (pinned)", swapped))
    return phases + [Phase("latent cache", tuple(on_host), on_device + h.vae[1] + encode),
                     Phase("step", tuple(on_host), step_device)]


CPU_PHASES = {"loading the model": "load", "caching latents": "latent cache",
              "training step": "step"}
ENCODER_SHAPE = ("in_channels", "block_out_channels", "layers_per_block", "down_block_types",
                 "norm_num_groups", "mid_block_add_attention")


def vae_encode_bytes(config_dir: Path, size: tuple[int, int]) -> int:
    """Peak bytes of one image's VAE encode (fp32, no gradients) at ``size``. FLUX.1's and SD
    3.5's VAE encoders are SD's but for the latent channels (16 for 4 at 1/8 of the size), so
    SD's shipped encode law answers for them; another (a tiny twin's) is simulated on the meta
    device; cached."""
    from trainer.advisor.footprint import simulate_encode
    from trainer.advisor.model_configs import read_configs
    from trainer.config import ModelSection
    from trainer.families.spec import ASSETS

    config = json.loads((config_dir / "vae" / "config.json").read_text(encoding="utf-8"))
    sd = read_configs(ModelSection(pretrained_model_name_or_path=str(ASSETS / "sd1")))
    defaults = {"mid_block_add_attention": True}  # AutoencoderKL's
    if all(config.get(k, defaults.get(k)) == sd.vae.get(k, defaults.get(k))
           for k in ENCODER_SHAPE):
        return simulate_encode(sd, size, 1)

    def build() -> int:
        import diffusers
        import torch

        from trainer.advisor.footprint import FusedAttention, LiveBytes, _storages

        cls = getattr(diffusers, config.get("_class_name", "AutoencoderKL"))
        with torch.device("meta"):
            vae = cls.from_config(config)
        pixels = torch.zeros(1, 3, size[1], size[0], device="meta")
        if getattr(vae.config, "temperal_downsample", None) is not None:
            pixels = pixels.unsqueeze(2)  # a video VAE (Qwen-Image's): one frame
        live = LiveBytes(_storages(vae))
        with torch.no_grad(), FusedAttention(), live:
            vae.encode(pixels).latent_dist.mode()
        return live.peak
    return cached(json.dumps(["flow-encode", str(config_dir), list(size)]), build)


def sd_phases(cfg: Any, info: Any, configs: Any, phases: list[Any], text_leave: bool
              ) -> tuple[list[Phase], Optional[int]]:
    """The RAM phase by phase beside the device's, and the machine's RAM: the CPU's phases
    are all in RAM; a GPU run loads every weight in fp32 on the host first, then keeps there
    what leaves the device (the text encoders once their outputs are cached: ``text_leave``,
    the VAE once the latents are)."""
    from trainer.advisor.footprint import param_counts
    from trainer.system.device import system_memory

    if info.backend == "cpu":  # named as the flow families' phases are
        return [Phase(CPU_PHASES.get(m.phase, m.phase), m.lines, None) for m in phases], \
            info.memory_bytes
    params, total = param_counts(configs), sum(param_counts(configs).values())
    runtime = ("runtime: Python and the libraries", RUNTIME["cpu"])
    load = (("runtime: Python and the libraries a load imports", RUNTIME_LOADING),
            (f"all weights as loaded: {total / 1e6:.1f} M x fp32", total * 4),
            ("read from the files beside them", configs.load_extra_bytes))
    kept = [runtime]
    if text_leave:
        text = sum(n for k, n in params.items() if k.startswith("text_encoder"))
        kept.append((f"text encoders off the device: {text / 1e6:.1f} M x fp32", text * 4))
    if cfg.dataset.cache_latents and not cfg.sampling.sample_prompts:
        kept.append((f"VAE off the device: {params['vae'] / 1e6:.1f} M x fp32",
                     params["vae"] * 4))
    out = [Phase("load", load, RUNTIME.get(info.backend, RUNTIME["cuda"]))]
    out += [Phase(m.phase, tuple(kept), m.peak) for m in phases
            if m.phase != "loading the model"]
    return out, system_memory()
