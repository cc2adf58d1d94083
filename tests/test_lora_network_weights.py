"""network_weights / dim_from_weights (issue 21): a LoRA or LyCORIS file is loaded into the
network before step 1; files of another family, kind or rank are refused naming both."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.train_helpers import one_image_dataset, small_config
from trainer.methods.lora import LoraMethod
from trainer.methods.lora_weights import WeightsFileError
from trainer.models.loader import load_base_model
from trainer.run.loop import run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step LoRA (rank 4, alpha 2, with text encoder) on the tiny SD 1.x model."""
    root = tmp_path_factory.mktemp("first")
    data = one_image_dataset(root / "data")
    cfg = small_config(root, data, network={"network_dim": 4, "network_alpha": 2.0,
                                            "train_text_encoder": True},
                       training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    return result.output_path, data


def _prepared(tmp_path, data, **network):
    cfg = small_config(tmp_path, data, network={"train_text_encoder": True, **network})
    model = load_base_model(cfg.model)
    LoraMethod(cfg).prepare(model)
    return cfg, model


def _saved(cfg, model, path):
    from trainer.export.lora import save_lora

    save_lora(path, model.unet, model.text_encoder, cfg, None, torch.float32)
    return load_file(str(path))


def test_loaded_before_step_one_equals_the_file(tmp_path, trained):
    path, data = trained
    cfg, model = _prepared(tmp_path, data, network_dim=4, network_alpha=2.0,
                           network_weights=path)
    again = _saved(cfg, model, tmp_path / "again.safetensors")
    want = load_file(path)
    assert set(again) == set(want)
    for key in want:
        torch.testing.assert_close(again[key], want[key].float(), atol=1e-3, rtol=1e-3)


def test_dim_from_weights_takes_rank_alpha_and_modules(tmp_path, trained):
    path, data = trained
    tensors = load_file(path)
    # another's file: one module at rank 2, alpha 1, the rest left out
    name = next(k for k in tensors if k.startswith("lora_unet_") and
                k.endswith("attn1_to_q.lora_down.weight")).split(".")[0]
    small = {f"{name}.lora_down.weight": tensors[f"{name}.lora_down.weight"][:2].clone(),
             f"{name}.lora_up.weight": tensors[f"{name}.lora_up.weight"][:, :2].clone(),
             f"{name}.alpha": torch.tensor(1.0)}
    save_file(small, str(tmp_path / "small.safetensors"))
    cfg, model = _prepared(tmp_path, data, network_weights=str(tmp_path / "small.safetensors"),
                           dim_from_weights=True, train_text_encoder=False)
    again = _saved(cfg, model, tmp_path / "again.safetensors")
    assert set(again) == set(small)
    assert again[f"{name}.alpha"].item() == 1.0


def test_wrong_rank_is_refused_naming_both(tmp_path, trained):
    path, data = trained
    with pytest.raises(WeightsFileError, match="rank 4.*rank 8"):
        _prepared(tmp_path, data, network_dim=8, network_weights=path)


def test_wrong_family_and_kind_are_refused(tmp_path, trained):
    path, data = trained
    tensors = load_file(path)
    sdxl = {k.replace("lora_te_", "lora_te1_"): v for k, v in tensors.items()}
    save_file(sdxl, str(tmp_path / "sdxl.safetensors"))
    with pytest.raises(WeightsFileError, match="SDXL file; the model is SD 1.x"):
        _prepared(tmp_path, data, network_dim=4, network_weights=str(tmp_path /
                                                                      "sdxl.safetensors"))
    with pytest.raises(WeightsFileError, match="holds a lora network.*'loha'"):
        _prepared(tmp_path, data, network_type="loha", network_weights=path)


def test_continue_a_lycoris_file_two_steps(tmp_path, trained):
    _, data = trained
    first = small_config(tmp_path / "a", data, network={"network_type": "loha"},
                         training={"max_train_steps": 2})
    result = run(first)
    assert result.status == "finished", result.error
    cfg = small_config(tmp_path / "b", data, network={"network_type": "loha",
                                                      "network_weights": result.output_path},
                       training={"max_train_steps": 2})
    from trainer.methods.lycoris import LycorisMethod

    model = load_base_model(cfg.model)
    method = LycorisMethod(cfg)
    method.prepare(model)
    want = load_file(result.output_path)
    from trainer.export.lycoris import lycoris_tensors

    got = lycoris_tensors(method.loras, model.unet, dtype=torch.float32)
    for key in want:
        torch.testing.assert_close(got[key], want[key].float(), atol=1e-3, rtol=1e-3)
    assert run(cfg).status == "finished"


def test_continue_two_steps(tmp_path, trained):
    path, data = trained
    cfg = small_config(tmp_path, data, network={"network_dim": 4, "network_alpha": 2.0,
                                                "network_weights": path},
                       training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
