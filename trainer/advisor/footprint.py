"""What one training step holds in memory and computes, found without loading a weight.

The model's components are built from their configs on PyTorch's ``meta`` device (accelerate's
``init_empty_weights``: shapes and dtypes, no storage), prepared by the run's method as in a run
(LoRA adapters injected, what trains unfrozen), and one training step runs on meta tensors:
:class:`~trainer.advisor.live_bytes.LiveBytes` follows every tensor the step creates until it
is freed, so its peak is the step's own memory (saved activations, their gradients, the
parameters' gradients, temporaries), and counts the floating-point operations in the same pass.
Attention is counted as fused kernels run it (:mod:`trainer.advisor.live_bytes`). A VAE encode
is measured the same way, without gradients.

Two such steps give the step's law (:mod:`trainer.advisor.law`): its memory and work for every
bucket, batch and LoRA rank, so that one pair of simulations (tens of seconds on a CPU for a
full-size UNet) answers every later question at once; the families' models come with their
laws made (:mod:`trainer.advisor.shipped`). The configs come from
:mod:`trainer.advisor.model_configs`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Optional

import torch
import torch.nn.functional as F

from trainer.advisor import law_keys as laws
from trainer.advisor.disk_cache import stored
from trainer.advisor.law import Law, Recording, law_from, second_values, value
from trainer.advisor.live_bytes import (  # noqa: F401 - the measuring, for flow_memory too
    FusedAttention,
    LiveBytes,
    Work,
    _checkpoint_func,
)
from trainer.advisor.model_configs import (  # noqa: F401 - read_configs is the entry
    ENCODERS,
    ModelConfigs,
    cached,
    embedded_configs,
    read_configs,
)

TEXT_LENGTH = 77


def meta_model(configs: ModelConfigs) -> SimpleNamespace:
    """The components on the meta device, shaped like a loaded ``BaseModel``."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    classes = {"text_encoder": CLIPTextModel, "text_encoder_2": CLIPTextModelWithProjection}
    with init_empty_weights(include_buffers=True):
        parts = {"denoiser": UNet2DConditionModel.from_config(configs.unet),
                 "vae": AutoencoderKL.from_config(configs.vae)}
        for name, config in configs.text_encoders:
            parts[name] = classes[name](CLIPTextConfig.from_dict(config))
    parts.setdefault("text_encoder_2", None)
    return SimpleNamespace(**parts, version=configs.version, tokenizer=None, tokenizer_2=None)


def param_counts(configs: ModelConfigs) -> dict[str, int]:
    """Parameters of each component: unet, vae, text_encoder(, text_encoder_2)."""
    def build() -> dict[str, int]:
        model = meta_model(configs)
        names = ["unet", "vae"] + [name for name, _ in configs.text_encoders]
        parts = {n: model.denoiser if n == "unet" else getattr(model, n) for n in names}
        return {n: sum(p.numel() for p in part.parameters()) for n, part in parts.items()}
    return stored("params:" + configs.key, build, model=configs.key)


def _storages(*modules: Any) -> set[int]:
    out = set()
    for module in modules:
        if module is not None:
            out |= {t.untyped_storage()._cdata for t in module.parameters()}
            out |= {t.untyped_storage()._cdata for t in module.buffers()}
    return out


# --- one training step -----------------------------------------------------------------------

@dataclass(frozen=True)
class StepFootprint:
    """One training step, measured on the meta device."""

    step_bytes: int  # the step's own tensors at their peak, the parameters' gradients excluded
    flops: float  # forward and backward (and the recomputation of checkpointed blocks)
    trained: int  # parameters that train (LoRA's adapters, the whole UNet, the embeddings)
    frozen: int  # parameters of the UNet and text encoders that do not
    factored: int  # Adafactor's second-moment entries for the trained parameters
    ops: int = 0  # operations dispatched (each costs a launch, whatever its size)
    tensors: int = 0  # trained parameter tensors (an optimizer without foreach loops on them)


def factored_size(shape: tuple[int, ...]) -> int:
    """Entries of Adafactor's second moment for a parameter: a row and a column factor over
    the last two dimensions (Shazeer & Stern 2018, as transformers' Adafactor keeps them),
    the whole tensor below two dimensions."""
    if len(shape) < 2:
        return math.prod(shape)
    return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]


def prepare_training(model: Any, cfg: Any) -> None:
    """Freeze and unfreeze the meta model as the run's method does."""
    encoders = [e for e in (model.text_encoder, model.text_encoder_2) if e is not None]
    if cfg.mode == "textual_inversion":  # the method needs a tokenizer; what trains is this
        for module in (model.denoiser, model.vae, *encoders):
            module.requires_grad_(False)
        for encoder in encoders:
            encoder.get_input_embeddings().weight.requires_grad_(True)
        return
    from trainer.methods import get_method

    get_method(cfg).prepare(model)


def _conditioning(model: Any, configs: ModelConfigs, dtype: torch.dtype, batch: int):
    """The UNet's text inputs: through the text encoders when one trains, else given (the
    family's memory role: trainer/families/<folder>/memory.py)."""
    from trainer.families import role

    encoders = [getattr(model, name) for name, _ in configs.text_encoders]
    trained = any(p.requires_grad for e in encoders for p in e.parameters())
    return role(configs.version, "memory").unet_text_inputs(
        encoders, configs.unet, batch, dtype, TEXT_LENGTH, trained)


def latent_factor(configs: ModelConfigs) -> int:
    return 2 ** (len(configs.vae.get("block_out_channels", (0,) * 4)) - 1)



def simulate_step(configs: ModelConfigs, cfg: Any, bucket: tuple[int, int], batch: int,
                  dtype: torch.dtype, checkpointing: bool, full: bool = False) -> StepFootprint:
    """The footprint of one step of ``batch`` images of ``bucket`` (width, height): from the
    step's law (:func:`step_law`: any bucket, batch and LoRA rank), or where the law cannot be
    had, or with ``full``, simulated at these values; cached. Raises ValueError when the
    settings train nothing.

    The law is exact on the UNet's grid: sides that the VAE and the UNet halve evenly down to
    its deepest level (SD 1.x / 2.x: multiples of 64 px, SDXL: 32). Off it the UNet rounds its
    deeper levels up, which a law linear in the pixels does not follow: it is then low by
    0.1-0.4% for SD 1.5 (288-800 px), up to a few percent for the tiny model's small levels."""
    law = None if full else step_law(configs, cfg, dtype, checkpointing, batch)
    if law is None:
        return simulate_point(configs, cfg, bucket, batch, dtype, checkpointing)
    return law_footprint(law, configs, cfg, bucket, batch, dtype)


def law_footprint(law: Law, configs: ModelConfigs, cfg: Any, bucket: tuple[int, int],
                  batch: int, dtype: torch.dtype) -> StepFootprint:
    """A step's footprint from its law at these values."""
    factor = latent_factor(configs)
    x = (batch, bucket[1] / factor, bucket[0] / factor) + laws.rank_values(cfg)
    named = {name: value(terms, x) for name, terms in law.named.items()}
    return StepFootprint(
        max(0, int(round(law.peak(x) - named["trained"] * dtype.itemsize))), value(law.work, x),
        int(round(named["trained"])), int(round(named["frozen"])),
        int(round(named["factored"])), law.ops, int(round(named["tensors"])))


def simulate_point(configs: ModelConfigs, cfg: Any, bucket: tuple[int, int], batch: int,
                   dtype: torch.dtype, checkpointing: bool) -> StepFootprint:
    """One step simulated at these values (memory and work in one pass); cached."""
    key = json.dumps(["step", configs.key, cfg.mode, cfg.network.model_dump(mode="json"),
                      list(bucket), batch, str(dtype), checkpointing])

    def build() -> StepFootprint:
        work = Work()
        model, nets = _training_model(configs, cfg, dtype, checkpointing, work)
        learning = [p for n in nets for p in n.parameters() if p.requires_grad]
        trained = sum(p.numel() for p in learning)
        live = LiveBytes(_storages(*nets), work)
        _one_step(model, configs, bucket, batch, dtype, work, live)
        return StepFootprint(
            max(0, live.peak - trained * dtype.itemsize), work.total, trained,
            sum(p.numel() for n in nets for p in n.parameters() if not p.requires_grad),
            sum(factored_size(tuple(p.shape)) for p in learning), live.ops, len(learning))
    return stored(key, build, asdict, lambda d: StepFootprint(**d), model=configs.key)


def step_law(configs: ModelConfigs, cfg: Any, dtype: torch.dtype, checkpointing: bool,
             batch: int = 2, simulate: bool = True) -> Optional[Law]:
    """The step's law (:mod:`trainer.advisor.law`) for this model, method, network, dtype,
    checkpointing and batch 1 or more, from two simulations; cached (and shipped for the
    families' models, :mod:`trainer.advisor.shipped`). None when the two simulations differ
    in their operations, or without ``simulate`` when it would take them."""
    key = laws.step_key(configs, cfg, dtype, checkpointing, batch)

    def build() -> Optional[Law]:
        first = laws.first_values(configs, batch)
        varied = laws.varied(cfg, batch)
        one, two = (record_step(configs, cfg, values, dtype, checkpointing)
                    for values in (first, second_values(first, varied)))
        return law_from(one, two, first, varied)
    return stored(key, build, _law_json, _json_law, model=configs.key, simulate=simulate)


def record_step(configs: ModelConfigs, cfg: Any, values: tuple[int, ...], dtype: torch.dtype,
                checkpointing: bool) -> Recording:
    """One step simulated at ``values`` (batch, latent height and width, ranks), recorded."""
    cfg = laws.with_changes(cfg, laws.recording_changes(cfg, values))
    record = Recording()
    work = Work(record.work)
    model, nets = _training_model(configs, cfg, dtype, checkpointing, work)
    params = [p for n in nets for p in n.parameters()]
    learning = [p for p in params if p.requires_grad]
    factored = [n for p in learning for n in ((p.shape[:-1].numel(), p.shape[:-2].numel()
                                               * p.shape[-1]) if p.dim() >= 2 else (p.numel(),))]
    record.named = {"trained": [p.numel() for p in learning], "factored": factored,
                    "frozen": [p.numel() for p in params if not p.requires_grad],
                    "tensors": [1] * len(learning)}
    live = LiveBytes(_storages(*nets), work, record)
    factor = latent_factor(configs)
    _one_step(model, configs, (values[2] * factor, values[1] * factor), values[0], dtype, work,
              live)
    live.record, record.ops = None, live.ops  # what is freed later is not this step's
    return record


def _training_model(configs: ModelConfigs, cfg: Any, dtype: torch.dtype,
                    checkpointing: bool, work: Work) -> tuple[Any, list[Any]]:
    """The meta model prepared for training as the run prepares it."""
    model = meta_model(configs)
    prepare_training(model, cfg)
    nets = [model.denoiser] + [getattr(model, name) for name, _ in configs.text_encoders]
    for net in nets:  # nn.Module's own .to: diffusers' warns about fp32 modules needlessly
        torch.nn.Module.to(net, dtype)
    if checkpointing:
        model.denoiser.enable_gradient_checkpointing(_checkpoint_func(work))
    model.denoiser.train()
    for encoder in nets[1:]:
        encoder.train(any(p.requires_grad for p in encoder.parameters()))
    return model, nets


def _one_step(model: Any, configs: ModelConfigs, bucket: tuple[int, int], batch: int,
              dtype: torch.dtype, work: Work, mode: Any) -> None:
    """Forward, loss and backward on meta tensors, under ``mode``."""
    factor = latent_factor(configs)
    latents = torch.zeros(batch, configs.unet["in_channels"], bucket[1] // factor,
                          bucket[0] // factor, device="meta", dtype=dtype)
    timesteps = torch.zeros(batch, dtype=torch.long, device="meta")
    with FusedAttention(work), mode:
        hidden, added = _conditioning(model, configs, dtype, batch)
        pred = model.denoiser(latents, timesteps, hidden, added_cond_kwargs=added).sample
        loss = F.mse_loss(pred.float(), torch.zeros_like(pred, dtype=torch.float32))
        loss.backward()
        del pred, loss, hidden, added


def simulate_encode(configs: ModelConfigs, bucket: tuple[int, int], batch: int,
                    full: bool = False) -> int:
    """Peak bytes of a VAE encode of ``batch`` images (fp32, no gradients), from the encode's
    law or (without one, or with ``full``) simulated; cached."""
    factor = latent_factor(configs)
    law = None if full else encode_law(configs, batch)
    if law is not None:
        return int(round(law.peak((batch, bucket[1] / factor, bucket[0] / factor, 1, 1))))

    def build() -> int:
        vae = meta_model(configs).vae
        pixels = torch.zeros(batch, 3, bucket[1], bucket[0], device="meta")
        live = LiveBytes(_storages(vae))
        with torch.no_grad(), FusedAttention(), live:
            vae.encode(pixels).latent_dist.mode()
        return live.peak
    return stored(json.dumps(["encode", configs.key, list(bucket), batch]), build, int, int,
                  model=configs.key)


def encode_law(configs: ModelConfigs, batch: int) -> Optional[Law]:
    """The VAE encode's law (batch 1 has its own), from two encodes at 512 px and 1536 x
    2560 px (SD's VAE); cached."""
    first = (1 if batch == 1 else 2, 64, 64, 1, 1)
    varied = (batch > 1, True, True, False, False)

    def build() -> Optional[Law]:
        return law_from(*(_record_encode(configs, v) for v in (first, second_values(
            first, varied))), first, varied)
    key = json.dumps(["encode-law", configs.key, "batch 1" if batch == 1 else "batch 2+"])
    return stored(key, build, _law_json, _json_law, model=configs.key)


def _law_json(law: Optional[Law]) -> Any:
    return law.to_json() if law is not None else None


def _json_law(data: Any) -> Optional[Law]:
    return Law.from_json(data) if data is not None else None


def _record_encode(configs: ModelConfigs, values: tuple[int, ...]) -> Recording:
    vae, factor = meta_model(configs).vae, latent_factor(configs)
    pixels = torch.zeros(values[0], 3, values[1] * factor, values[2] * factor, device="meta")
    record = Recording()
    live = LiveBytes(_storages(vae), record=record)
    with torch.no_grad(), FusedAttention(), live:
        vae.encode(pixels).latent_dist.mode()
    live.record, record.ops = None, live.ops
    return record
