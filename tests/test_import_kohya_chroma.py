"""A kohya_ss FLUX-tab config with ``model_type = "chroma"`` (sd-scripts' ``--model_type chroma``)
imports as Chroma and trains on the tiny Chroma: its T5 and autoencoder files, the flow
settings, what sd-scripts' Chroma does not read (CLIP-L, the guidance) reported with the
reason; without model_type it stays FLUX.1."""

from __future__ import annotations

import json
from pathlib import Path

from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from test_import_kohya_flow_train import tiny_flow_run
from train_helpers import one_image_dataset

from trainer.cli import main
from trainer.importers.kohya import import_kohya
from trainer.run.loop import run

DATA = Path(__file__).parent / "data" / "kohya_ss"
FLUX = json.loads((DATA / "flow_presets.json").read_text())["presets"][
    "lora/flux1D - adamw8bit fp8"]
CHROMA = dict(FLUX, model_type="chroma", guidance_scale=0, blocks_to_swap=8)


def reasons(report) -> dict[str, str]:
    return {**dict(report.not_needed), **{k: r for k, _, r in report.unsupported}}


def test_the_flux_tab_with_model_type_chroma_imports_as_chroma():
    cfg, report = import_kohya(CHROMA, source="chroma.json")
    assert report.keys() == set(CHROMA) and not report.unsupported
    assert cfg.model.model_version == "chroma"
    assert cfg.model.t5xxl == "/path/to/t5xxl" and cfg.model.ae == "/path/to/ae"
    assert cfg.model.clip_l is None and cfg.model.t5xxl_max_token_length == 512
    assert cfg.flow.timestep_sampling == "sigmoid" and cfg.flow.model_prediction_type == "raw"
    assert cfg.network.train_text_encoder is False and cfg.network.train_blocks == "all"
    assert cfg.training.blocks_to_swap > 0
    why = reasons(report)
    assert "CLIP-L" in why["clip_l"] and "guidance" in why["guidance_scale"]
    assert "always masked" in why["apply_t5_attn_mask"] and "chroma" in why["model_type"]
    flux, _ = import_kohya(dict(FLUX), source="flux.json")
    assert flux.model.model_version == "flux1"


def test_t5_trains_with_train_t5xxl_only_as_sd_scripts_runs_it():
    data = dict(CHROMA, text_encoder_lr=1e-5, unet_lr=1e-4)
    cfg, report = import_kohya(data, source="chroma.json")
    assert cfg.network.train_text_encoder is False
    assert any("train_t5xxl" in n for n in report.notes)
    cfg, _ = import_kohya(dict(data, train_t5xxl=True), source="chroma.json")
    assert cfg.network.train_text_encoder is True and cfg.network.train_t5xxl is True


def test_an_imported_chroma_config_trains_on_the_tiny_chroma(tmp_path, monkeypatch,
                                                             one_torch_thread):  # noqa: F811
    source = tmp_path / "kohya.json"
    source.write_text(json.dumps({k: v for k, v in CHROMA.items() if k != "blocks_to_swap"}))
    assert main(["import-kohya", str(source), "-o", str(tmp_path / "imported.toml")]) == 0
    import test_import_kohya_flow_train as helpers

    monkeypatch.setitem(helpers.TINY, "chroma", "embedded:tiny-chroma")
    cfg = tiny_flow_run(tmp_path / "imported.toml", tmp_path, one_image_dataset(tmp_path / "d"))
    result = run(cfg)
    assert result.status == "finished", result.error
    assert Path(result.output_path).is_file()
