"""sd-scripts' LoRA network options (issue 21): LoRA+ and block-wise learning rates and ranks.

The expected values are derived here from sd-scripts' networks/lora.py formulas, written out
independently of trainer/config/lora_blocks.py, and read back from the optimizer's parameter
groups and from the saved file."""

import math

import pytest
import torch
from safetensors import safe_open

from tests.train_helpers import one_image_dataset, small_config
from trainer.config import EMBEDDED_SDXL, TrainConfig
from trainer.methods.lora import LoraMethod
from trainer.models.loader import load_base_model
from trainer.run.loop import run


def _groups(cfg):
    model = load_base_model(cfg.model)
    return model, LoraMethod(cfg).prepare(model)


def test_loraplus_puts_b_matrices_at_ratio_times_the_rate(tmp_path):
    cfg = small_config(tmp_path, tmp_path, network={"train_text_encoder": True,
                                                    "loraplus_lr_ratio": 16.0,
                                                    "loraplus_text_encoder_lr_ratio": 4.0},
                       optimizer={"unet_lr": 1e-4, "text_encoder_lr": 5e-5})
    model, groups = _groups(cfg)
    by_id = {id(p): g["lr"] for g in groups for p in g["params"]}
    for root, base, ratio in ((model.unet, 1e-4, 16.0), (model.text_encoder, 5e-5, 4.0)):
        named = [(n, p) for n, p in root.named_parameters() if "lora_" in n]
        assert named
        for name, param in named:
            want = base * ratio if ".lora_B." in name else base
            assert by_id[id(param)] == pytest.approx(want), name


# sd-scripts' named shapes, written out: n weights, i = 0..n-1
def _sd_scripts_shape(name: str, n: int) -> list[float]:
    base = 0.0
    if "+" in name:
        name, base = name.split("+")[0], float(name.split("+")[1])
    up = [i / (n - 1) for i in range(n)]
    table = {"sine": [math.sin(math.pi * x / 2) for x in up],
             "cosine": [math.sin(math.pi * x / 2) for x in up][::-1],
             "linear": up, "reverse_linear": up[::-1], "zeros": [0.0] * n}
    return [v + base for v in table[name]]


def _sd_block(name: str) -> int:
    """sd-scripts' get_block_index for SD 1.x names, by hand."""
    parts = name.removeprefix("lora_unet_").split("_")
    if parts[0] == "mid":
        return 12
    i, kind, j = int(parts[2]), parts[3], int(parts[4])
    idx = 3 * i + (2 if kind in ("downsamplers", "upsamplers") else j)
    return (1 if parts[0] == "down" else 13) + idx


def test_block_lr_weights_follow_sd_scripts_shapes(tmp_path):
    cfg = small_config(tmp_path, tmp_path, network={"down_lr_weight": "sine+0.5",
                                                    "mid_lr_weight": "2",
                                                    "up_lr_weight": "cosine"},
                       optimizer={"unet_lr": 1e-3})
    model, groups = _groups(cfg)
    want = _sd_scripts_shape("sine+0.5", 12) + [2.0] + _sd_scripts_shape("cosine", 12)
    assert len(want) == 25
    by_id = {id(p): g["lr"] for g in groups for p in g["params"]}
    seen = set()
    for path, param in model.unet.named_parameters():
        if "lora_" not in path:
            continue
        block = _sd_block("lora_unet_" + path.split(".lora_")[0].replace(".", "_"))
        seen.add(block)
        assert by_id[id(param)] == pytest.approx(1e-3 * want[block]), path
    assert 12 in seen and len(seen) > 2
    # the up blocks' first weight (block 13) is cosine's 1.0; weight 0 (up block 24) has no LoRA
    assert all(g["lr"] > 0 for g in groups)
    assert not any(".up_blocks.3." in p or p.startswith("up_blocks.3.") for p, _ in
                   model.unet.named_parameters() if "lora_" in p and want[24] == 0)


def test_zero_threshold_and_zero_blocks_leave_blocks_out(tmp_path):
    cfg = small_config(tmp_path, tmp_path, network={"down_lr_weight": "linear",
                                                    "block_lr_zero_threshold": 0.5})
    model, groups = _groups(cfg)
    weights = [w if w > 0.5 else 0 for w in _sd_scripts_shape("linear", 12)]
    for path, _ in model.unet.named_parameters():
        if "lora_" in path and path.startswith("down_blocks"):
            block = _sd_block("lora_unet_" + path.split(".lora_")[0].replace(".", "_"))
            assert weights[block - 1] > 0, path


def test_block_dims_write_a_rank_per_module_that_diffusers_loads(tmp_path):
    from diffusers import StableDiffusionPipeline

    dims = [0] + [2] * 6 + [4] * 5 + [3] + [6] * 12  # block 0 has no LoRA in sd-scripts
    alphas = [1.0] * 13 + [1.5] * 12
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, network={"block_dims": dims, "block_alphas": alphas},
                       training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    with safe_open(result.output_path, "pt") as f:
        keys = [k for k in f.keys() if k.endswith(".lora_down.weight")]
        for key in keys:
            module = key.split(".")[0]
            block = _sd_block(module)
            assert f.get_tensor(key).shape[0] == dims[block], key
            assert f.get_tensor(module + ".alpha").item() == pytest.approx(alphas[block])
    from trainer.families.sd.tiny import build_components

    pipe = StableDiffusionPipeline(**build_components(), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.load_lora_weights(result.output_path)  # ranks differ per module: diffusers reads it


def test_sdxl_counts_23_blocks(tmp_path):
    TrainConfig(model={"pretrained_model_name_or_path": EMBEDDED_SDXL},
                network={"block_dims": [4] * 23})
    with pytest.raises(ValueError, match="23"):
        TrainConfig(model={"pretrained_model_name_or_path": EMBEDDED_SDXL},
                    network={"block_dims": [4] * 25})
    cfg = small_config(tmp_path, tmp_path, model={"pretrained_model_name_or_path": EMBEDDED_SDXL},
                       network={"up_lr_weight": "zeros+0.25", "mid_lr_weight": "1,0,1"})
    model, groups = _groups(cfg)
    names = {g["name"] for g in groups}
    assert "unet_block11" not in names  # middle_block_1 at weight 0: no LoRA
    want = {f"unet_block{13 + i}": 0.25 for i in range(9)}
    for g in groups:
        if g["name"] in want:
            assert g["lr"] == pytest.approx(cfg.optimizer.learning_rate * 0.25)
    assert any(g["name"] in want for g in groups)


@pytest.mark.parametrize("network, message", [
    ({"network_type": "loha", "loraplus_lr_ratio": 4}, "LoRA+"),
    ({"network_type": "locon", "down_lr_weight": "sine"}, "block-wise"),
    ({"block_alphas": [1.0] * 25}, "block_alphas"),
    ({"down_lr_weight": "sinus"}, "cosine, sine"),
    ({"dim_from_weights": True}, "network_weights"),
])
def test_refused_at_load(network, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(network=network)


def test_flow_families_refuse_block_settings():
    with pytest.raises(ValueError, match="network.block_dims is set but FLUX.1 does not read"):
        TrainConfig(model={"pretrained_model_name_or_path": "embedded:tiny-flux"},
                    network={"block_dims": [4] * 25})


def test_loraplus_two_steps_train(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, network={"loraplus_lr_ratio": 16.0,
                                                "down_lr_weight": "1,1,1,1,1,1,0.5"},
                       training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    with safe_open(result.output_path, "pt") as f:
        ups = [f.get_tensor(k) for k in f.keys() if k.endswith("lora_up.weight")]
    assert any(torch.count_nonzero(u) for u in ups)


def test_kohya_ss_network_keys_import_with_nothing_unsupported(tmp_path):
    from trainer.importers.kohya import import_kohya

    weights = tmp_path / "prev.safetensors"
    cfg, report = import_kohya({
        "LoRA_type": "Standard", "network_dim": 8, "loraplus_lr_ratio": "16",
        "loraplus_unet_lr_ratio": "", "loraplus_text_encoder_lr_ratio": 4,
        "down_lr_weight": "sine+0.5", "mid_lr_weight": "1", "up_lr_weight": "1,1,0.5",
        "block_lr_zero_threshold": "0.1", "block_dims": ",".join(["4"] * 25),
        "block_alphas": ",".join(["2"] * 25), "conv_block_dims": "", "conv_block_alphas": "",
        "network_weights": str(weights), "dim_from_weights": True, "scale_weight_norms": 1,
        "rank_dropout": 0.1, "module_dropout": 0.05})
    assert not report.unsupported, report.unsupported
    net = cfg.network
    assert (net.loraplus_lr_ratio, net.loraplus_text_encoder_lr_ratio) == (16.0, 4.0)
    assert net.down_lr_weight == "sine+0.5" and net.block_dims == [4] * 25
    assert net.block_alphas == [2.0] * 25 and net.network_weights == str(weights)
    assert net.dim_from_weights and net.scale_weight_norms == 1.0
    assert (net.rank_dropout, net.module_dropout) == (0.1, 0.05)
