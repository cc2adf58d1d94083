"""Issue 21, configs as users write them: values sd-scripts ignores in context import as "not
needed", optimizer_args pasted with their flag, optimizers by import path, D-Adaptation's one
rate, a warm-up percentage without the dataset, any torch.optim.lr_scheduler class checked at
load; and sample prompts with sd-scripts' per-prompt options and prompt files."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.config import TrainConfig
from trainer.importers.kohya import import_kohya
from trainer.optim.optimizers import make_optimizer, make_scheduler
from trainer.optim.torch_schedulers import TORCH_SCHEDULERS
from trainer.run.loop import run
from trainer.run.sample_prompts import SamplePrompt, parse_line, read_prompt_file

LORA = {"LoRA_type": "Standard"}


def test_values_sd_scripts_ignores_in_context_are_not_needed():
    cfg, report = import_kohya({**LORA, "learning_rate": 0, "unet_lr": 1e-4,
                                "text_encoder_lr": 5e-5, "lr_scheduler": "cosine",
                                "lr_scheduler_power": 0})
    assert not report.unsupported
    needed = dict(report.not_needed)
    assert "unet_lr / text_encoder_lr set the rate" in needed["learning_rate"]
    assert "only the polynomial schedule reads it" in needed["lr_scheduler_power"]
    assert cfg.optimizer.unet_lr == 1e-4 and cfg.optimizer.text_encoder_lr == 5e-5
    cfg, _ = import_kohya({**LORA, "lr_scheduler": "polynomial", "lr_scheduler_power": 2})
    assert cfg.optimizer.lr_scheduler_power == 2


def test_optimizer_args_pasted_with_the_flag_and_optimizers_by_path():
    cfg, report = import_kohya({**LORA, "optimizer": "torch.optim.SGD", "optimizer_args":
                                '--optimizer_args "momentum=0.8" weight_decay=0.1'})
    assert not report.unsupported
    assert cfg.optimizer.optimizer_class == "torch.optim.SGD"
    assert cfg.optimizer.optimizer_args == {"momentum": 0.8} and cfg.optimizer.weight_decay == 0.1
    cfg, _ = import_kohya({**LORA, "additional_parameters":
                           "--optimizer_type pytorch_optimizer.CAME"})
    assert cfg.optimizer.optimizer_class == "pytorch_optimizer.CAME"
    p = torch.nn.Parameter(torch.zeros(3))
    built = make_optimizer(TrainConfig.model_validate(
        {"optimizer": {"optimizer_class": "SGD", "optimizer_args": {"momentum": 0.8}}}).optimizer,
        [{"params": [p], "lr": 0.5}], "cpu")
    assert type(built) is torch.optim.SGD and built.param_groups[0]["momentum"] == 0.8


def test_came_imports_as_its_package_and_a_missing_one_is_named():
    cfg, report = import_kohya({**LORA, "optimizer": "CAME"})
    assert cfg.optimizer.optimizer_class == "came_pytorch.CAME" and not report.unsupported
    section = cfg.optimizer
    try:
        import came_pytorch  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="came-pytorch"):
            make_optimizer(section, [{"params": [torch.nn.Parameter(torch.zeros(1))]}], "cpu")


def test_dadaptation_with_two_rates_keeps_the_first_and_the_schema_refuses_two():
    cfg, report = import_kohya({**LORA, "optimizer": "DAdaptAdam", "learning_rate": 1,
                                "unet_lr": 1.0, "text_encoder_lr": 0.5})
    assert cfg.optimizer.unet_lr == cfg.optimizer.text_encoder_lr == 0.5  # the TE group is first
    assert any("one rate" in n for n in report.notes)
    with pytest.raises(ValueError, match="one learning rate"):
        TrainConfig.model_validate({"network": {"train_text_encoder": True}, "optimizer": {
            "optimizer_type": "Prodigy", "unet_lr": 1.0, "text_encoder_lr": 0.5}})
    TrainConfig.model_validate({"optimizer": {  # the text encoder does not train: one rate
        "optimizer_type": "Prodigy", "unet_lr": 1.0, "text_encoder_lr": 0.5}})


def test_the_torch_scheduler_table_matches_torch():
    for name, (required, optional) in TORCH_SCHEDULERS.items():
        params = inspect.signature(getattr(torch.optim.lr_scheduler, name)).parameters
        theirs_required = {p for p, v in params.items() if v.default is inspect.Parameter.empty
                           and p not in ("optimizer", "self")}
        assert set(required) == theirs_required, name
        assert set(optional) <= set(params), name


def test_custom_schedulers_are_checked_at_load_and_step_as_torch_does():
    with pytest.raises(ValueError, match="needs optimizer.lr_scheduler_args.step_size"):
        TrainConfig.model_validate({"optimizer": {"lr_scheduler_type": "StepLR"}})
    with pytest.raises(ValueError, match="takes no such argument"):
        TrainConfig.model_validate({"optimizer": {"lr_scheduler_type": "StepLR",
                                                  "lr_scheduler_args": {"step_size": 1,
                                                                        "gama": 0.5}}})
    with pytest.raises(ValueError, match="not a schedule of torch"):
        TrainConfig.model_validate({"optimizer": {"lr_scheduler_type": "LambdaLR"}})
    cfg, report = import_kohya({**LORA, "lr_scheduler_type": "MultiStepLR",
                                "lr_scheduler_args": "milestones=[2,4] gamma=0.1"})
    assert not report.unsupported
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = make_scheduler(cfg.optimizer, opt, 10)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01])  # x gamma at steps 2 and 4


def test_a_warmup_fraction_is_counted_on_the_run():
    section = TrainConfig.model_validate({"optimizer": {
        "lr_warmup_ratio": 0.25, "lr_scheduler": "linear"}}).optimizer
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(section, opt, 8)  # int(0.25 * 8) = 2 warm-up steps, as sd-scripts
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="both set the warm-up"):
        TrainConfig.model_validate({"optimizer": {"lr_warmup_ratio": 0.1,
                                                  "lr_warmup_steps": 3}})


def test_prompt_lines_and_files_as_sd_scripts_reads_them(tmp_path):
    spec = parse_line("a cat --n blurry, ugly --w 200 --h 129 --d 7 --l 4.5 --s 5000 "
                      "--ss k_euler --x 3")
    assert spec == SamplePrompt("a cat", "blurry, ugly", 200, 129, 7, 1000, 4.5, "k_euler")
    (tmp_path / "p.txt").write_text("# comment\na dog --s 3\n\nthe sea\n")
    assert [p.prompt for p in read_prompt_file(tmp_path / "p.txt")] == ["a dog", "the sea"]
    (tmp_path / "p.toml").write_text('[prompt]\nwidth = 96\nsample_steps = 2\n'
                                     '[[prompt.subset]]\nprompt = "a fox"\nseed = 3\n'
                                     '[[prompt.subset]]\nprompt = "a hen"\nwidth = 64\n')
    foxes = read_prompt_file(tmp_path / "p.toml")
    assert (foxes[0].width, foxes[0].seed, foxes[1].width, foxes[1].steps) == (96, 3, 64, 2)
    (tmp_path / "p.json").write_text(json.dumps(["an owl --h 72", {"prompt": "a bee",
                                                                   "negative_prompt": "x"}]))
    owl, bee = read_prompt_file(tmp_path / "p.json")
    assert owl.height == 72 and bee.negative_prompt == "x"


def test_samples_follow_each_prompts_options_in_a_two_step_run(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    (tmp_path / "p.toml").write_text('[prompt]\nsample_steps = 2\n[[prompt.subset]]\n'
                                     'prompt = "a square"\nwidth = 64\nheight = 96\n')
    cfg = small_config(tmp_path, data, training={"max_train_steps": 2},
                       optimizer={"lr_scheduler_type": "StepLR",
                                  "lr_scheduler_args": {"step_size": 1, "gamma": 0.5}},
                       sampling={"sample_prompts": ["a red circle --n blue --w 96 --h 64 --s 2 "
                                                    "--ss k_dpm_2_a --d 5"],
                                 "sample_prompts_file": str(tmp_path / "p.toml"),
                                 "sample_every_n_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    from PIL import Image

    images = sorted((tmp_path / "out" / "sample").glob("*.png"))
    assert [Image.open(p).size for p in images] == [(96, 64), (64, 96)]
