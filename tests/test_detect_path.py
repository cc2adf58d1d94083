"""One detection (trainer/families/__init__.py) for train, advise, the GUI and the doctor: a
diffusers folder, an SD single file, a FLUX.1 transformer alone in BFL's layout, a ComfyUI
all-in-one file; headers only, no torch; and the doctor's --model lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_flow_train import single_file_model
from test_memory_fp8 import tiny_flux_file

from trainer.advisor.estimate import advise
from trainer.config.files import from_dict
from trainer.families import detect_path, family_or_none
from trainer.families.spec import DetectionError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sd_file(tiny_model_dir, tmp_path):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    from trainer.families.sd.checkpoint import save_checkpoint

    parts = {"unet": UNet2DConditionModel.from_pretrained(tiny_model_dir, subfolder="unet"),
             "vae": AutoencoderKL.from_pretrained(tiny_model_dir, subfolder="vae"),
             "text_encoder": CLIPTextModel.from_pretrained(tiny_model_dir,
                                                           subfolder="text_encoder")}
    return save_checkpoint(tmp_path / "sd.safetensors", **parts, dtype=torch.float32)


def test_each_layout_is_read_from_its_files(tmp_path, tiny_model_dir, sd_file):
    split = single_file_model(tmp_path / "split", "flux1")
    aio, _, flux_folder, _ = tiny_flux_file(tmp_path / "aio", torch.bfloat16)

    assert detect_path(tiny_model_dir).family == "sd1"
    assert detect_path(tiny_model_dir).layout == "diffusers folder"
    assert detect_path(flux_folder).family == "flux1" and detect_path(flux_folder).is_flow
    found = detect_path(sd_file)
    assert (found.family, found.layout, found.unet.has_vae) == ("sd1", "single file", True)
    alone = detect_path(split["pretrained_model_name_or_path"])
    assert alone.family == "flux1" and set(alone.flow.prefixes) == {"transformer"}
    both = detect_path(aio)
    assert set(both.flow.prefixes) == {"transformer", "vae", "clip_l", "t5xxl"}

    lora = tmp_path / "lora.safetensors"
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight":
               torch.zeros(2, 4)}, str(lora))
    with pytest.raises(DetectionError, match="LoRA"):
        detect_path(lora)
    with pytest.raises(DetectionError, match="pickle"):
        detect_path(tmp_path / "model.ckpt")
    assert family_or_none(tmp_path / "ae.st") is None
    assert family_or_none(split["ae"]) is None  # a VAE alone is no base model


def test_detection_imports_no_torch(tmp_path, tiny_model_dir, sd_file):
    """The GUI and the doctor ask before torch is loaded."""
    code = ("import sys\n"
            "from trainer.families import detect_path\n"
            f"print(detect_path({str(sd_file)!r}).family, "
            f"detect_path({str(tiny_model_dir)!r}).family)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["sd1", "sd1"]


def test_the_gui_hides_fields_by_the_same_detection(tmp_path, sd_file):
    from kohya_gui import family_view

    split = single_file_model(tmp_path, "flux1")
    assert family_view.model_family(split["pretrained_model_name_or_path"]) == "flux1"
    assert family_view.model_family(str(sd_file)) == "sd1"
    assert family_view.model_family(split["ae"]) is None  # unknown: every field shows


def _advise_auto(tmp_path, model: dict):
    from train_helpers import one_image_dataset

    one_image_dataset(tmp_path / "data")
    cfg = from_dict({"mode": "lora", "model": {**model, "model_version": "auto"},
                     "dataset": {"train_data_dir": str(tmp_path / "data"), "resolution": 64,
                                 "min_bucket_reso": 64, "max_bucket_reso": 64},
                     "saving": {"output_dir": str(tmp_path / "out")}})
    return advise(cfg)


def test_advise_reads_split_and_all_in_one_files_with_auto(tmp_path):
    """A BFL transformer with ae / clip_l / t5xxl beside it, and a ComfyUI all-in-one file:
    with model_version = 'auto' both are FLUX.1 to the advisor, their text encoders counted
    from the files they are in."""
    split = single_file_model(tmp_path / "split", "flux1")
    aio, configs, folder, _ = tiny_flux_file(tmp_path / "aio", torch.bfloat16)
    for model in (split, {"pretrained_model_name_or_path": str(aio),
                          "config_dir": str(configs), "tokenizer": str(folder)}):
        advice = _advise_auto(tmp_path / Path(model["pretrained_model_name_or_path"]).stem,
                              model)
        assert not advice.problems, advice.problems
        load = dict({p.name: p for p in advice.phases}["load"].lines)
        assert any(w.startswith("t5xxl") and b > 0 for w, b in load.items()), load
        assert any(w.startswith("clip_l") and b > 0 for w, b in load.items()), load


def test_the_doctor_says_what_a_model_file_holds(tmp_path, capsys):
    from trainer.cli import main

    split = single_file_model(tmp_path, "flux1")
    main(["doctor", "--model", split["pretrained_model_name_or_path"]])
    out = capsys.readouterr().out
    assert "FLUX.1-dev, guidance-distilled" in out and "holds: transformer" in out
    for setting in ("model.ae", "model.clip_l", "model.t5xxl"):
        assert f"set {setting} to" in out
    main(["doctor", "--model", split["ae"]])
    assert "cannot tell its family" in capsys.readouterr().out
    main(["doctor", "--model", str(tmp_path / "nothing.safetensors")])
    assert "no such file or folder" in capsys.readouterr().out


def test_the_advisor_counts_a_streamed_files_reads_not_the_whole_file(sd_file):
    """A .safetensors file streams (one group of tensors and the largest one at a time): the
    load phase counts that beside the built weights, not the file's size."""
    from trainer.advisor.model_configs import read_configs
    from trainer.config import ModelSection
    from trainer.families.common.files import read_safetensors_header
    from trainer.models.streamed_load import GROUP_BYTES

    configs = read_configs(ModelSection(pretrained_model_name_or_path=str(sd_file)))
    largest = max(end - begin for begin, end in (
        e["data_offsets"] for e in read_safetensors_header(sd_file).tensors.values()))
    assert configs.load_extra_bytes == GROUP_BYTES + largest
    assert configs.family == "sd"
