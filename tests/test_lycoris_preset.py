"""network.lycoris_preset and network.bypass_mode (issue 21): each lycoris preset adapts the
modules its name says on a diffusers SD model (checked against the model's own module paths), a
2-step run with a preset in bypass mode writes a file that the package's loader reads back to the
trained output, and the settings a preset cannot serve are refused at load."""

from __future__ import annotations

import json
from typing import get_args

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from test_lycoris_oft import reloaded, trained
from train_helpers import small_config

from trainer.config.rules.lycoris import PRESETS_WITHOUT_CONV, PRESETS_WITHOUT_TEXT_ENCODER
from trainer.config.sections.network_lycoris import LycorisPreset
from trainer.methods.lycoris import LycorisMethod
from trainer.methods.lycoris_presets import sd_preset, trains_text_encoder

PRESETS = get_args(LycorisPreset)
ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")


def test_the_rules_follow_the_packages_presets():
    from lycoris.config import PRESET

    assert set(PRESETS) == set(PRESET) - {"ia3"}
    assert {p for p in PRESETS if not trains_text_encoder(p)} == set(PRESETS_WITHOUT_TEXT_ENCODER)
    assert {p for p in PRESETS if not sd_preset(p)["enable_conv"]} == set(PRESETS_WITHOUT_CONV)


def adapted(tmp_path, preset: str, **network):
    """(UNet module paths, text-encoder module paths, model) that preset ``preset`` adapts."""
    from trainer.models.loader import load_base_model

    te = preset not in PRESETS_WITHOUT_TEXT_ENCODER
    cfg = small_config(tmp_path, tmp_path, network={
        "network_type": "locon", "lycoris_preset": preset, "train_text_encoder": te, **network})
    model = load_base_model(cfg.model)
    method = LycorisMethod(cfg)
    method.prepare(model)
    ids = {id(lora.org_module[0]) for lora in method.loras}
    unet = {p for p, m in model.unet.named_modules() if id(m) in ids}
    text = {p for p, m in model.text_encoder.named_modules() if id(m) in ids}
    return unet, text, model, method


def is_3x3(model, path: str) -> bool:
    module = model.unet.get_submodule(path)
    return isinstance(module, torch.nn.Conv2d) and module.kernel_size != (1, 1)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_adapts_what_it_names(tmp_path, preset):
    unet, text, model, _ = adapted(tmp_path, preset)
    attention = {f"{p}.{leaf}" for p, m in model.unet.named_modules()
                 if type(m).__name__ == "Attention" for leaf in ATTENTION}
    in_transformers = {p for p in unet if ".attentions." in p}
    convs = {p for p in unet if is_3x3(model, p)}
    assert unet
    if preset == "attn-only":
        assert unet == attention
        assert text and all(".self_attn." in p for p in text)
    elif preset in ("attn-mlp", "unet-transformer-only"):
        assert unet == in_transformers and attention <= unet
        assert any(".ff.net." in p for p in unet) and not convs
        assert bool(text) == (preset == "attn-mlp")
        assert preset != "attn-mlp" or any(".mlp.fc1" in p for p in text)
    elif preset == "unet-convblock-only":
        assert not in_transformers and {"conv_in", "conv_out"} <= unet
        assert any(".resnets." in p and p.endswith("conv1") for p in convs)
        assert any(".downsamplers." in p for p in convs) and not text
    elif preset == "full-lin":
        assert not convs and attention <= unet and "time_embedding.linear_1" in unet
        assert any(p.endswith("time_emb_proj") for p in unet) and text
    else:  # full, unet-only: everything, 3x3 convolutions too
        assert attention <= unet and {"conv_in", "conv_out", "time_embedding.linear_1"} <= unet
        assert any(".resnets." in p for p in convs)
        assert bool(text) == (preset == "full")
    if preset in PRESETS_WITHOUT_CONV:
        assert not convs


def test_unset_is_full(tmp_path):
    full, full_te, _, _ = adapted(tmp_path / "a", "full")
    cfg = small_config(tmp_path / "b", tmp_path, network={"network_type": "locon",
                                                          "train_text_encoder": True})
    assert cfg.network.lycoris_preset is None
    from trainer.models.loader import load_base_model

    model = load_base_model(cfg.model)
    method = LycorisMethod(cfg)
    method.prepare(model)
    assert len(method.loras) == len(full) + len(full_te)


def test_bypass_mode_is_the_same_function(tmp_path):
    """lycoris' bypass forward adds the adapter's output to the frozen layer's output: with the
    same (non-zero) adapter weights the UNet computes what the merged-weight forward does."""
    from test_lycoris import unet_output

    outputs, before = [], None
    for bypass in (False, True):
        _, _, model, method = adapted(tmp_path / str(bypass), "full", bypass_mode=bypass)
        assert {lora.bypass_mode for lora in method.loras} == ({True} if bypass else {None})
        before = unet_output(model.unet)  # LoCon's up matrices start at 0: the base output
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.unet.lycoris.parameters():
                p.normal_(std=0.05)
        outputs.append(unet_output(model.unet))
    assert (outputs[0] - before).abs().max() > 1e-3  # the adapters act
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)


def test_a_preset_run_in_bypass_mode_reloads(tmp_path_factory, tiny_model_dir):
    from test_lycoris import unet_output
    from test_lycoris_oft import fresh_unet

    cfg, result, at_end = trained(tmp_path_factory, "loha", lycoris_preset="attn-only",
                                  bypass_mode=True)
    _, again = reloaded(result.output_path, tiny_model_dir)
    assert (again - unet_output(fresh_unet(tiny_model_dir))).abs().max() > 1e-5
    torch.testing.assert_close(again, at_end, rtol=1e-4, atol=1e-5)
    names = {k.split(".")[0] for k in load_file(result.output_path)}
    assert names and all(n.endswith(("_to_q", "_to_k", "_to_v", "_to_out_0")) for n in names)
    with safe_open(result.output_path, "pt") as f:
        args = json.loads(f.metadata()["ss_network_args"])
    assert args["preset"] == "attn-only" and args["bypass_mode"] == "True"


@pytest.mark.parametrize("network, message", [
    ({"lycoris_preset": "unet-only", "train_text_encoder": True}, "adapts no text-encoder"),
    ({"lycoris_preset": "attn-only", "conv_dim": 4}, "network.conv_dim would be ignored"),
    ({"network_type": "ia3", "lycoris_preset": "full"}, "network.lycoris_preset is set"),
    ({"network_type": "lora", "lycoris_preset": "full"}, "network.lycoris_preset is set"),
    ({"lycoris_preset": "lokr"}, "lycoris_preset"),
])
def test_what_a_preset_cannot_serve_is_refused(network, message):
    from trainer.config.files import ConfigError, from_dict

    with pytest.raises(ConfigError, match=message):
        from_dict({"mode": "lora", "network": {"network_type": "locon", **network}})
