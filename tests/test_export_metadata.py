"""LoRA metadata: sd-scripts' ss_* keys and values, modelspec.*, and the sshs_* hashes.

The hashes are recomputed here from the bytes of the saved file, the way
sd-webui-additional-networks computes them, not through the code under test.
"""

import datetime
import hashlib
import json
import struct

import pytest
import torch
from peft import LoraConfig
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from trainer.config import TrainConfig
from trainer.export.hashes import file_hashes, precalculate_hashes
from trainer.export.lora import save_lora
from trainer.export.metadata import (
    RunFacts,
    base_model_version_str,
    build_lora_metadata,
    count_tags,
    modelspec_architecture,
)
from trainer.families.sd.tiny import build_components

REQUIRED_SS = """ss_network_module ss_network_dim ss_network_alpha ss_network_args
ss_base_model_version ss_output_name ss_learning_rate ss_unet_lr ss_text_encoder_lr ss_optimizer
ss_lr_scheduler ss_lr_warmup_steps ss_max_train_steps ss_num_epochs ss_epoch ss_steps
ss_num_train_images ss_num_reg_images ss_num_batches_per_epoch ss_batch_size_per_device
ss_gradient_accumulation_steps ss_resolution ss_enable_bucket ss_min_bucket_reso
ss_max_bucket_reso ss_bucket_info ss_tag_frequency ss_dataset_dirs ss_mixed_precision
ss_full_fp16 ss_seed ss_noise_offset ss_min_snr_gamma ss_training_started_at
ss_training_finished_at ss_clip_skip ss_max_grad_norm ss_caption_dropout_rate
ss_shuffle_caption ss_keep_tokens ss_flip_aug ss_v2 ss_session_id ss_sd_model_name
ss_training_comment""".split()
REQUIRED_SPEC = ["modelspec.sai_model_spec", "modelspec.architecture",
                 "modelspec.implementation", "modelspec.title", "modelspec.resolution",
                 "modelspec.date", "modelspec.prediction_type"]


def config(**saving):
    cfg = TrainConfig()
    cfg.network.network_dim, cfg.network.network_alpha = 16, 8.0
    cfg.network.conv_dim, cfg.network.conv_alpha = 4, 1.0
    cfg.optimizer.unet_lr = 2e-4
    cfg.training.noise_offset = 0.05
    cfg.saving.output_name = "my_cat"
    for key, value in saving.items():
        setattr(cfg.saving, key, value)
    return cfg


def facts(**kw):
    base = dict(
        steps=120, epoch=3, max_train_steps=400, num_epochs=10, num_batches_per_epoch=40,
        num_train_images=40, num_reg_images=0, dataset_dirs={"10_cat": {"n_repeats": 10,
                                                                        "img_count": 4}},
        tag_frequency={"10_cat": count_tags(["cat, red", "Cat"])},
        bucket_info={"buckets": {0: {"resolution": (512, 512), "count": 40}},
                     "mean_img_ar_error": torch.tensor(0.25)},
        training_started_at=1700000000.5, training_finished_at=1700000100.25, session_id=7,
        mixed_precision="bf16",
    )
    return RunFacts(**{**base, **kw})


def test_ss_keys_as_sd_scripts_writes_them():
    meta = build_lora_metadata(config(), facts())
    assert set(REQUIRED_SS) <= set(meta)
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["ss_network_module"] == "networks.lora"
    assert (meta["ss_network_dim"], meta["ss_network_alpha"]) == ("16", "8.0")
    assert json.loads(meta["ss_network_args"]) == {"conv_dim": "4", "conv_alpha": "1"}
    assert meta["ss_base_model_version"] == "sd_v1" and meta["ss_v2"] == "False"
    assert meta["ss_resolution"] == "(512, 512)"
    assert (meta["ss_steps"], meta["ss_epoch"], meta["ss_num_epochs"]) == ("120", "3", "10")
    assert meta["ss_max_train_steps"] == "400"
    assert meta["ss_training_started_at"] == "1700000000.5"
    assert meta["ss_training_finished_at"] == "1700000100.25"
    assert meta["ss_mixed_precision"] == "bf16"
    assert meta["ss_optimizer"] == "torch.optim.adamw.AdamW(weight_decay=0.01)"
    assert (meta["ss_learning_rate"], meta["ss_unet_lr"]) == ("0.0001", "0.0002")
    assert meta["ss_text_encoder_lr"] == "None"  # unset, written as sd-scripts does
    assert (meta["ss_noise_offset"], meta["ss_min_snr_gamma"]) == ("0.05", "None")
    assert (meta["ss_loss_type"], meta["ss_huber_schedule"]) == ("l2", "snr")
    assert (meta["ss_multires_noise_iterations"], meta["ss_debiased_estimation"]) == (
        "None", "False")


def test_loss_options_are_written_as_sd_scripts_names_them():
    cfg = config()
    cfg.training.loss_type, cfg.training.huber_c = "huber", 0.2
    cfg.training.multires_noise_iterations = 6
    cfg.training.debiased_estimation_loss = True
    meta = build_lora_metadata(cfg, facts())
    assert (meta["ss_loss_type"], meta["ss_huber_c"]) == ("huber", "0.2")
    assert meta["ss_multires_noise_iterations"] == "6"
    assert meta["ss_multires_noise_discount"] == "0.3"
    assert meta["ss_debiased_estimation"] == "True"
    assert meta["ss_output_name"] == "my_cat" and meta["ss_session_id"] == "7"
    assert json.loads(meta["ss_tag_frequency"]) == {"10_cat": {"cat": 2, "red": 1}}
    assert json.loads(meta["ss_dataset_dirs"]) == {"10_cat": {"n_repeats": 10, "img_count": 4}}
    assert json.loads(meta["ss_bucket_info"]) == {
        "buckets": {"0": {"resolution": [512, 512], "count": 40}}, "mean_img_ar_error": 0.25}
    assert meta["ss_sd_model_name"] == "embedded:tiny-sd15"


def test_no_conv_writes_empty_network_args_and_null_buckets():
    cfg = TrainConfig()
    meta = build_lora_metadata(cfg, RunFacts())
    assert meta["ss_network_args"] == "{}" and meta["ss_bucket_info"] == "null"
    assert meta["ss_network_alpha"] == "4.0" and meta["ss_mixed_precision"] == "no"


@pytest.mark.parametrize("version, v_pred, ss, arch", [
    ("sd1", False, "sd_v1", "stable-diffusion-v1/lora"),
    ("sd2", False, "sd_v2", "stable-diffusion-v2-512/lora"),
    ("sd2", True, "sd_v2_v", "stable-diffusion-v2-768-v/lora"),
    ("sdxl", False, "sdxl_base_v1-0", "stable-diffusion-xl-v1-base/lora"),
])
def test_model_version_strings(version, v_pred, ss, arch):
    assert base_model_version_str(version, v_pred) == ss
    assert modelspec_architecture(version, v_pred) == arch
    pred = "v_prediction" if v_pred else "epsilon"
    meta = build_lora_metadata(TrainConfig(), RunFacts(base_model_version=version,
                                                        prediction_type=pred))
    assert meta["ss_base_model_version"] == ss and meta["modelspec.architecture"] == arch
    assert meta["ss_v2"] == str(version == "sd2")
    assert meta["modelspec.prediction_type"] == ("v" if v_pred else "epsilon")
    sgm = "https://github.com/Stability-AI/generative-models"
    assert meta["modelspec.implementation"] == (sgm if version == "sdxl" else "diffusers")


def test_modelspec_keys():
    meta = build_lora_metadata(config(), facts())
    assert set(REQUIRED_SPEC) <= set(meta)
    assert meta["modelspec.sai_model_spec"] == "1.0.1"
    assert meta["modelspec.title"] == "my_cat"  # the output name unless a title is set
    assert meta["modelspec.resolution"] == "512x512"
    stamp = datetime.datetime.fromisoformat(meta["modelspec.date"]).timestamp()
    assert stamp == 1700000100
    assert not {"modelspec.author", "modelspec.description", "modelspec.license"} & set(meta)
    meta = build_lora_metadata(config(metadata_title="Cat", metadata_author="Me",
                                      metadata_description="A cat.", metadata_license="MIT"),
                               facts())
    assert (meta["modelspec.title"], meta["modelspec.author"]) == ("Cat", "Me")
    assert (meta["modelspec.description"], meta["modelspec.license"]) == ("A cat.", "MIT")


def adapted_unet(rank):
    unet = build_components()["unet"]
    unet.add_adapter(LoraConfig(r=rank, lora_alpha=rank / 2, init_lora_weights="gaussian",
                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return unet


def read_header(data):
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n])


@pytest.fixture(scope="module")
def big_lora(tmp_path_factory):
    """A LoRA file over 1 MiB, so that the legacy hash reads real bytes."""
    path = tmp_path_factory.mktemp("hash") / "big.safetensors"
    unet = adapted_unet(rank=192)
    save_lora(path, unet, None, config(), facts(), torch.float32)
    assert path.stat().st_size > 0x110000
    return path, unet


def test_sshs_hashes_match_the_file_bytes(big_lora):
    path, _ = big_lora
    data = path.read_bytes()
    n, header = read_header(data)
    meta = header["__metadata__"]
    model_hash = hashlib.sha256(data[8 + n:]).hexdigest()
    assert meta["sshs_model_hash"] == model_hash
    assert meta["modelspec.hash_sha256"] == "0x" + model_hash
    # legacy: 64 KiB at 1 MiB of the tensors saved with the ss_* metadata only
    training = {k: v for k, v in meta.items() if k.startswith("ss_")}
    ss_only = st_save(load_file(str(path)), metadata=training)
    legacy = hashlib.sha256(ss_only[0x100000:0x110000]).hexdigest()[:8]
    assert meta["sshs_legacy_hash"] == legacy
    assert legacy != hashlib.sha256(b"").hexdigest()[:8]


def test_hashes_ignore_user_metadata(big_lora, tmp_path):
    path, unet = big_lora
    other = save_lora(tmp_path / "t.safetensors", unet, None,
                      config(metadata_title="Renamed", metadata_author="Someone"), facts(),
                      torch.float32)
    with safe_open(str(path), "pt") as a, safe_open(str(other), "pt") as b:
        ma, mb = a.metadata(), b.metadata()
    assert ma["modelspec.title"] != mb["modelspec.title"]
    for key in ("sshs_model_hash", "sshs_legacy_hash"):
        assert ma[key] == mb[key]


def test_precalculated_hashes_of_a_small_file():
    tensors = {"a.alpha": torch.tensor(1.0), "a.lora_down.weight": torch.ones(2, 3)}
    data = st_save(tensors, metadata={"ss_x": "1"})
    n, _ = read_header(data)
    model_hash, legacy = precalculate_hashes(tensors, {"ss_x": "1", "modelspec.title": "t"})
    assert model_hash == hashlib.sha256(data[8 + n:]).hexdigest()
    assert legacy == "e3b0c442"  # under 1 MiB: the hash of nothing, as in sd-scripts


def test_file_hashes(tmp_path):
    blob = bytes(range(256)) * 5000
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    legacy, full = file_hashes(path)
    assert full == hashlib.sha256(blob).hexdigest()
    assert legacy == hashlib.sha256(blob[0x100000:0x110000]).hexdigest()[:8]


def test_model_name_and_hashes_of_a_local_model(tmp_path):
    model = tmp_path / "models" / "realistic.safetensors"
    model.parent.mkdir()
    model.write_bytes(b"x" * 10)
    cfg = TrainConfig()
    cfg.model.pretrained_model_name_or_path = str(model)
    legacy, full = file_hashes(model)
    meta = build_lora_metadata(cfg, RunFacts(sd_model_hash=legacy, new_sd_model_hash=full))
    assert meta["ss_sd_model_name"] == "realistic.safetensors"
    assert (meta["ss_sd_model_hash"], meta["ss_new_sd_model_hash"]) == (legacy, full)


def test_count_tags_like_sd_scripts():
    assert count_tags(["Cat, red ,, cat", " ", "blue sky,red"]) == {
        "cat": 2, "red": 2, "blue sky": 1}
