"""ComfyUI's quantized split files (issue 31): files built the way ComfyUI quantizes
(``scale = amax(|W|) / finfo(fp8).max``, ``fp8(W / scale)``, ``CU comfy/quant_ops.py``) in its
legacy "scaled fp8" form (``scaled_fp8`` marker, ``scale_weight``, ``scale_input``) and its
current "mixed" form (``weight_scale``, ``input_scale``, ``comfy_quant`` JSON or the header's
``_quantization_metadata``) read back exactly as ``fp8.to(float32) * scale``; a plain fp8 file
passes through; nvfp4 / mxfp8 are refused naming the file to get instead."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from trainer.families.common import comfy_quant
from trainer.families.common.files import (
    ModelFileError,
    check_base_model_file,
    read_quant_layout,
    read_safetensors_header,
)
from trainer.models.streamed_load import load_streamed

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def comfy_quantize(weight: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """ComfyUI's per-tensor fp8 quantization (``_TensorCoreFP8LayoutBase.quantize`` with
    ``scale="recalculate"``): the scale from the largest magnitude, the weight divided by it."""
    limit = torch.finfo(fp8).max
    scale = torch.amax(weight.abs()).to(torch.float32) / limit
    q = (weight.to(torch.float32) / scale).clamp(-limit, limit).to(fp8)
    return q, scale


def originals() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {name: (torch.randn(shape, generator=g) * 0.05).to(torch.bfloat16)
            for name, shape in (("blocks.0.attn.qkv", (48, 16)), ("blocks.0.mlp.fc1", (32, 16)),
                                ("blocks.0.mlp.fc2", (16, 32)))}


def comfy_json(conf: dict) -> torch.Tensor:
    """What ComfyUI's MixedPrecisionOps.state_dict writes for ``<layer>.comfy_quant``."""
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def plain_rest() -> dict[str, torch.Tensor]:
    return {"blocks.0.attn.qkv.bias": torch.ones(48, dtype=torch.bfloat16),
            "norm.weight": torch.full((16,), 0.5, dtype=torch.bfloat16)}


def legacy_file(tmp_path, prefix: str = "", fp8=E4M3):
    """The legacy form as ComfyUI's old scaled-fp8 files hold it."""
    tensors, quantized = plain_rest(), {}
    tensors = {prefix + k: v for k, v in tensors.items()}
    tensors[prefix + "scaled_fp8"] = torch.empty(0, dtype=fp8)
    for layer, w in originals().items():
        q, scale = comfy_quantize(w, fp8)
        quantized[prefix + layer] = (q, scale, w)
        tensors[f"{prefix}{layer}.weight"] = q
        tensors[f"{prefix}{layer}.scale_weight"] = scale
        tensors[f"{prefix}{layer}.scale_input"] = torch.tensor(1.0)
    path = tmp_path / "model_fp8_scaled.safetensors"
    save_file(tensors, path)
    return path, quantized


def mixed_file(tmp_path, in_header: bool = False):
    """The mixed form: one e4m3fn and one e5m2 layer, one left in bf16."""
    tensors, quantized, layers = plain_rest(), {}, {}
    items = list(originals().items())
    for (layer, w), fp8 in zip(items[:2], (E4M3, E5M2)):
        q, scale = comfy_quantize(w, fp8)
        quantized[layer] = (q, scale, w)
        conf = {"format": str(fp8).removeprefix("torch.")}
        layers[layer] = conf
        tensors.update({f"{layer}.weight": q, f"{layer}.weight_scale": scale,
                        f"{layer}.input_scale": torch.tensor(0.25)})
        if not in_header:
            tensors[f"{layer}.comfy_quant"] = comfy_json(conf)
    tensors[f"{items[2][0]}.weight"] = items[2][1]
    path = tmp_path / "model_fp8_mixed.safetensors"
    metadata = {"_quantization_metadata": json.dumps({"layers": layers})} if in_header else None
    save_file(tensors, path, metadata=metadata)
    return path, quantized


def assert_dequantized(out: dict[str, torch.Tensor], quantized) -> None:
    for layer, (q, scale, original) in quantized.items():
        got = out[f"{layer}.weight"]
        assert got.dtype == torch.float32
        assert torch.equal(got, q.to(torch.float32) * scale)  # the scale math, exactly
        # and the original within fp8's rounding: half a step of the mantissa, or of the
        # smallest subnormal
        mantissa = 3 if q.dtype == E4M3 else 2
        tiny = 2.0 ** (-9 if q.dtype == E4M3 else -16)
        bound = original.float().abs() * 2.0 ** -(mantissa + 1) + scale * tiny / 2
        assert ((got - original.float()).abs() <= bound * 1.0001).all(), layer
        assert not torch.equal(got, q.to(torch.float32))  # the scale was applied


WEIGHTS = {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.mlp.fc1.weight",
           "blocks.0.mlp.fc2.weight", "norm.weight"}


def test_legacy_scaled_fp8_dequantizes_exactly(tmp_path):
    path, quantized = legacy_file(tmp_path)
    layout = read_quant_layout(path)
    assert layout.form == "scaled_fp8"
    assert layout.scales == {f"{k}.weight": f"{k}.scale_weight" for k in quantized}
    assert set(layout.formats.values()) == {"float8_e4m3fn"}
    assert layout.dropped == {"scaled_fp8"} | {f"{k}.{s}" for k in quantized
                                              for s in ("scale_weight", "scale_input")}
    out = comfy_quant.load_tensors(path, torch.float32)
    assert set(out) == WEIGHTS  # no marker, no scales
    assert_dequantized(out, quantized)
    assert out["norm.weight"].dtype == torch.bfloat16  # unscaled: as stored
    check_base_model_file(path, "model.pretrained_model_name_or_path")  # passes the checks


def test_legacy_marker_under_a_checkpoint_prefix(tmp_path):
    prefix = "model.diffusion_model."
    path, quantized = legacy_file(tmp_path, prefix, fp8=E5M2)
    layout = read_quant_layout(path)
    assert set(layout.formats.values()) == {"float8_e5m2"}  # the marker's dtype names it
    out = comfy_quant.load_tensors(path, torch.float32, select=lambda k: k.startswith(prefix))
    assert set(out) == {prefix + k for k in WEIGHTS}
    assert_dequantized(out, quantized)


@pytest.mark.parametrize("in_header", [False, True], ids=["comfy_quant", "header_metadata"])
def test_mixed_form_dequantizes_exactly(tmp_path, in_header):
    path, quantized = mixed_file(tmp_path, in_header)
    layout = read_quant_layout(path)
    assert layout.form == "mixed"
    assert layout.formats == {"blocks.0.attn.qkv.weight": "float8_e4m3fn",
                              "blocks.0.mlp.fc1.weight": "float8_e5m2"}
    assert all(layout.scales[f"{k}.weight"] == f"{k}.weight_scale" for k in quantized)
    out = dict(comfy_quant.iter_tensors(path, torch.float32))
    assert set(out) == WEIGHTS
    assert_dequantized(out, quantized)
    assert out["blocks.0.mlp.fc2.weight"].dtype == torch.bfloat16
    check_base_model_file(path, "model.pretrained_model_name_or_path")


def test_both_forms_give_the_same_weights_in_bf16(tmp_path):
    """ComfyUI rewrites the legacy form into the mixed one on load: both read the same."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    legacy, quantized = legacy_file(tmp_path / "a")
    mixed, _ = mixed_file(tmp_path / "b")
    a = comfy_quant.load_tensors(legacy)
    b = comfy_quant.load_tensors(mixed)
    layer = "blocks.0.attn.qkv"
    q, scale, _ = quantized[layer]
    assert a[f"{layer}.weight"].dtype == torch.bfloat16
    assert torch.equal(a[f"{layer}.weight"], (q.float() * scale).to(torch.bfloat16))
    assert torch.equal(a[f"{layer}.weight"], b[f"{layer}.weight"])


def test_plain_fp8_file_passes_through(tmp_path):
    tensors = {"a.weight": torch.randn(8, 4).to(E4M3), "a.bias": torch.randn(8)}
    path = tmp_path / "model_fp8_e4m3fn.safetensors"
    save_file(tensors, path)
    layout = read_quant_layout(path)
    assert layout.form == "plain" and not layout.scales and not layout.dropped
    out = comfy_quant.load_tensors(path)
    assert out["a.weight"].dtype == E4M3
    assert torch.equal(out["a.weight"].float(), tensors["a.weight"].float())
    assert torch.equal(out["a.bias"], tensors["a.bias"])


def test_reader_streams_into_a_module(tmp_path):
    """The reader drops into streamed_load: meta tensors announce the dequantized dtype."""
    path, quantized = mixed_file(tmp_path)
    reader = comfy_quant.ComfyQuantReader(path, torch.bfloat16)
    keys = ["blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias"]
    assert reader.meta(keys)[keys[0]].dtype == torch.bfloat16

    def build(state):
        layer = torch.nn.Linear(16, 48, dtype=torch.bfloat16)
        layer.load_state_dict({"weight": reader.read(keys[0]), "bias": reader.read(keys[1])})
        assert set(state) == set(keys)
        return layer

    layer = load_streamed(reader, keys, build)
    q, scale, _ = quantized["blocks.0.attn.qkv"]
    assert torch.equal(layer.weight.data, (q.float() * scale).to(torch.bfloat16))


def nvfp4_file(tmp_path, name: str, fmt: str = "nvfp4"):
    layer = "layers.0.attention.qkv"
    tensors = {f"{layer}.weight": torch.zeros(32, 8, dtype=torch.uint8),
               f"{layer}.weight_scale": torch.ones(32, 1).to(E4M3),
               f"{layer}.weight_scale_2": torch.tensor(1.0),
               f"{layer}.comfy_quant": comfy_json({"format": fmt}),
               "x_pad_token": torch.zeros(1, 16, dtype=torch.bfloat16)}
    path = tmp_path / name
    save_file(tensors, path)
    return path


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_nvfp4_and_mxfp8_refused_naming_the_file_to_get(tmp_path, fmt):
    path = nvfp4_file(tmp_path, f"z_image_turbo_{fmt}.safetensors", fmt)
    with pytest.raises(ModelFileError) as caught:
        read_quant_layout(path)
    message = str(caught.value)
    assert str(path) in message and fmt in message
    assert "z_image_turbo_bf16.safetensors" in message
    with pytest.raises(ModelFileError, match=r"model\.pretrained_model_name_or_path = .*"
                                             "z_image_turbo_bf16"):
        check_base_model_file(path, "model.pretrained_model_name_or_path")
    with pytest.raises(ModelFileError, match=fmt):
        comfy_quant.load_tensors(path)


def test_text_encoder_fp4_mixed_suggests_its_plain_file(tmp_path):
    path = nvfp4_file(tmp_path, "qwen_3_4b_fp4_mixed.safetensors")
    with pytest.raises(ModelFileError, match="qwen_3_4b.safetensors"):
        read_quant_layout(path)


def test_damaged_quantization_metadata_named(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a.weight": torch.zeros(2, 2)}, path,
              metadata={"_quantization_metadata": "{not json"})
    assert read_safetensors_header(path).metadata  # the header itself is fine
    with pytest.raises(ModelFileError, match="_quantization_metadata"):
        read_quant_layout(path)
