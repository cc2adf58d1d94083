"""DyLoRA (network.dylora_unit; Valipour et al. 2022) as sd-scripts' networks/dylora.py trains
it. The expected forward and gradients are written out here from sd-scripts' DyLoRAModule:
trainable_rank = randint(0, dim - 1) rounded down to a multiple of unit; the update uses every
rank, scaled by alpha / dim * sqrt(dim / (trainable_rank + unit)); only the ranks
trainable_rank .. trainable_rank + unit - 1 get gradients."""

import json
import math

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.train_helpers import one_image_dataset, small_config
from trainer.config import TrainConfig
from trainer.methods.dylora import DyLoraMethod, apply_dylora
from trainer.run.loop import run

DIM, UNIT, ALPHA = 6, 2, 3.0


def _net():
    model = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Conv2d(3, 4, 3, padding=1))
    inject_adapter_in_model(LoraConfig(r=DIM, lora_alpha=ALPHA, target_modules=["0", "1"],
                                       init_lora_weights="gaussian"), model)
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(p)
    full = {i: (m.lora_A["default"].weight.detach().clone(),
                m.lora_B["default"].weight.detach().clone()) for i, m in enumerate(model)}
    apply_dylora([model], UNIT, ALPHA)
    return model, full


def _sd_scripts_rank(seed: int) -> int:
    torch.manual_seed(seed)
    r = int(torch.randint(0, DIM, (1,)))  # random.randint(0, lora_dim - 1), drawn by torch here
    return r - r % UNIT


@pytest.mark.parametrize("index, x", [(0, torch.randn(2, 8)), (1, torch.randn(2, 3, 5, 5))])
def test_forward_and_gradients_follow_sd_scripts(index, x):
    model, full = _net()
    layer = model[index]
    a, b = full[index]
    for seed in range(6):
        trainable = _sd_scripts_rank(seed)
        torch.manual_seed(seed)
        out = layer(x)
        scale = ALPHA / DIM * math.sqrt(DIM / (trainable + UNIT))
        if index == 0:
            want = layer.base_layer(x) + (x @ a.T @ b.T) * scale
        else:
            h = torch.nn.functional.conv2d(x, a, padding=1)
            want = layer.base_layer(x) + torch.nn.functional.conv2d(h, b) * scale
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        for p in model.parameters():
            p.grad = None
        out.sum().backward()
        for name in ("lora_A", "lora_B"):
            ranks = getattr(layer, name)["default"].ranks
            trained = [i for i, p in enumerate(ranks) if p.grad is not None]
            assert trained == list(range(trainable, trainable + UNIT)), (name, seed)
        # the trained block's gradient is the full formula's gradient on those ranks
        a_full = a.clone().requires_grad_(True)
        if index == 0:
            ref = (x @ a_full.T @ b.T) * scale
        else:
            ref = torch.nn.functional.conv2d(
                torch.nn.functional.conv2d(x, a_full, padding=1), b) * scale
        ref.sum().backward()
        got = layer.lora_A["default"].ranks[trainable].grad
        torch.testing.assert_close(got, a_full.grad[trainable:trainable + 1], atol=1e-5,
                                   rtol=1e-5)


def test_every_block_start_is_drawn_and_nothing_else():
    model, _ = _net()
    seen = {_sd_scripts_rank(seed) for seed in range(200)}
    assert seen == set(range(0, DIM, UNIT))


def test_outside_training_it_is_the_plain_full_rank_lora():
    model, full = _net()
    model.eval()
    x = torch.randn(3, 8)
    a, b = full[0]
    torch.testing.assert_close(model[0](x), model[0].base_layer(x) + x @ a.T @ b.T * ALPHA / DIM)
    torch.testing.assert_close(model[0].lora_A["default"].weight, a)  # what the file reads


def _unet_out(unet, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    cfg = unet.config
    sample = torch.randn(1, cfg.in_channels, 8, 8, generator=g)
    text = torch.randn(1, 77, cfg.cross_attention_dim, generator=g)
    with torch.set_grad_enabled(grad):
        return unet(sample, torch.tensor([500]), text).sample


def test_trained_file_loads_in_diffusers_and_cuts_to_a_smaller_rank(tmp_path):
    from diffusers import StableDiffusionPipeline

    from trainer.families.sd.tiny import build_components
    from trainer.models.loader import load_base_model

    cfg = small_config(tmp_path, tmp_path, network={"network_dim": 4, "network_alpha": 2.0,
                                                    "conv_dim": 4, "dylora_unit": 2})
    model = load_base_model(cfg.model)
    method = DyLoraMethod(cfg)
    groups = method.prepare(model)
    opt = torch.optim.AdamW(groups, lr=1e-2)
    model.unet.train()
    for step in range(3):  # a few steps on random inputs: the up matrices leave zero
        _unet_out(model.unet, step, grad=True).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.unet.eval()
    trained = _unet_out(model.unet)
    path = method.save(tmp_path / "dy.safetensors", model, None)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.dylora"
    assert json.loads(meta["ss_network_args"]) == {"conv_dim": "4", "conv_alpha": "2",
                                                   "unit": "2"}
    tensors = load_file(str(path))
    downs = [k for k in tensors if k.endswith("lora_down.weight")]
    assert {tensors[k].shape[0] for k in downs} == {4}
    assert any(tensors[k].dim() == 4 and tensors[k].shape[-1] == 3 for k in downs)

    def pipe_out(lora):
        pipe = StableDiffusionPipeline(**build_components(), safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)
        base = _unet_out(pipe.unet)
        pipe.load_lora_weights(str(lora))
        return base, _unet_out(pipe.unet)

    base, loaded = pipe_out(path)
    torch.testing.assert_close(loaded, trained, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(loaded, base, atol=1e-4)
    # sd-scripts' extract_lora_from_dylora: keep the first r ranks, alpha as it is
    cut = {k: (v[:2] if "lora_down" in k else v[:, :2] if "lora_up" in k else v).contiguous()
           for k, v in tensors.items()}
    save_file(cut, str(tmp_path / "cut.safetensors"), meta)
    _, small = pipe_out(tmp_path / "cut.safetensors")
    assert {cut[k].shape[0] for k in downs} == {2}
    first = [tensors[k.replace("lora_down", "lora_up")].flatten(1)[:, :2] @ tensors[k][:2]
             .flatten(1) for k in downs]
    assert any(torch.count_nonzero(w) for w in first)  # the first block trained somewhere
    assert torch.isfinite(small).all() and not torch.allclose(small, base, atol=1e-5)
    from trainer.tools.options import ResizeOptions
    from trainer.tools.resize import resize

    resize(ResizeOptions(path=str(path), save_to=str(tmp_path / "r2.safetensors"), rank=2))
    assert load_file(str(tmp_path / "r2.safetensors"))[downs[0]].shape[0] == 2


@pytest.mark.parametrize("network, message", [
    ({"network_dim": 6, "dylora_unit": 4}, "multiple"),
    ({"dylora_unit": 2, "conv_dim": 4}, "conv_dim equal to network_dim"),
    ({"dylora_unit": 2, "conv_dim": 8, "conv_alpha": 1.0}, "conv_alpha"),
    ({"dylora_unit": 2, "rank_dropout": 0.1}, "no dropout"),
    ({"dylora_unit": 2, "scale_weight_norms": 1.0}, "max-norm"),
    ({"dylora_unit": 2, "block_dims": [4] * 25}, "block-wise"),
    ({"dylora_unit": 2, "network_type": "loha"}, "network.dylora_unit"),
])
def test_refused_at_load(network, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(network=network)


@pytest.mark.parametrize("model", ["embedded:tiny-flux", "embedded:tiny-sd3"])
def test_flow_families_refuse_dylora(model):
    with pytest.raises(ValueError, match="dylora_unit"):
        TrainConfig(model={"pretrained_model_name_or_path": model}, network={"dylora_unit": 1})


def test_two_steps_train_with_loraplus_and_the_text_encoder(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, network={"dylora_unit": 2, "network_dim": 4,
                                                "train_text_encoder": True,
                                                "loraplus_lr_ratio": 4.0},
                       training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    with safe_open(result.output_path, "pt") as f:
        assert f.metadata()["ss_network_module"] == "networks.dylora"
        ups = {k: f.get_tensor(k) for k in f.keys() if k.endswith("lora_up.weight")}
    assert any(k.startswith("lora_te_") for k in ups)
    # two steps, one 2-rank block per module and step: some blocks are still zero
    cols = [u.flatten(1).abs().sum(0) for u in ups.values()]
    assert any(torch.count_nonzero(c) for c in cols)
    assert any(torch.count_nonzero(c) < len(c) for c in cols)
