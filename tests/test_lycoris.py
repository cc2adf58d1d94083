"""LyCORIS (LoCon, LoHa, LoKr, IA3, DoRA) through lycoris-lora: a run trains the adapters, and
the file it writes, read back by the package's own loader onto a fresh UNet, reproduces the
trained UNet's output; names and metadata are sd-scripts' (``lycoris.kohya``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import Control, ListSink, Step
from trainer.methods.lycoris import LycorisMethod
from trainer.run.loop import run

# a tensor only each algorithm writes, and extra settings that exercise its options
ALGO_KEY = {"locon": "lora_down.weight", "loha": "hada_w2_b", "lokr": "lokr_w1",
            "ia3": "on_input", "dora": "dora_scale"}
OPTIONS = {"locon": {"conv_dim": 2, "conv_alpha": 1.0}, "loha": {"use_scalar": True},
           "lokr": {"factor": 4}, "ia3": {}, "dora": {"conv_dim": 2, "conv_alpha": 1.0}}
_RUNS: dict[str, tuple] = {}


def fixed_inputs(unet):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, 8, 8, generator=gen), torch.tensor([500]),
            torch.randn(1, 77, unet.config.cross_attention_dim, generator=gen))


@torch.no_grad()
def unet_output(unet) -> torch.Tensor:
    was_training = unet.training
    unet.eval()
    out = unet(*fixed_inputs(unet)).sample
    unet.train(was_training)
    return out


def lycoris_config(root: Path, data: Path, network_type: str, steps: int = 2, **sections):
    network = {"network_type": network_type, "network_dim": 4, "network_alpha": 2.0,
               **OPTIONS[network_type], **sections.pop("network", {})}
    return small_config(root, data, network=network,
                        training={"max_train_steps": steps, **sections.pop("training", {})},
                        optimizer={"learning_rate": 1e-3, **sections.pop("optimizer", {})},
                        **sections)


def trained(tmp_path_factory, network_type: str):
    """(config, result, the UNet's output at the final save) of a 2-step run, once a module."""
    if network_type not in _RUNS:
        root = tmp_path_factory.mktemp(network_type)
        cfg = lycoris_config(root, one_image_dataset(root / "data"), network_type)
        outputs = []
        save = LycorisMethod.save

        def capture(self, path, model, facts, final=True):
            outputs.append(unet_output(model.unet))
            return save(self, path, model, facts, final)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LycorisMethod, "save", capture)
            result = run(cfg, ListSink())
        assert result.status == "finished", result.error
        _RUNS[network_type] = (cfg, result, outputs[-1])
    return _RUNS[network_type]


def reloaded_output(path: str, tiny_model_dir: Path, network_type: str, cfg) -> torch.Tensor:
    """The package reads the file onto a fresh base UNet; its output."""
    from diffusers import UNet2DConditionModel
    from lycoris.kohya import create_network_from_weights

    unet = UNet2DConditionModel.from_pretrained(tiny_model_dir / "unet")
    if network_type == "ia3":
        # lycoris 4.1's IA3Module.make_module_from_state_dict does not take the on_input
        # tensor that its own extract_state_dict passes (a TypeError), so IA3 goes through
        # load_weights, the path of sd-scripts' --network_weights
        from trainer.methods.lycoris import build_network

        network = build_network(cfg, unet, [])
        network.load_weights(path)
    else:
        network, _ = create_network_from_weights(1.0, path, None, None, unet)
    network.apply_to(None, unet, apply_text_encoder=False, apply_unet=True)
    assert len(network.unet_loras) == len({k.split(".")[0] for k in load_file(path)})
    return unet_output(unet)


@pytest.mark.parametrize("network_type", list(ALGO_KEY))
def test_trained_file_reloads_in_lycoris(tmp_path_factory, tiny_model_dir, network_type):
    from diffusers import UNet2DConditionModel

    cfg, result, at_end = trained(tmp_path_factory, network_type)
    base = unet_output(UNet2DConditionModel.from_pretrained(tiny_model_dir / "unet"))
    assert (at_end - base).abs().max() > 1e-5  # the adapters trained
    again = reloaded_output(result.output_path, tiny_model_dir, network_type, cfg)
    torch.testing.assert_close(again, at_end, rtol=1e-4, atol=1e-5)

    with safe_open(result.output_path, "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
        dtypes = {f.get_tensor(k).dtype for k in keys}
    assert dtypes == {torch.float32}  # saving.save_precision, as the package casts all
    assert all(k.startswith("lora_unet_") for k in keys)
    assert any(k.endswith("." + ALGO_KEY[network_type]) for k in keys)
    assert meta["ss_network_module"] == "lycoris.kohya"
    args = json.loads(meta["ss_network_args"])
    assert args["algo"] == {"dora": "lora"}.get(network_type, network_type)
    assert (args.get("dora_wd") == "True") == (network_type == "dora")
    assert meta["ss_network_dim"] == "4" and meta["ss_network_alpha"] == "2.0"
    assert meta["modelspec.architecture"] == "stable-diffusion-v1/lora"
    assert meta["sshs_model_hash"]


def test_network_args_say_how_to_rebuild(tmp_path_factory):
    cfg, result, _ = trained(tmp_path_factory, "lokr")
    with safe_open(result.output_path, "pt") as f:
        args = json.loads(f.metadata()["ss_network_args"])
    # conv_dim / conv_alpha unset: lycoris.kohya's defaults, network_dim and network_alpha
    assert args == {"algo": "lokr", "factor": "4", "decompose_both": "False",
                    "use_tucker": "False", "use_scalar": "False", "train_norm": "False",
                    "conv_dim": "4", "conv_alpha": "2"}


class StopAfterFirstStep(ListSink):
    def __init__(self, control: Control):
        super().__init__()
        self.control = control

    def emit(self, event):
        super().emit(event)
        if isinstance(event, Step):
            self.control.request_stop()


def test_resume_continues_a_lycoris_run_exactly(tmp_path_factory):
    """A run stopped after step 1 and resumed from its state ends with the tensors of the
    uninterrupted 2-step run: trainer/run/state.py saves and restores the adapters, which live
    under ``unet.lycoris``, and their optimizer state."""
    _, straight, _ = trained(tmp_path_factory, "loha")
    root = tmp_path_factory.mktemp("resume")
    cfg = lycoris_config(root, one_image_dataset(root / "data"), "loha",
                         saving={"save_state": True})
    control = Control()
    assert run(cfg, StopAfterFirstStep(control), control).status == "stopped"
    resumed = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"resume": "latest"})})
    result = run(resumed, ListSink())
    assert result.status == "finished", result.error
    want, got = load_file(straight.output_path), load_file(result.output_path)
    assert want.keys() == got.keys()
    for key in want:  # a step moves them by ~1e-3; the CPU thread count, which follows the
        # machine's load (trainer/system/threads.py), may differ between runs and reorder float sums
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-8)


def test_text_encoder_groups_and_names(tmp_path):
    """The text encoder's adapters train at text_encoder_lr and are saved as
    ``lora_te_text_model_...`` whatever transformers' module paths are."""
    from trainer.export.lycoris import lycoris_tensors
    from trainer.models.loader import load_base_model

    cfg = lycoris_config(tmp_path, tmp_path, "loha", network={"train_text_encoder": True},
                         optimizer={"learning_rate": 1e-3, "unet_lr": 2e-3,
                                    "text_encoder_lr": 5e-4})
    model = load_base_model(cfg.model)
    method = LycorisMethod(cfg)
    groups = method.prepare(model)
    assert [(g["name"], g["lr"]) for g in groups] == [("unet", 2e-3), ("text_encoder", 5e-4)]
    te_params = {id(p) for p in model.text_encoder.parameters() if p.requires_grad}
    assert te_params == {id(p) for p in groups[1]["params"]} and te_params
    names = {k.split(".")[0] for k in lycoris_tensors(
        method.loras, model.unet, [("text_encoder", model.text_encoder)])}
    te_names = {n for n in names if n.startswith("lora_te_")}
    paths = {"lora_te_" + ("" if n.startswith("text_model.") else "text_model.") + n
             for n, _ in model.text_encoder.named_modules()}
    assert te_names and te_names <= {p.replace(".", "_") for p in paths}
    assert any(n.endswith("_self_attn_q_proj") for n in te_names)


def test_sdxl_names_are_sd_scripts(tmp_path):
    """SDXL: the UNet's modules by the original layout (lora_unet_input_blocks_4_1_...), the
    text encoders as lora_te1_ / lora_te2_: every name is a module of the single-file model."""
    from trainer.config import EMBEDDED_SDXL
    from trainer.export.lycoris import lycoris_tensors
    from trainer.families.sd.checkpoint import UNET_PREFIX, unet_tensors
    from trainer.models.loader import load_base_model

    cfg = lycoris_config(tmp_path, tmp_path, "locon", network={"train_text_encoder": True},
                         model={"pretrained_model_name_or_path": EMBEDDED_SDXL})
    model = load_base_model(cfg.model)
    assert model.version == "sdxl"
    original = {"lora_unet_" + k[len(UNET_PREFIX):-len(".weight")].replace(".", "_")
                for k in unet_tensors(model.unet) if k.endswith(".weight")}
    method = LycorisMethod(cfg)
    method.prepare(model)
    names = {k.split(".")[0] for k in lycoris_tensors(
        method.loras, model.unet, [("text_encoder", model.text_encoder),
                                   ("text_encoder_2", model.text_encoder_2)], sdxl=True)}
    unet_names = {n for n in names if n.startswith("lora_unet_")}
    assert unet_names <= original
    assert "lora_unet_input_blocks_0_0" in unet_names  # conv_in
    assert any(n.startswith("lora_unet_input_blocks_") and "_1_transformer_blocks_" in n
               for n in unet_names)
    assert any(n.startswith("lora_unet_output_blocks_") for n in unet_names)
    assert {n.split("_text_model_")[0] for n in names - unet_names} == {"lora_te1", "lora_te2"}


@pytest.mark.parametrize("network, message", [
    ({"network_type": "lora", "factor": 4}, "network.factor is set"),
    ({"network_type": "lora", "train_norm": True}, "network.train_norm is set"),
    ({"network_type": "loha", "decompose_both": True}, "network.decompose_both is set"),
    ({"network_type": "ia3", "conv_dim": 4}, "network.conv_dim is set"),
    ({"network_type": "ia3", "rank_dropout": 0.0}, "network.rank_dropout is set"),
    ({"network_type": "ia3", "train_norm": True}, "network.train_norm is set"),
    ({"network_type": "lokr", "factor": 0}, "network.factor"),
])
def test_options_the_type_does_not_read_are_refused(network, message):
    from trainer.config.files import ConfigError, from_dict

    with pytest.raises(ConfigError, match=message):
        from_dict({"mode": "lora", "network": network})
    ok = {"lokr": {"factor": 8, "decompose_both": True}, "ia3": {"module_dropout": 0.1}}
    for network_type, options in ok.items():
        from_dict({"mode": "lora", "network": {"network_type": network_type, **options}})


def test_footprint_counts_lycoris_parameters():
    """The estimate prepares a weightless (meta) model, where DoRA's weight norms have no
    value: it counts DoRA as the LoCon under it instead of failing."""
    network_type = "dora"
    from trainer.advisor.footprint import embedded_configs, simulate_step
    from trainer.config.files import from_dict

    configs = embedded_configs("embedded:tiny-sd15")
    sizes = {}
    for kind in ("lora", network_type):
        cfg = from_dict({"mode": "lora", "network": {"network_type": kind}})
        sizes[kind] = simulate_step(configs, cfg, (64, 64), 1, torch.float32, False).trained
    # LyCORIS adapts the ResNet blocks too: more parameters than attention-only LoRA
    assert sizes[network_type] > sizes["lora"] > 0
