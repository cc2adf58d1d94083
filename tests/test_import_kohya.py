"""Importing kohya_ss GUI JSON configs: every shipped preset imports (FLUX.1 / SD3 ones in
test_import_kohya_flow.py; other families are refused naming the key), kohya's value
conventions convert right, every key is accounted for in the report, and an imported config
trains on the tiny model - the same run from the config as from its TOML - for each
(network type, optimizer) pair that the presets use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from safetensors.torch import load_file
from train_helpers import one_image_dataset

from trainer.cli import main
from trainer.config import EMBEDDED_MODEL
from trainer.config import files as config_io
from trainer.config.files import ConfigError
from trainer.families import FAMILIES
from trainer.importers.kohya import import_kohya, import_kohya_file
from trainer.run.loop import run

DATA = Path(__file__).parent / "data" / "kohya_ss"


def presets(group: str) -> dict[str, dict]:
    return json.loads((DATA / f"{group}_presets.json").read_text())["presets"]


LORA, FINETUNE = presets("lora"), presets("finetune")
TYPES = {"Standard": "lora", "LyCORIS/LoCon": "locon", "LyCORIS/LoHa": "loha",
         "LyCORIS/LoKr": "lokr", "LyCORIS/iA3": "ia3"}


@pytest.mark.parametrize("name", sorted(LORA))
def test_every_shipped_lora_preset_imports_and_accounts_for_every_key(name):
    data = LORA[name]
    cfg, report = import_kohya(data, source=name)
    assert cfg.mode == "lora"
    assert cfg.network.network_type == TYPES[data["LoRA_type"]]
    assert cfg.optimizer.optimizer_type == data["optimizer"]
    assert report.keys() == set(data)  # nothing dropped silently
    assert f"{name} as a lora config" in report.text()


@pytest.mark.parametrize("name", sorted(FINETUNE))
def test_finetune_presets_import_as_dreambooth_with_a_note(name):
    cfg, report = import_kohya(FINETUNE[name], source=name)
    assert cfg.mode == "dreambooth"
    assert any("finetune config: imported as dreambooth" in n for n in report.notes)
    assert report.keys() >= set(FINETUNE[name])


def test_the_finetune_tabs_sdxl_switch_and_text_encoder_switch():
    cfg, report = import_kohya(FINETUNE["finetune/SDXL - Essenz series by AI Characters "
                                        "Training v1.0"])
    assert cfg.model.model_version == "sdxl"  # sdxl_checkbox
    assert cfg.network.train_text_encoder and cfg.network.train_text_encoder_2  # rates empty
    cfg, _ = import_kohya({"image_folder": "/img", "train_text_encoder": False,
                           "learning_rate_te": "1e-6"})
    assert cfg.dataset.train_data_dir == "/img" and not cfg.network.train_text_encoder


def test_a_dataset_config_replaces_the_folders():
    cfg, report = import_kohya({"LoRA_type": "Standard", "dataset_config": "/d/set.toml",
                                "train_data_dir": "/d/img", "reg_data_dir": "",
                                "masked_loss": True})
    assert cfg.dataset.dataset_config == "/d/set.toml" and cfg.training.masked_loss
    assert cfg.dataset.train_data_dir == "embedded:sample-dataset"  # the default: unused
    assert ("train_data_dir", "dataset_config names the folders (kohya_ss ignores this key "
                              "then)") in report.not_needed
    _, report = import_kohya({"LoRA_type": "Standard", "masked_loss": True})
    assert report.unsupported[0][0] == "masked_loss"  # no mask source without the TOML


def test_an_out_of_range_value_names_our_key_and_the_kohya_key():
    data = {**FINETUNE["finetune/adafactor"], "optimizer_args": "weight_decay=-1"}
    with pytest.raises(ConfigError) as err:
        import_kohya(data, source="adafactor.json")
    assert "optimizer.weight_decay = -1.0: must be >= 0" in str(err.value)
    assert "kohya_ss key optimizer_args" in str(err.value)


def test_the_adafactor_presets_weight_decay_of_2_imports_as_sd_scripts_takes_it():
    cfg, report = import_kohya(FINETUNE["finetune/adafactor"], source="adafactor.json")
    assert cfg.optimizer.weight_decay == 2.0
    assert report.unsupported == []  # dataset_repeats, the last one, maps too


@pytest.mark.parametrize(("data", "named"), [
    ({"LoRA_type": "Lumina", "network_dim": 8}, 'LoRA_type = "Lumina": a Lumina Image 2.0'),
    ({"LoRA_type": "Standard", "hunyuan_image_checkbox": True},
     "hunyuan_image_checkbox = true: a HunyuanImage config")])
def test_other_families_are_refused_naming_the_key(data, named):
    with pytest.raises(ConfigError) as err:
        import_kohya(data, source="x.json")
    assert len(err.value.problems) == 1 and named in str(err.value)
    trained = str(err.value).split("this studio trains ", 1)[1].split(" only", 1)[0]
    assert trained.replace(" and ", ", ").split(", ") == [s.label for s in FAMILIES.values()]


def test_strings_empty_values_and_zero_mean_what_kohya_means():
    cfg, report = import_kohya({
        "LoRA_type": "Standard", "learning_rate": "0.0001", "seed": "1234", "network_dim": "16",
        "network_alpha": "8", "max_train_steps": "", "epoch": "3", "noise_offset": "",
        "min_snr_gamma": 0, "clip_skip": "2", "keep_tokens": "1", "train_batch_size": "2",
        "gradient_accumulation_steps": 1.0, "text_encoder_lr": "5e-5", "unet_lr": "0.0001"})
    assert cfg.optimizer.learning_rate == 1e-4 and cfg.training.seed == 1234
    assert (cfg.network.network_dim, cfg.network.network_alpha) == (16, 8.0)
    assert cfg.training.max_train_steps is None and cfg.training.max_train_epochs == 3
    assert cfg.training.noise_offset is None and cfg.training.min_snr_gamma is None
    assert (cfg.model.clip_skip, cfg.dataset.keep_tokens, cfg.training.train_batch_size) == \
        (2, 1, 2)
    assert (cfg.optimizer.text_encoder_lr, cfg.optimizer.unet_lr) == (5e-5, 1e-4)
    assert cfg.network.train_text_encoder and cfg.network.train_unet
    assert {"max_train_steps", "noise_offset", "min_snr_gamma"} <= set(report.unset)


def test_an_empty_caption_extension_is_sd_scripts_default():
    """kohya_ss drops empty values from the TOML it hands sd-scripts, whose default is
    ``.caption``: the same images train with the same captions here."""
    cfg, report = import_kohya({"LoRA_type": "Standard", "caption_extension": ""})
    assert cfg.dataset.caption_extension == ".caption"
    assert any(n.startswith("caption_extension: empty") for n in report.notes)
    cfg, _ = import_kohya({"LoRA_type": "Standard", "caption_extension": ".txt"})
    assert cfg.dataset.caption_extension == ".txt"


def test_a_zero_text_encoder_rate_trains_the_unet_only_as_in_kohya():
    cfg, _ = import_kohya({"LoRA_type": "Standard", "text_encoder_lr": 0, "unet_lr": "1e-4"})
    assert not cfg.network.train_text_encoder and cfg.network.train_unet
    assert cfg.optimizer.text_encoder_lr is None


def test_epochs_steps_and_percent_warmup(tmp_path):
    cfg, report = import_kohya({"LoRA_type": "Standard", "max_train_steps": "200",
                                "epoch": 5, "lr_warmup": "10"})
    assert cfg.training.max_train_steps == 200 and cfg.training.max_train_epochs is None
    assert cfg.optimizer.lr_warmup_steps == 20 and "lr_warmup: 10% of 200 steps" in report.notes
    assert ("epoch", "max_train_steps decides the length (as in kohya_ss / sd-scripts)") in \
        report.not_needed
    cfg, _ = import_kohya({"LoRA_type": "Standard", "max_train_epochs": "4",
                           "max_train_steps": 1000, "lr_warmup": 50, "lr_warmup_steps": 7})
    assert (cfg.training.max_train_epochs, cfg.training.max_train_steps) == (4, None)
    assert cfg.optimizer.lr_warmup_steps == 7  # the absolute count wins
    # no max_train_steps: the percentage is of the steps that the folder gives
    data = tmp_path / "img"
    for i in range(2):
        one_image_dataset(tmp_path / f"d{i}")
        (data / "5_dog").mkdir(parents=True, exist_ok=True)
        (tmp_path / f"d{i}" / "1_circle" / "circle.png").rename(data / "5_dog" / f"{i}.png")
    cfg, report = import_kohya({"LoRA_type": "Standard", "train_data_dir": str(data),
                                "epoch": 3, "train_batch_size": 2, "lr_warmup": 20})
    assert cfg.optimizer.lr_warmup_steps == 3  # 2 images x 5 repeats / batch 2 x 3 epochs = 15
    # the dataset is not on this machine (yet): the percentage stays a fraction of the run
    cfg, report = import_kohya({"LoRA_type": "Standard", "train_data_dir": str(tmp_path / "no"),
                                "epoch": 3, "lr_warmup": 20})
    assert not report.unsupported and cfg.optimizer.lr_warmup_ratio == 0.2
    assert cfg.optimizer.lr_warmup_steps == 0


def test_max_resolution_square_and_not():
    cfg, report = import_kohya({"LoRA_type": "Standard", "max_resolution": "512,650"})
    assert cfg.dataset.resolution == [512, 648]  # the base W x H, 650 down to a multiple of 8
    assert any("512x650 trains at 512x648" in n for n in report.notes)
    cfg, report = import_kohya({"LoRA_type": "Standard", "max_resolution": "768,768"})
    assert cfg.dataset.resolution == 768 and not report.notes


def test_optimizer_args_text_and_the_optimizers_own_weight_decay():
    cfg, report = import_kohya({"LoRA_type": "Standard", "optimizer": "Prodigy",
                                "optimizer_args": '"d_coef=2" "weight_decay=0.1" decouple=True '
                                                  'safeguard_warmup=False betas=0.9,0.99'})
    args = cfg.optimizer.optimizer_args
    assert cfg.optimizer.weight_decay == 0.1 and "weight_decay" not in args
    assert args["d_coef"] == 2 and args["decouple"] is True and args["safeguard_warmup"] is False
    betas_refused = any(v == "betas=[0.9, 0.99]" for _, v, _ in report.unsupported)
    assert ("betas" in args) != betas_refused  # taken, or reported: never both, never neither
    cfg, report = import_kohya({"LoRA_type": "Standard", "optimizer": "Prodigy"})
    assert cfg.optimizer.weight_decay == 0.0  # prodigyopt's default, not the schema's 0.01
    with pytest.raises(ConfigError, match="optimizer_args"):
        import_kohya({"LoRA_type": "Standard", "optimizer_args": "d_coef"})


def test_additional_parameters_are_mapped_or_reported():
    cfg, report = import_kohya({"LoRA_type": "Standard", "additional_parameters":
                                '--max_grad_norm=0 --network_train_unet_only --log_prefix=xl '
                                '--zero_terminal_snr --min_snr_gamma 5 --wibble "a b" '
                                '--lr_warmup_steps=0.1'})
    assert cfg.optimizer.max_grad_norm == 0 and not cfg.network.train_text_encoder
    assert cfg.training.zero_terminal_snr and cfg.training.min_snr_gamma == 5
    assert ("additional_parameters --log_prefix",
            "the logs are named by training.log_tracker_name under training.logging_dir") in \
        report.not_needed
    assert ("additional_parameters --wibble", "a b",
            "an sd-scripts flag this importer does not map") in report.unsupported
    assert cfg.optimizer.lr_warmup_ratio == 0.1  # sd-scripts: a float < 1 is a fraction


def test_unknown_keys_and_unsupported_values_land_in_the_report():
    cfg, report = import_kohya({"LoRA_type": "Standard", "wibble": 3, "train_inpainting": True,
                                "scale_weight_norms": 0, "xformers": "xformers"})
    assert report.unknown == [("wibble", 3)]
    assert [k for k, *_ in report.unsupported] == ["train_inpainting"]
    assert "scale_weight_norms" in report.unset  # off in the file: nothing to say
    text = report.text()
    assert "Unknown keys" in text and "wibble = 3" in text and "xformers" in text


def test_lycoris_types_and_their_options():
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/LoKr", "network_dim": 100000,
                                "conv_dim": 100000, "factor": 6, "decompose_both": True,
                                "use_cp": True, "rank_dropout": 0.1, "module_dropout": "0"})
    net = cfg.network
    assert (net.network_type, net.network_dim, net.conv_dim, net.factor) == \
        ("lokr", 1024, 1024, 6)
    assert net.decompose_both and net.use_tucker and net.rank_dropout == 0.1
    assert net.module_dropout is None
    cfg, _ = import_kohya({"LoRA_type": "LyCORIS/LoCon", "dora_wd": True})
    assert cfg.network.network_type == "dora"
    cfg, report = import_kohya({"LoRA_type": "Standard", "rank_dropout": 0.2})
    assert cfg.network.rank_dropout == 0.2 and not report.unsupported  # sd-scripts' meaning
    _, report = import_kohya({"LoRA_type": "LyCORIS/iA3", "network_dim": 64})
    assert report.not_needed == [("network_dim", "not used by network_type 'ia3' (kohya_ss "
                                                 "passes no value)")]
    with pytest.raises(ConfigError, match="LoRA_type = 'LyCORIS/Native Fine-Tuning': not "):
        import_kohya({"LoRA_type": "LyCORIS/Native Fine-Tuning"})


def test_dreambooth_file_percent_stop_and_sample_prompts():
    cfg, report = import_kohya_file(DATA / "dreambooth_sd15.json")
    assert cfg.mode == "dreambooth" and cfg.training.max_train_steps == 400
    assert cfg.optimizer.lr_warmup_steps == 40
    assert cfg.network.stop_text_encoder_training == 200  # 50 % of 400 steps
    assert cfg.network.train_text_encoder and cfg.optimizer.text_encoder_lr == 2e-6
    assert cfg.sampling.sample_prompts == ["a photo of sks dog --n low quality --s 20",
                                           "a painting of sks dog"]  # options kept
    assert cfg.sampling.sample_sampler == "euler_a"
    cfg, _ = import_kohya({"learning_rate_te": 0, "stop_text_encoder_training": 10})
    assert cfg.mode == "dreambooth" and not cfg.network.train_text_encoder
    cfg, _ = import_kohya({"sdxl": True, "learning_rate_te1": 1e-5, "learning_rate_te2": 0},
                          mode="dreambooth")
    assert cfg.model.model_version == "sdxl" and cfg.network.train_text_encoder
    assert cfg.network.train_text_encoder_2 is False


def test_mode_comes_from_the_file_unless_given():
    with pytest.raises(ConfigError, match="--mode lora"):
        import_kohya({"learning_rate": 1e-4})
    cfg, report = import_kohya({"learning_rate": 1e-4}, mode="lora")
    assert cfg.mode == "lora"
    cfg, report = import_kohya({"LoRA_type": "Standard", "network_dim": 4}, mode="dreambooth")
    assert cfg.mode == "dreambooth" and "imported as dreambooth" in report.notes[0]
    assert ("network_dim", "a LoRA setting, not used in dreambooth mode") in report.not_needed
    cfg, _ = import_kohya({"token_string": "<cat>", "init_word": "cat", "template":
                           "object template", "num_vectors_per_token": "2"})
    assert (cfg.mode, cfg.network.token_string, cfg.network.caption_templates) == \
        ("textual_inversion", "<cat>", "object")


def test_cli_prints_the_report_and_writes_the_toml_atomically(tmp_path, capsys):
    source = tmp_path / "k.json"
    source.write_text(json.dumps(LORA["lora/sd15 - EDG LoraOptiSettings"]))
    out = tmp_path / "sub" / "k.toml"
    assert main(["import-kohya", str(source), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "max_resolution: 512x650 trains at 512x648" in printed and f"wrote {out}" in printed
    assert config_io.load(out) == import_kohya_file(source)[0]
    assert [p.name for p in out.parent.iterdir()] == ["k.toml"]  # no temporary file left
    assert main(["import-kohya", str(source)]) == 0
    captured = capsys.readouterr()
    assert config_io.load_toml_text(captured.out)["dataset"]["resolution"] == [512, 648]
    assert "Imported" in captured.err


def test_cli_names_the_file_and_line_of_broken_json(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "LoRA_type": "Standard",\n  "network_dim": ,\n}')
    assert main(["import-kohya", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 3" in err
    assert main(["import-kohya", str(tmp_path / "none.json")]) == 2
    assert "file not found" in capsys.readouterr().err


# --- training: the imported settings run on the tiny model --------------------------------


def tiny_run(cfg, tmp_path: Path, data: Path, name: str):
    """The imported config with the embedded tiny model, a one-image dataset, 2 steps and ranks
    of at most 4 (the tiny model's layers are 32-64 wide); the network type, its options, the
    optimizer, its arguments and the loss settings under test stay as imported."""
    raw = config_io.to_dict(cfg)
    for key in ("network_dim", "conv_dim"):
        if key in raw["network"]:
            raw["network"][key] = min(raw["network"][key], 4)
    raw["model"] = {"pretrained_model_name_or_path": EMBEDDED_MODEL}
    raw["dataset"].update(train_data_dir=str(data), resolution=64, min_bucket_reso=64,
                          max_bucket_reso=128, bucket_reso_steps=64, cache_latents_to_disk=False,
                          cache_text_encoder_outputs=False)
    raw["training"].update(max_train_steps=2, max_train_epochs=None, train_batch_size=1,
                           gradient_accumulation_steps=1, mixed_precision="no", full_bf16=False,
                           gradient_checkpointing=False, log_with="none")
    raw["saving"].update(output_dir=str(tmp_path / name), save_every_n_epochs=None,
                         save_every_n_steps=None, save_precision="fp32")
    raw["sampling"] = {}
    return config_io.from_dict(raw)


def _pairs() -> dict[tuple[str, str], str]:
    """One preset per (network type, optimizer) pair the LoRA presets use."""
    out: dict[tuple[str, str], str] = {}
    for name in sorted(LORA):
        cfg, _ = import_kohya(LORA[name])
        out.setdefault((cfg.network.network_type, cfg.optimizer.optimizer_type), name)
    return out


PAIRS = _pairs()


@pytest.mark.parametrize("pair", sorted(PAIRS), ids=lambda p: f"{p[0]}-{p[1]}")
def test_each_network_and_optimizer_pair_of_the_presets_trains(pair, tmp_path,
                                                               one_torch_thread):  # noqa: F811
    cfg, _ = import_kohya(LORA[PAIRS[pair]])
    result = run(tiny_run(cfg, tmp_path, one_image_dataset(tmp_path / "data"), "out"))
    assert result.status == "finished", result.error
    tensors = load_file(result.output_path)
    assert tensors and all(torch.isfinite(t).all() for t in tensors.values())


def test_training_from_the_exported_toml_is_the_same_run(tmp_path, one_torch_thread):  # noqa: F811
    source = tmp_path / "k.json"
    source.write_text(json.dumps(LORA["lora/sd15 - EDG LoConOptiSettings"]))
    assert main(["import-kohya", str(source), "-o", str(tmp_path / "k.toml")]) == 0
    imported, _ = import_kohya_file(source)
    data = one_image_dataset(tmp_path / "data")
    direct = run(tiny_run(imported, tmp_path, data, "a"))
    via_toml = run(tiny_run(config_io.load(tmp_path / "k.toml"), tmp_path, data, "b"))
    assert direct.status == via_toml.status == "finished", (direct.error, via_toml.error)
    first, second = load_file(direct.output_path), load_file(via_toml.output_path)
    assert first.keys() == second.keys() and len(first) > 0
    assert all(torch.equal(first[k], second[k]) for k in first)
