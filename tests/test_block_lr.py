"""optimizer.block_lr: sd-scripts' per-block learning rates of SDXL DreamBooth / fine-tuning
(sdxl_train.py --block_lr, 23 values), on the tiny SDXL UNet (SDXL's layout: 3 down blocks of 2
layers, the first without attention).

The expected blocks are written out here on the diffusers names, from SDXL's original layout as
sd-scripts counts it (get_block_params_to_optimize: time_embed / label_emb 0, input_blocks.N
1 + N, middle_block.N 10 + N, output_blocks.N 13 + N, out 22) and the layout itself: conv_in is
input_blocks.0; each down block's layer j is the next input block, its downsampler the one after;
the middle block is resnet, attention, resnet; output block k is up block k // 3's layer k % 3,
with the upsampler in the block's last one."""

from __future__ import annotations

import re

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from train_helpers import one_image_dataset, small_config

from trainer.config import EMBEDDED_MODEL, EMBEDDED_SDXL, TrainConfig
from trainer.config.files import ConfigError
from trainer.methods.dreambooth import DreamBoothMethod
from trainer.models.loader import load_base_model
from trainer.run.loop import run

SDXL = {"pretrained_model_name_or_path": EMBEDDED_SDXL}
# a rate per block, all different, with blocks 0 (embeddings), 4 (a downsampler), 11 (the
# middle attention) and 22 (the output layer) at 0
RATES = [0.0 if i in (0, 4, 11, 22) else float(f"{i + 1}e-5") for i in range(23)]


def expected_block(name: str) -> int:
    """The block of a diffusers SDXL UNet parameter, as sd-scripts counts it (see above)."""
    if name.startswith(("time_embedding.", "add_embedding.")):
        return 0
    if name.startswith("conv_in."):
        return 1
    if name.startswith(("conv_norm_out.", "conv_out.")):
        return 22
    if m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.", name):
        return 1 + 3 * int(m[1]) + 1 + int(m[3])  # input_blocks.(3b + 1 + j)
    if m := re.match(r"down_blocks\.(\d+)\.downsamplers\.", name):
        return 1 + 3 * int(m[1]) + 3  # input_blocks.(3b + 3)
    if m := re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.", name):
        return 10 + {("resnets", 0): 0, ("attentions", 0): 1, ("resnets", 1): 2}[(m[1], int(m[2]))]
    if m := re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.", name):
        return 13 + 3 * int(m[1]) + int(m[3])  # output_blocks.(3b + j)
    if m := re.match(r"up_blocks\.(\d+)\.upsamplers\.", name):
        return 13 + 3 * int(m[1]) + 2
    raise AssertionError(f"no block for {name}")


def db_config(tmp_path, **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    optimizer = {"learning_rate": 1e-3, "block_lr": RATES, **sections.pop("optimizer", {})}
    network = {"train_text_encoder": False, **sections.pop("network", {})}
    return small_config(tmp_path, data, mode="dreambooth", model=SDXL, optimizer=optimizer,
                        network=network, **sections)


def test_each_parameter_is_in_its_sd_scripts_block_at_that_rate(tmp_path):
    cfg = db_config(tmp_path)
    model = load_base_model(cfg.model)
    groups = DreamBoothMethod(cfg).prepare(model)
    by_param = {id(p): g for g in groups for p in g["params"]}
    seen = set()
    for name, param in model.unet.named_parameters():
        block = expected_block(name)
        seen.add(block)
        if RATES[block] == 0:  # sd-scripts leaves it out of the optimizer; frozen here
            assert id(param) not in by_param and not param.requires_grad, name
        else:
            group = by_param[id(param)]
            assert (group["name"], group["lr"]) == (f"unet_block{block}", RATES[block]), name
            assert param.requires_grad
    assert seen == set(range(23))  # the tiny UNet has every one of SDXL's 23 blocks
    assert [g["name"] for g in groups] == [f"unet_block{i}" for i in range(23) if RATES[i]]


def test_two_steps_train_each_block_at_its_rate_and_leave_the_zero_blocks(
        tmp_path, monkeypatch, one_torch_thread):  # noqa: F811
    seen = {}
    real_prepare, real_save = DreamBoothMethod.prepare, DreamBoothMethod.save

    def prepare(self, model):
        seen["before"] = {k: v.detach().clone() for k, v in model.unet.named_parameters()}
        return real_prepare(self, model)

    def save(self, path, model, facts, final=True):
        seen["after"] = {k: v.detach().clone() for k, v in model.unet.named_parameters()}
        return real_save(self, path, model, facts, final)

    monkeypatch.setattr(DreamBoothMethod, "prepare", prepare)
    monkeypatch.setattr(DreamBoothMethod, "save", save)
    cfg = db_config(tmp_path, training={"max_train_steps": 2, "mixed_precision": "no"},
                    optimizer={"optimizer_type": "SGDNesterov", "optimizer_args": {},
                               "weight_decay": 0.0})
    result = run(cfg)
    assert result.status == "finished", result.error
    before, after = seen["before"], seen["after"]
    moved = {expected_block(k) for k in before if not torch.equal(before[k], after[k])}
    assert moved == {i for i, r in enumerate(RATES) if r}  # every block with a rate trains
    for key in before:
        if RATES[expected_block(key)] == 0:
            assert torch.equal(before[key], after[key]), key


def test_block_lr_is_refused_where_sd_scripts_does_not_read_it(tmp_path):
    with pytest.raises(ValueError, match="23"):
        TrainConfig(mode="dreambooth", model=SDXL, optimizer={"block_lr": [1e-4] * 22})
    cases = [({"mode": "lora", "model": SDXL}, "network.down_lr_weight"),
             ({"mode": "dreambooth", "model": {"pretrained_model_name_or_path": EMBEDDED_MODEL}},
              "SD 1.x does not read it"),
             ({"mode": "dreambooth", "model": SDXL, "optimizer": {"unet_lr": 1e-5}},
              "optimizer.unet_lr both"),
             ({"mode": "dreambooth", "model": SDXL, "network": {"train_unet": False,
                                                              "train_text_encoder": True}},
              "train_unet is off"),
             ({"mode": "dreambooth", "model": SDXL, "optimizer": {"block_lr": [0.0] * 23}},
              "0 for all 23 blocks"),
             ({"mode": "dreambooth", "model": SDXL, "optimizer": {"optimizer_type": "Prodigy",
                                                                  "learning_rate": 1.0}},
              "one learning rate")]
    for data, message in cases:
        optimizer = {"block_lr": RATES, **data.pop("optimizer", {})}
        with pytest.raises(ValueError, match=message):
            TrainConfig(optimizer=optimizer, **data)


def test_import_kohya_reads_block_lr_as_sdxl_train_does():
    from trainer.importers.kohya import import_kohya

    text = ",".join(f"{r:g}" for r in RATES)
    cfg, report = import_kohya({"image_folder": "/img", "sdxl_checkbox": True,
                                "learning_rate": 1e-5, "block_lr": text})
    assert cfg.mode == "dreambooth" and cfg.optimizer.block_lr == RATES
    assert not report.unsupported
    # kohya_ss writes it into SD 1.x finetune configs too, where fine_tune.py ignores it
    cfg, report = import_kohya({"image_folder": "/img", "block_lr": text})
    assert cfg.optimizer.block_lr is None and not report.unsupported
    assert "sdxl_train.py only" in dict(report.not_needed)["block_lr"]
    _, report = import_kohya({"image_folder": "/img", "sdxl_checkbox": True, "block_lr": ""})
    assert "block_lr" in report.unset
    with pytest.raises(ConfigError, match="block_lr .*22 values; sdxl_train.py needs 23"):
        import_kohya({"image_folder": "/img", "sdxl_checkbox": True,
                      "block_lr": ",".join(["1e-5"] * 22)})
