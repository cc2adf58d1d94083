"""What one training step holds in memory and computes, found without loading a weight.

The model's components are built from their configs on PyTorch's ``meta`` device (accelerate's
``init_empty_weights``: shapes and dtypes, no storage), prepared by the run's method as in a run
(LoRA adapters injected, what trains unfrozen), and one training step runs on meta tensors:
:class:`LiveBytes` follows every tensor the step creates until it is freed, so its peak is the
step's own memory (saved activations, their gradients, the parameters' gradients,
temporaries); a second pass under ``torch.utils.flop_counter.FlopCounterMode`` counts the
floating-point operations. A VAE encode is measured the same way, without gradients. Attention
is counted as fused kernels run it (PyTorch's flash and memory-efficient SDPA on GPUs, its flash
kernel on CPUs): output and one log-sum-exp per row kept, never the N x N scores that the meta
device's unfused fallback would hold. The configs come from :mod:`trainer.advisor.model_configs`.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.advisor.disk_cache import stored
from trainer.advisor.model_configs import (  # noqa: F401 - read_configs is the entry
    ENCODERS,
    ModelConfigs,
    cached,
    embedded_configs,
    read_configs,
)

# A fused attention backward recomputes the scores: about 2.5 forwards of work (Dao 2023,
# "FlashAttention-2", section 3.1.2 counts 5 matmuls backward against 2 forward).
ATTENTION_BACKWARD = 2.5
TEXT_LENGTH = 77


def meta_model(configs: ModelConfigs) -> SimpleNamespace:
    """The components on the meta device, shaped like a loaded ``BaseModel``."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    classes = {"text_encoder": CLIPTextModel, "text_encoder_2": CLIPTextModelWithProjection}
    with init_empty_weights(include_buffers=True):
        parts = {"unet": UNet2DConditionModel.from_config(configs.unet),
                 "vae": AutoencoderKL.from_config(configs.vae)}
        for name, config in configs.text_encoders:
            parts[name] = classes[name](CLIPTextConfig.from_dict(config))
    parts.setdefault("text_encoder_2", None)
    return SimpleNamespace(**parts, version="sdxl" if configs.family == "sdxl" else "sd1",
                           tokenizer=None, tokenizer_2=None)


def param_counts(configs: ModelConfigs) -> dict[str, int]:
    """Parameters of each component: unet, vae, text_encoder(, text_encoder_2)."""
    def build() -> dict[str, int]:
        model = meta_model(configs)
        names = ["unet", "vae"] + [name for name, _ in configs.text_encoders]
        return {n: sum(p.numel() for p in getattr(model, n).parameters()) for n in names}
    return stored("params:" + configs.key, build)


# --- measuring on the meta device ----------------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors created under it that are still alive, and their peak. A
    storage counts once however many views share it; ``ignore`` holds the storages of tensors
    that existed before (weights, inputs)."""

    def __init__(self, ignore: set[int]):
        super().__init__()
        self.ignore, self.live, self.peak, self.ops = ignore, 0, 0, 0
        self._refs: dict[int, list[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        out = func(*args, **(kwargs or {}))
        self._track_all(out)
        return out

    def _track_all(self, value: Any) -> None:
        # not torch's tree_flatten: its recursive closure is a reference cycle that would keep
        # the outputs alive until the garbage collector runs, and count them as held
        if isinstance(value, torch.Tensor):
            self._track(value)
        elif isinstance(value, (tuple, list)):
            for item in value:
                self._track_all(item)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.ignore:
            return
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]


class _FusedAttention(torch.autograd.Function):
    """Shapes and saved tensors of a fused SDPA kernel, on meta tensors."""

    @staticmethod
    def forward(ctx, q, k, v, flops):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.flops = flops
        work = 4 * q.shape[:-1].numel() * k.shape[-2] * q.shape[-1]
        flops[0] += work
        ctx.work = work
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        ctx.flops[0] += ATTENTION_BACKWARD * ctx.work
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


class FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :class:`_FusedAttention` in this thread."""

    def __init__(self, flops: list[float]):
        super().__init__()
        self.flops = flops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            kwargs = kwargs or {}  # diffusers' attention dispatch passes them by name
            q, k, v = args[:3] if len(args) >= 3 else (kwargs["query"], kwargs["key"],
                                                       kwargs["value"])
            return _FusedAttention.apply(q, k, v, self.flops)
        return func(*args, **(kwargs or {}))


def _checkpoint_func(flops: list[float]):
    """diffusers' gradient checkpointing, whose recomputation sees the fused attention too."""
    from torch.utils.checkpoint import checkpoint

    def run(module, *args):
        def block(*inner):
            with FusedAttention(flops):
                return module(*inner)
        return checkpoint(block, *args, use_reentrant=False)
    return run


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
        for module in (model.unet, model.vae, *encoders):
            module.requires_grad_(False)
        for encoder in encoders:
            encoder.get_input_embeddings().weight.requires_grad_(True)
        return
    from trainer.methods import get_method

    get_method(cfg).prepare(model)


def _conditioning(model: Any, configs: ModelConfigs, dtype: torch.dtype, batch: int):
    """The UNet's text inputs: through the text encoders when one trains, else given."""
    unet, sdxl = configs.unet, configs.family == "sdxl"
    encoders = [getattr(model, name) for name, _ in configs.text_encoders]
    pooled = None
    if any(p.requires_grad for e in encoders for p in e.parameters()):
        ids = torch.zeros(batch, TEXT_LENGTH, dtype=torch.long, device="meta")
        if sdxl:
            outs = [e(ids, output_hidden_states=True) for e in encoders]
            hidden = torch.cat([o.hidden_states[-2] for o in outs], dim=-1)
            pooled = outs[-1][0]
        else:
            hidden = encoders[0](ids)[0]
    else:
        hidden = torch.zeros(batch, TEXT_LENGTH, unet["cross_attention_dim"], device="meta",
                             dtype=dtype)
        if sdxl:
            width = (unet["projection_class_embeddings_input_dim"]
                     - 6 * unet["addition_time_embed_dim"])
            pooled = torch.zeros(batch, width, device="meta", dtype=dtype)
    if not sdxl:
        return hidden, None
    return hidden, {"text_embeds": pooled,
                    "time_ids": torch.zeros(batch, 6, device="meta", dtype=dtype)}


def latent_factor(configs: ModelConfigs) -> int:
    return 2 ** (len(configs.vae.get("block_out_channels", (0,) * 4)) - 1)


def simulate_step(configs: ModelConfigs, cfg: Any, bucket: tuple[int, int], batch: int,
                  dtype: torch.dtype, checkpointing: bool) -> StepFootprint:
    """The footprint of one step of ``batch`` images of ``bucket`` (width, height); cached.
    Raises ValueError when the settings train nothing."""
    key = json.dumps(["step", configs.key, cfg.mode, cfg.network.model_dump(mode="json"),
                      list(bucket), batch, str(dtype), checkpointing])

    def build() -> StepFootprint:
        model, nets = _training_model(configs, cfg, dtype, checkpointing, [0.0])
        learning = [p for n in nets for p in n.parameters() if p.requires_grad]
        trained = sum(p.numel() for p in learning)
        live = LiveBytes(_storages(*nets))
        _one_step(model, configs, bucket, batch, dtype, [0.0], live)
        flops = batch * simulate_flops(configs, cfg, bucket, checkpointing)
        return StepFootprint(
            max(0, live.peak - trained * dtype.itemsize), flops, trained,
            sum(p.numel() for n in nets for p in n.parameters() if not p.requires_grad),
            sum(factored_size(tuple(p.shape)) for p in learning), live.ops, len(learning))
    return stored(key, build, asdict, lambda d: StepFootprint(**d))


def simulate_flops(configs: ModelConfigs, cfg: Any, bucket: tuple[int, int],
                   checkpointing: bool) -> float:
    """Floating-point operations of a step at batch 1 (they grow with the batch); cached. A
    pass of its own: FlopCounterMode's tree maps hold tensors in reference cycles, which
    would count as memory."""
    from torch.utils.flop_counter import FlopCounterMode

    def build() -> float:
        attention = [0.0]
        model, _ = _training_model(configs, cfg, torch.float32, checkpointing, attention)
        counter = FlopCounterMode(display=False)
        _one_step(model, configs, bucket, 1, torch.float32, attention, counter)
        return counter.get_total_flops() + attention[0]
    key = json.dumps(["flops", configs.key, cfg.mode, cfg.network.model_dump(mode="json"),
                      list(bucket), checkpointing])
    return stored(key, build, float, float)


def _training_model(configs: ModelConfigs, cfg: Any, dtype: torch.dtype,
                    checkpointing: bool, attention: list[float]) -> tuple[Any, list[Any]]:
    """The meta model prepared for training as the run prepares it."""
    model = meta_model(configs)
    prepare_training(model, cfg)
    nets = [model.unet] + [getattr(model, name) for name, _ in configs.text_encoders]
    for net in nets:  # nn.Module's own .to: diffusers' warns about fp32 modules needlessly
        torch.nn.Module.to(net, dtype)
    if checkpointing:
        model.unet.enable_gradient_checkpointing(_checkpoint_func(attention))
    model.unet.train()
    for encoder in nets[1:]:
        encoder.train(any(p.requires_grad for p in encoder.parameters()))
    return model, nets


def _one_step(model: Any, configs: ModelConfigs, bucket: tuple[int, int], batch: int,
              dtype: torch.dtype, attention: list[float], mode: Any) -> None:
    """Forward, loss and backward on meta tensors, under ``mode``."""
    factor = latent_factor(configs)
    latents = torch.zeros(batch, configs.unet["in_channels"], bucket[1] // factor,
                          bucket[0] // factor, device="meta", dtype=dtype)
    timesteps = torch.zeros(batch, dtype=torch.long, device="meta")
    with FusedAttention(attention), mode:
        hidden, added = _conditioning(model, configs, dtype, batch)
        pred = model.unet(latents, timesteps, hidden, added_cond_kwargs=added).sample
        loss = F.mse_loss(pred.float(), torch.zeros_like(pred, dtype=torch.float32))
        loss.backward()
        del pred, loss, hidden, added


def simulate_encode(configs: ModelConfigs, bucket: tuple[int, int], batch: int) -> int:
    """Peak bytes of a VAE encode of ``batch`` images (fp32, no gradients); cached."""
    def build() -> int:
        vae = meta_model(configs).vae
        pixels = torch.zeros(batch, 3, bucket[1], bucket[0], device="meta")
        live = LiveBytes(_storages(vae))
        with torch.no_grad(), FusedAttention([0.0]), live:
            vae.encode(pixels).latent_dist.mode()
        return live.peak
    return stored(json.dumps(["encode", configs.key, list(bucket), batch]), build, int, int)
