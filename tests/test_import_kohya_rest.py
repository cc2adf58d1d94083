"""The last kohya_ss keys of issue 21, in configs as the kohya_ss GUI saves them
(tests/data/kohya_ss/issue21_rest.json): each imports with every key accounted for and nothing
under "not supported", and each key lands where sd-scripts would have used it. The training
side of each is tested with its setting: test_block_lr.py, test_textual_inversion_weights.py,
test_import_kohya_memory.py, test_hub_upload.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.families.flux.kohya import flux_units
from trainer.importers.kohya import import_kohya

DATA = Path(__file__).parent / "data" / "kohya_ss"
CONFIGS = json.loads((DATA / "issue21_rest.json").read_text())["configs"]


def why(report) -> dict[str, str]:
    return dict(report.not_needed)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_config_imports_with_nothing_unsupported(name):
    cfg, report = import_kohya(CONFIGS[name], source=name)
    assert report.keys() == set(CONFIGS[name])  # nothing dropped silently
    assert report.unsupported == [] and report.unknown == []
    assert cfg.mode == name.split("/")[0].replace("finetune", "dreambooth")


def test_block_lr_of_the_sdxl_finetune_tab():
    data = CONFIGS["finetune/SDXL block_lr"]
    cfg, report = import_kohya(data)
    assert cfg.model.model_version == "sdxl"
    assert cfg.optimizer.block_lr == [float(v) for v in data["block_lr"].split(",")]
    assert cfg.dataset.dataset_repeats == 1  # "1": the images in image_folder train once


def test_weights_of_the_textual_inversion_tab():
    data = CONFIGS["textual_inversion/SD 1.5 resume TI training"]
    cfg, _ = import_kohya(data)
    assert cfg.network.embedding_weights == data["weights"]
    assert (cfg.network.token_string, cfg.network.num_vectors_per_token) == ("<my-cat>", 2)


def test_the_2023_conv_dims_which_sd_scripts_never_read():
    data = CONFIGS["lora/sd15 Kohya LoCon 2023 conv_dims"]
    cfg, report = import_kohya(data)
    assert cfg.network.block_dims == [int(v) for v in data["block_dims"].split(",")]
    # kohya_ss passed them as network_args conv_dims= / conv_alphas=, which networks.lora
    # ignores: the LoRA trained with conv_dim in every block, and so does this import
    assert cfg.network.conv_block_dims is None and cfg.network.conv_dim == data["conv_dim"]
    for key in ("conv_dims", "conv_alphas"):
        assert "networks.lora never reads those" in why(report)[key]


def test_rank_dropout_scale_and_fp8_base_of_a_lycoris_sdxl_config():
    cfg, report = import_kohya(CONFIGS["lora/SDXL LoKr rank_dropout_scale fp8_base"])
    assert cfg.network.network_type == "lokr" and cfg.network.rank_dropout == 0.1
    assert "create_network never reads it" in why(report)["rank_dropout_scale"]
    assert cfg.model.base_precision == "fp8"


def test_resume_from_the_hub():
    data = CONFIGS["lora/SDXL resume from the Hub"]
    cfg, _ = import_kohya(data)
    assert cfg.saving.resume_from_huggingface and cfg.training.resume == data["resume"]
    assert cfg.saving.save_state_to_huggingface and cfg.saving.huggingface_repo_id == \
        "me/sdxl-lora"


def test_block_swap_and_fp8_base_unet_of_flux():
    cfg, report = import_kohya(CONFIGS["lora/flux1D block swap fp8_base_unet"])
    assert cfg.training.blocks_to_swap == flux_units(18)
    assert cfg.model.base_precision == "fp8" and not cfg.model.fp8_text_encoders
    assert cfg.training.gradient_checkpointing


@pytest.mark.parametrize("data, processes, says", [
    ({"num_processes": 4, "multi_gpu": False}, 1, "4 without multi_gpu"),
    ({"num_processes": 4}, 1, "4 without multi_gpu"),
    ({"num_processes": 2, "multi_gpu": True}, 2, None),
    ({"num_processes": 1, "multi_gpu": True}, 1, "accelerate refuses multi_gpu"),
    ({"num_processes": 1, "multi_gpu": False}, 1, None),
])
def test_num_processes_counts_with_multi_gpu_as_accelerate_reads_kohya_ss_flags(
        data, processes, says):
    """kohya_ss passes --num_processes always and --multi_gpu when ticked; without it,
    accelerate starts one process (unless it sees several GPUs)."""
    cfg, report = import_kohya({"LoRA_type": "Standard", **data})
    assert cfg.training.num_processes == processes and not report.unsupported
    skipped = dict(report.not_needed)
    if says is None:
        assert "num_processes" not in skipped
    else:
        assert says in skipped["num_processes"]


def test_enable_wildcard_in_the_additional_parameters():
    cfg, report = import_kohya({"LoRA_type": "Standard",
                                "additional_parameters": "--enable_wildcard"})
    assert cfg.dataset.enable_wildcard is True and not report.unsupported
