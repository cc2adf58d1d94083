"""fp8 base weights (model.base_precision = "fp8", issue 19): the tiny FLUX.1 and SDXL LoRAs
train on the CPU with the frozen weights stored in float8_e4m3fn, their losses stay close to
the bf16 run's, and the file they write loads in diffusers on a full-precision base."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusionXLPipeline
from torch.utils._python_dispatch import TorchDispatchMode
from train_helpers import one_image_dataset, small_config

from trainer.config.files import from_dict
from trainer.events import ListSink, Log, Step
from trainer.models.loader import resolve_model_path
from trainer.models.memory import FP8, store_fp8
from trainer.run.loop import run

MODELS = {"flux1": ("embedded:tiny-flux", FluxPipeline),
          "sdxl": ("embedded:tiny-sdxl", StableDiffusionXLPipeline)}
STEPS = 20
# fp8 e4m3 keeps 3 mantissa bits (a relative rounding error up to 1/16 per weight); over 20
# steps the per-step losses measured within 0.06% (FLUX.1) and 0.8% (SDXL) of the bf16 run's
TOLERANCE = 0.03


def _config(tmp_path, family: str, base: str):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    return small_config(
        tmp_path / base, data,
        model={"pretrained_model_name_or_path": MODELS[family][0], "base_precision": base},
        training={"max_train_steps": STEPS, "mixed_precision": "bf16", "seed": 3},
        network={"network_dim": 4, "network_alpha": 4.0,  # diffusers' FLUX.1 converter
                 **({"train_blocks": "double"} if family == "flux1" else {})},  # fixed sizes
        optimizer={"learning_rate": 1e-3})


def _train(cfg) -> tuple[list[float], list[str]]:
    sink = ListSink()
    run(cfg, sink)
    losses = [e.loss for e in sink.events if isinstance(e, Step)]
    logs = [e.message for e in sink.events if isinstance(e, Log)]
    assert len(losses) == STEPS, logs[-3:]
    return losses, logs


@pytest.mark.parametrize("family", ["flux1", "sdxl"])
def test_fp8_base_trains_like_bf16_and_the_file_loads_in_diffusers(tmp_path, family):
    full, _ = _train(_config(tmp_path, family, "full"))
    cfg = _config(tmp_path, family, "fp8")
    fp8, logs = _train(cfg)
    assert any("stored in fp8" in m for m in logs)
    # the CPU casts fp8 slowly: the log says so and what to use instead
    assert any(m.startswith("model.base_precision = 'fp8' on the CPU") for m in logs)
    # without checkpointing a step keeps every layer's bf16 copy: the log says so
    assert not cfg.training.gradient_checkpointing
    assert any("without training.gradient_checkpointing" in m for m in logs)
    assert fp8 != full  # the weights really were rounded to fp8
    print("largest relative difference", max(abs(a - b) / abs(a) for a, b in zip(full, fp8)))
    for a, b in zip(full, fp8):
        assert abs(a - b) <= TOLERANCE * max(abs(a), 1e-3), (full, fp8)
    files = sorted((tmp_path / "fp8" / "out").glob("*.safetensors"))
    assert files
    pipe = MODELS[family][1].from_pretrained(str(resolve_model_path(MODELS[family][0])),
                                             local_files_only=True)
    denoiser = pipe.transformer if family == "flux1" else pipe.unet
    pipe.load_lora_weights(str(files[-1]))
    loaded = [k for k, v in denoiser.state_dict().items() if ".lora_B." in k]
    assert loaded and any(denoiser.state_dict()[k].abs().max() > 0 for k in loaded)
    assert all(v.dtype != FP8 for v in denoiser.state_dict().values())


def test_fp8_storage_keeps_norms_embeddings_and_adapters_and_computes_the_same(tmp_path):
    """Weights rounded to fp8 once give the same output as the layerwise-cast model, whose
    norms, embedders and peft adapters keep their dtype."""
    from peft import LoraConfig, inject_adapter_in_model

    pipe = FluxPipeline.from_pretrained(str(resolve_model_path("embedded:tiny-flux")),
                                        local_files_only=True)
    model = pipe.transformer.to(torch.bfloat16).requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q"]), model)
    store_fp8(model, torch.bfloat16)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    rounded = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    assert dtypes["transformer_blocks.0.attn.to_k.weight"] == FP8
    assert dtypes["transformer_blocks.0.attn.to_q.base_layer.weight"] == FP8
    assert dtypes["transformer_blocks.0.attn.to_q.lora_A.default.weight"] == torch.bfloat16
    assert dtypes["x_embedder.weight"] == torch.bfloat16
    assert dtypes["transformer_blocks.0.norm1.linear.weight"] == FP8  # as sd-scripts' fp8
    assert all(d == torch.bfloat16 for k, d in dtypes.items() if "embed" in k
               or k.startswith("proj_out"))
    x = torch.randn(1, 16, model.config.in_channels, dtype=torch.bfloat16)
    kwargs = dict(hidden_states=x, timestep=torch.tensor([0.5]),
                  encoder_hidden_states=torch.randn(1, 4, model.config.joint_attention_dim,
                                                    dtype=torch.bfloat16),
                  pooled_projections=torch.randn(1, model.config.pooled_projection_dim,
                                                 dtype=torch.bfloat16),
                  img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(4, 3), return_dict=False,
                  guidance=torch.tensor([3.5]) if model.config.guidance_embeds else None)
    with torch.no_grad():
        got = model(**kwargs)[0]
    reference = FluxPipeline.from_pretrained(str(resolve_model_path("embedded:tiny-flux")),
                                             local_files_only=True).transformer
    reference = reference.to(torch.bfloat16)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q"]), reference)
    reference.load_state_dict(rounded)
    with torch.no_grad():
        want = reference(**kwargs)[0]
    assert torch.equal(got, want)


def tiny_flux_file(tmp_path, dtype):
    """The embedded tiny FLUX.1 as one all-in-one file in ``dtype``, a folder of its configs
    (no weights), its diffusers folder and its components: (file, configs, folder, parts)."""
    import shutil

    from trainer.families.common.mmdit_checkpoint import save_flow_checkpoint
    from trainer.families.common.tiny_mmdit import save_tiny_flow_model

    folder = save_tiny_flow_model(tmp_path / "flux", family="flux")
    configs = tmp_path / "configs"
    shutil.copytree(folder, configs, ignore=shutil.ignore_patterns("*.safetensors",
                                                                    "tokenizer*"))
    original = FluxPipeline.from_pretrained(folder, local_files_only=True).components
    path = save_flow_checkpoint(tmp_path / "flux.safetensors", original, "flux1-dev",
                                parts=["transformer", "vae", "clip_l", "t5xxl"], dtype=dtype)
    return path, configs, folder, original


def test_dreambooth_refuses_a_low_precision_base(tmp_path):
    with pytest.raises(ValueError, match="model.base_precision"):
        from_dict({"mode": "dreambooth", "model": {"base_precision": "fp8"}})


def test_an_fp8_checkpoint_is_stored_as_shipped(tmp_path):
    """A FLUX.1 single file shipped in fp8, loaded at the compute dtype and stored in fp8 by
    model.base_precision = "fp8": every cast weight is the file's fp8 tensor, bit for bit
    (e4m3 -> bf16 -> e4m3 is exact)."""

    from trainer.families.common.mmdit_checkpoint import flow_state_dict
    from trainer.families.common.mmdit_single_file import load_flow_components

    path, configs, folder, original = tiny_flux_file(tmp_path, FP8)
    shipped = flow_state_dict({"transformer": original["transformer"]}, "flux1-dev")
    shipped = {k: v.to(FP8) for k, v in shipped.items()}
    transformer = load_flow_components(path, config_dir=str(configs), tokenizer=str(folder),
                                       dtype=torch.bfloat16)["transformer"]
    store_fp8(transformer.requires_grad_(False), torch.bfloat16)
    stored = {k: v for k, v in flow_state_dict({"transformer": transformer}, "flux1-dev").items()}
    cast = [k for k, v in stored.items() if v.dtype == FP8]
    assert len(cast) > len(stored) // 2
    for key in cast:
        assert torch.equal(stored[key].view(torch.uint8), shipped[key].view(torch.uint8)), key


def test_fp8_text_encoders_store_t5_in_fp8_and_the_run_trains(tmp_path, monkeypatch):
    from trainer.methods.lora import LoraMethod

    data = tmp_path / "data"
    one_image_dataset(data)
    cfg = small_config(tmp_path / "t5", data,
                       model={"pretrained_model_name_or_path": "embedded:tiny-flux",
                              "fp8_text_encoders": True},
                       dataset={"cache_text_encoder_outputs": False})
    seen = {}
    real_save = LoraMethod.save

    def save(self, path, model, facts, final=True):
        seen["t5"] = {k: v.dtype for k, v in model.text_encoder_2.state_dict().items()}
        return real_save(self, path, model, facts, final)

    monkeypatch.setattr(LoraMethod, "save", save)
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert seen["t5"]["encoder.block.0.layer.0.SelfAttention.q.weight"] == FP8
    assert seen["t5"]["shared.weight"] != FP8  # the embedding stays
    assert any("T5 text encoder stored in fp8" in e.message for e in sink.events
               if isinstance(e, Log))


def _saved_bf16_weight_bytes(checkpointing: bool) -> tuple[int, int]:
    """(bytes of bf16 weight-shaped tensors autograd saved in a forward through fp8-stored
    frozen Linears behind an input that needs its gradient, the layers' bf16 size)."""
    from torch.utils.checkpoint import checkpoint

    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(4)])
    layers.to(torch.bfloat16).requires_grad_(False)
    store_fp8(layers, torch.bfloat16)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = checkpoint(layers, x, use_reentrant=False) if checkpointing else layers(x)
    y.float().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    weights = sum(t.numel() * t.element_size() for t in saved
                  if t.shape == (64, 64) and t.dtype == torch.bfloat16)
    return weights, 4 * 64 * 64 * 2


def test_fp8_storage_keeps_every_compute_copy_without_checkpointing_and_none_with_it():
    """What trainer/advisor/base_weights.py and the run's warning rest on: fp8 storage
    computes each fp8 layer from a bf16 copy, which autograd keeps for the backward pass, so
    without checkpointing a step holds the weights in both precisions."""
    kept, all_layers = _saved_bf16_weight_bytes(checkpointing=False)
    assert kept == all_layers
    kept, _ = _saved_bf16_weight_bytes(checkpointing=True)
    assert kept == 0


class Upcasts(TorchDispatchMode):
    """Counts the elements of every full-width tensor an op makes from an fp8 one."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        if isinstance(out, torch.Tensor) and out.device.type == "cpu" and \
                out.dtype.is_floating_point and out.dtype != FP8 and \
                any(a.dtype == FP8 for a in inputs):
            self.elements += out.numel()
        return out


@pytest.mark.parametrize("shipped", [FP8, torch.bfloat16])
def test_the_loader_streams_the_transformer_into_fp8_storage(tmp_path, monkeypatch, shipped):
    """model.base_precision = "fp8" on a FLUX.1 single file: the transformer streams from the
    file group by group and each group's stored weights are fp8 as soon as they are filled;
    from an fp8 file they are never upcast at all: no full-width copy of a stored tensor is
    made (only the weights that stay at full width are upcast), so the load never holds the
    transformer at full width (issue 29); T5 with fp8_t5 likewise, a group at a time. The
    result equals the bf16-built modules stored in fp8 afterwards, bit for bit."""

    from trainer.families.common import mmdit_parts as fsf
    from trainer.families.common.mmdit_single_file import load_flow_components
    from trainer.models import streamed_load
    from trainer.models.memory import T5_SKIP, fp8_parameter_names

    path, configs, folder, _ = tiny_flux_file(tmp_path, shipped)
    load = dict(config_dir=str(configs), tokenizer=str(folder), dtype=torch.bfloat16)
    monkeypatch.setattr(streamed_load, "GROUP_BYTES", 4096)  # many groups on a tiny model
    monkeypatch.setattr(fsf, "GROUP_BYTES", 4096)
    taken, wide = [], []
    real_take, real_fill = fsf.Weights.take, streamed_load.fill

    def take(self, prefix, *args, **kwargs):
        taken.append(prefix)
        return real_take(self, prefix, *args, **kwargs)

    def fill(model, tensors, names, *args, **kwargs):
        real_fill(model, tensors, names, *args, **kwargs)
        wide.append(sum(t.numel() for n, t in model.named_parameters()
                        if n in names and t.device.type != "meta" and t.dtype != FP8))

    monkeypatch.setattr(fsf.Weights, "take", take)
    monkeypatch.setattr(streamed_load, "fill", fill)
    with Upcasts() as upcasts:
        streamed = load_flow_components(path, **load, fp8_transformer=True, fp8_t5=True)
    assert taken == ["vae."]  # the transformer streamed, the text encoders group by group
    assert len(wide) > 10 and max(wide) == 0  # every group stored in fp8 as it arrived
    full_width = sum(t.numel() for part, skip in (("transformer", None),
                                                   ("text_encoder_2", T5_SKIP))
                     for n, t in streamed[part].named_parameters()
                     if n not in fp8_parameter_names(streamed[part], *([skip] if skip else [])))
    if shipped == FP8:  # only what stays at full width was upcast (the VAE and CLIP too)
        others = sum(t.numel() for part in ("vae", "text_encoder")
                     for t in streamed[part].parameters())
        assert 0 < upcasts.elements <= full_width + others
    else:
        assert upcasts.elements == 0
    monkeypatch.undo()
    reference = load_flow_components(path, **load)
    store_fp8(reference["transformer"].requires_grad_(False), torch.bfloat16)
    store_fp8(reference["text_encoder_2"].requires_grad_(False), torch.bfloat16, T5_SKIP)
    for part in ("transformer", "text_encoder_2", "text_encoder", "vae"):
        got, want = streamed[part].state_dict(), reference[part].state_dict()
        assert got.keys() == want.keys()
        for key in got:
            assert got[key].dtype == want[key].dtype, (part, key)
            a, b = (t.view(torch.uint8) if t.dtype == FP8 else t for t in (got[key], want[key]))
            assert torch.equal(a, b), (part, key)
        stored = sum(t.dtype == FP8 for t in got.values())
        assert stored > len(got) // 2 if part in ("transformer", "text_encoder_2") else not stored


def test_t5s_fp32_layers_are_stored_in_fp8_and_compute_in_fp32():
    """T5's own fp32 list (``wo``) is stored in fp8 like its other Linear layers (an fp8 T5
    file's ``wo`` is fp8 already; upcast it held 4.0 GB more of T5-XXL), and computes in fp32
    as transformers means it to: the copy stands in from the parent's forward on, since the
    parent casts its input to ``wo``'s dtype (it used to be fp8 there). The output equals a T5
    holding the same fp8 values at full width, bit for bit."""
    import copy

    from trainer.families.common.tiny_mmdit import build_flux_components
    from trainer.models.memory import T5_SKIP, to_compute_dtype

    t5 = build_flux_components()["text_encoder_2"].eval().requires_grad_(False)
    reference = copy.deepcopy(t5)
    stored = copy.deepcopy(t5)
    store_fp8(stored, torch.float32, T5_SKIP)
    wo = [m for n, m in stored.named_modules() if n.endswith("DenseReluDense.wo")]
    assert wo and all(m.weight.dtype == FP8 for m in wo)
    for ref, got in zip(reference.parameters(), stored.parameters()):
        if got.dtype == FP8:
            ref.data = got.data.to(torch.float32)  # the same values at full width
    ids = torch.randint(0, t5.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(stored(ids).last_hidden_state, reference(ids).last_hidden_state)

    seen = []
    wo[0].register_forward_pre_hook(lambda m, args: seen.append((args[0].dtype, m.weight.dtype)))
    to_compute_dtype(stored, torch.bfloat16)  # as a bf16 run has it
    store_fp8(stored, torch.bfloat16, T5_SKIP)  # computed in bf16: wo still in fp32
    with torch.no_grad():
        stored(ids)
    assert seen == [(torch.float32, torch.float32)]
    assert wo[0].weight.dtype == FP8  # stored again after the forward
