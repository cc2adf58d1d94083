"""An imported kohya_ss FLUX.1 / SD3 config trains (issue 18): the TOML that import-kohya writes
for the shipped FLUX.1 LoRA preset and the SD3 DreamBooth presets, pointed at the embedded tiny
model of its family and a one-image dataset, runs 2 steps with its flow settings, its optimizer
and its network as imported, and saves a file with finite weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from safetensors.torch import load_file
from train_helpers import one_image_dataset

from trainer.cli import main
from trainer.config import EMBEDDED_FLUX, EMBEDDED_SD3
from trainer.config import files as config_io
from trainer.run.loop import run

DATA = Path(__file__).parent / "data" / "kohya_ss"
FLOW = json.loads((DATA / "flow_presets.json").read_text())["presets"]
TINY = {"flux1": EMBEDDED_FLUX, "sd3": EMBEDDED_SD3}


def tiny_flow_run(toml: Path, tmp_path: Path, data: Path):
    """The imported TOML with its family's tiny model (the component files dropped: the tiny
    folder holds them), a one-image dataset at 64 px, 2 steps in fp32, rank at most 4; the
    [flow] section, the optimizer and the network type stay as imported."""
    raw = config_io.to_dict(config_io.load(toml))
    family = raw["model"]["model_version"]
    raw["model"] = {"pretrained_model_name_or_path": TINY[family], "model_version": family}
    if "network_dim" in raw["network"]:
        raw["network"]["network_dim"] = min(raw["network"]["network_dim"], 4)
    raw["dataset"].update(train_data_dir=str(data), resolution=64, min_bucket_reso=64,
                          max_bucket_reso=128, bucket_reso_steps=16, cache_latents_to_disk=False)
    raw["training"].update(max_train_steps=2, max_train_epochs=None, train_batch_size=1,
                           gradient_accumulation_steps=1, mixed_precision="no", full_bf16=False,
                           gradient_checkpointing=False, log_with="none")
    raw["saving"].update(output_dir=str(tmp_path / "out"), save_every_n_epochs=None,
                         save_every_n_steps=None, save_precision="fp32")
    raw["sampling"] = {}
    return config_io.from_dict(raw)


def _tensors(path: str) -> dict[str, torch.Tensor]:
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.rglob("*.safetensors"))
    assert files, f"nothing saved at {path}"
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(f).items()}


@pytest.mark.parametrize("name", sorted(FLOW))
def test_an_imported_flow_preset_trains_on_its_tiny_model(name, tmp_path,
                                                          one_torch_thread):  # noqa: F811
    source = tmp_path / "kohya.json"
    source.write_text(json.dumps(FLOW[name]))
    assert main(["import-kohya", str(source), "-o", str(tmp_path / "imported.toml")]) == 0
    cfg = tiny_flow_run(tmp_path / "imported.toml", tmp_path, one_image_dataset(tmp_path / "d"))
    assert cfg.model.model_version == ("flux1" if name.startswith("lora/") else "sd3")
    result = run(cfg)
    assert result.status == "finished", result.error
    tensors = _tensors(result.output_path)
    assert tensors and all(torch.isfinite(t).all() for t in tensors.values())
