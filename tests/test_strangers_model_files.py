"""Model files from strangers (issue 22): a truncated .safetensors, a header that lies about
sizes or offsets, a LoRA given as the base model, an SDXL file with model_version "sd1", a .ckpt
that needs pickle beyond weights, a file of 0 bytes, a folder named x.safetensors. Each gives
one error naming the file and what is wrong, before anything trains: from `python -m trainer
train` (exit status 1, no traceback), from the GUI's runner (the job fails, the next one runs)
and from `inspect`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import tomli_w
import torch
from gui_helpers import gui_home, wait_for  # noqa: F401
from safetensors.torch import save_file
from train_helpers import one_image_dataset, randomize

from trainer import cli
from trainer.families.common import files as file_checks
from trainer.families.sd.tiny import build_sdxl_components, save_tiny_model

pytestmark = pytest.mark.usefixtures("no_network")


class Callback:  # a pickled object beyond tensors, as old training checkpoints hold
    pass


def rewrite_header(src: Path, dst: Path, change) -> Path:
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    dst.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (path, config folder or None, extra model settings)."""
    from trainer.families.sd.checkpoint import ldm_state_dict, save_checkpoint

    root = tmp_path_factory.mktemp("strangers")
    xl_dir = save_tiny_model(root / "xl-configs", family="sdxl")
    parts = build_sdxl_components()
    modules = {k: randomize(parts[k], i) for i, k in enumerate(
        ("unet", "vae", "text_encoder", "text_encoder_2"))}
    good = save_checkpoint(root / "sdxl.safetensors", **modules, family="sdxl",
                           dtype=torch.float32,
                           metadata={"modelspec.architecture": "stable-diffusion-v1",
                                     "ss_base_model_version": "sd_v1"})
    raw = Path(good).read_bytes()
    out = {"sdxl file, model_version = 'sd1'": (Path(good), xl_dir, {"model_version": "sd1"})}
    cut = root / "truncated.safetensors"
    cut.write_bytes(raw[: len(raw) - 4096])
    out["truncated .safetensors"] = (cut, xl_dir, {})

    def grow(header):  # a shape that needs more bytes than its offsets hold
        name = next(k for k in header if k != "__metadata__")
        header[name]["shape"] = [d * 2 for d in header[name]["shape"]]

    out["header lies about a shape"] = (
        rewrite_header(Path(good), root / "lying-shape.safetensors", grow), xl_dir, {})

    def shift(header):  # offsets that point past the end of the file
        for info in header.values():
            if isinstance(info, dict) and "data_offsets" in info:
                info["data_offsets"] = [o + 10**9 for o in info["data_offsets"]]

    out["header lies about offsets"] = (
        rewrite_header(Path(good), root / "lying-offsets.safetensors", shift), xl_dir, {})
    huge = root / "huge-header.safetensors"
    huge.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    out["header length past the end"] = (huge, None, {})
    lora = root / "some-lora.safetensors"
    save_file({f"lora_unet_down_blocks_0_attentions_0_proj_in.{s}": torch.zeros(4, 4)
               for s in ("lora_down.weight", "lora_up.weight")}
              | {"lora_unet_down_blocks_0_attentions_0_proj_in.alpha": torch.tensor(4.0)},
              str(lora), metadata={"ss_output_name": "<b>lora</b>"})
    out["a LoRA as the base model"] = (lora, None, {})
    unsafe = root / "unsafe.ckpt"
    torch.save({"state_dict": ldm_state_dict(**modules, family="sdxl"), "callbacks": Callback()},
               str(unsafe))
    out[".ckpt that needs pickle"] = (unsafe, xl_dir, {})
    empty = root / "empty.safetensors"
    empty.write_bytes(b"")
    out["0-byte file"] = (empty, None, {})
    folder = root / "x.safetensors"
    folder.mkdir()
    out["folder named x.safetensors"] = (folder, None, {})
    return out


EXPECTED = {  # case -> words the one error must hold
    "sdxl file, model_version = 'sd1'": ["model_version = 'sd1'", "SDXL"],
    "truncated .safetensors": ["truncated"],
    "header lies about a shape": ["header lies about tensor"],
    "header lies about offsets": ["truncated"],
    "header length past the end": ["header of 1024.0 GiB"],
    "a LoRA as the base model": ["this is a LoRA", "not a base model"],
    ".ckpt that needs pickle": ["needs more than tensors", "Callback"],
    "0-byte file": ["is empty (0 bytes)"],
    "folder named x.safetensors": ["is a folder, not a file"],
}


def config_file(tmp_path: Path, model: Path, config_dir: Path | None, extra: dict) -> Path:
    data = one_image_dataset(tmp_path / "data") if not (tmp_path / "data").exists() \
        else tmp_path / "data"
    cfg = {"mode": "lora",
           "model": {"pretrained_model_name_or_path": str(model), **extra,
                     **({"config_dir": str(config_dir), "tokenizer": str(config_dir)}
                        if config_dir else {})},
           "dataset": {"train_data_dir": str(data), "resolution": 64, "min_bucket_reso": 64,
                       "max_bucket_reso": 128, "bucket_reso_steps": 64},
           "training": {"max_train_steps": 2, "log_with": "none"},
           "saving": {"output_dir": str(tmp_path / "out")}}
    path = tmp_path / "cfg.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


@pytest.mark.parametrize("case", list(EXPECTED))
def test_train_gives_one_error_naming_the_file(files, case, tmp_path, capsys):
    model, config_dir, extra = files[case]
    code = cli.main(["train", str(config_file(tmp_path, model, config_dir, extra))])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert code == 1, captured.err
    assert len(errors) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert model.name in errors[0], errors[0]
    for words in EXPECTED[case]:
        assert words in errors[0], errors[0]
    assert "step 1" not in captured.out  # nothing trained
    assert not list((tmp_path / "out").glob("*.safetensors"))
    print(f"| {case} | {errors[0]} | {code} |", file=open(
        Path(__file__).parent / "artifacts" / "model_file_cases.md", "a"))


def test_the_checks_pass_good_files(files):
    good, _, _ = files["sdxl file, model_version = 'sd1'"]
    header = file_checks.read_safetensors_header(good)
    assert len(header.tensors) > 100 and header.metadata["ss_base_model_version"] == "sd_v1"
    file_checks.check_base_model_file(good, "model.pretrained_model_name_or_path")


def test_the_gui_runner_reports_it_and_runs_the_next_job(files, tmp_path, gui_home):  # noqa: F811
    from kohya_gui.runner import Runner
    from trainer.config import files as config_io

    runner = Runner(write_config=False)
    try:
        for case in ("truncated .safetensors", "0-byte file"):
            model, config_dir, extra = files[case]
            cfg = config_io.load(config_file(tmp_path, model, config_dir, extra))
            runner.submit(cfg)
        assert runner.wait_idle(120)
        snap = runner.snapshot()
        first, second = snap["history"][1], snap["history"][0]
        assert first["status"] == second["status"] == "failed"
        assert snap["error"].count("empty.safetensors") == 1 and "0 bytes" in snap["error"]
    finally:
        runner.close()


@pytest.mark.parametrize("case", ["truncated .safetensors", "header lies about a shape",
                                  "0-byte file", "folder named x.safetensors",
                                  "header length past the end"])
def test_inspect_names_the_file_and_the_problem(files, case, capsys):
    model, _, _ = files[case]
    code = cli.main(["inspect", str(model)])
    captured = capsys.readouterr()
    assert code != 0 and "Traceback" not in captured.err
    assert model.name in captured.err
    for words in EXPECTED[case]:
        if "GiB" not in words:
            assert words in captured.err, captured.err


def test_no_network_fixture_is_used_by_wait_for():  # keeps the helper import honest
    assert wait_for(lambda: True)
