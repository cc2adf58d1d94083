"""The built-in family configs, detection from keys and shapes, and the prediction-type rule.

The configs are checked three ways without a single real weight: their parameter counts are the
published ones; diffusers' own mapping of the original (LDM / SGM) model configs gives the same
architecture; and a checkpoint header of real shape (fake tensors: shapes, no memory) is read by
the detection and fully consumed, shape for shape, by diffusers' converters.
"""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders import single_file_utils as sfu
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from trainer.families.sd import detect as families
from trainer.families.sd.checkpoint import ldm_state_dict
from trainer.families.sd.detect import ASSETS, FAMILIES, DetectionError, Evidence

VARIANTS = ("sd1", "sd2-512", "sd2-768-v", "sdxl")
FAMILY_OF = {"sd1": "sd1", "sd2-512": "sd2", "sd2-768-v": "sd2", "sdxl": "sdxl"}
CLASSES = {"text_encoder": CLIPTextModel, "text_encoder_2": CLIPTextModelWithProjection}


def build(variant: str) -> dict[str, torch.nn.Module]:
    """The variant's modules from its built-in configs, on the current (meta or fake) device."""
    folder = ASSETS / variant
    out = {"unet": UNet2DConditionModel.from_config(
               UNet2DConditionModel.load_config(folder, subfolder="unet")),
           "vae": AutoencoderKL.from_config(AutoencoderKL.load_config(folder, subfolder="vae"))}
    for name, cls in CLASSES.items():
        if (folder / name).is_dir():
            out[name] = cls(CLIPTextConfig.from_pretrained(folder, subfolder=name))
    return out


# published sizes: SD 1.5's UNet 859.52M, SD 2's 865.91M, SDXL's 2.567B; the KL-f8 VAE 83.65M;
# CLIP ViT-L text 123.06M; OpenCLIP ViT-H text (23 of 24 blocks, as diffusers keeps) 340.39M;
# OpenCLIP bigG text with projection 694.66M
SIZES = {
    "sd1": {"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480},
    "sd2-512": {"unet": 865_910_724, "vae": 83_653_863, "text_encoder": 340_387_840},
    "sdxl": {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
             "text_encoder_2": 694_659_840},
}
SIZES["sd2-768-v"] = SIZES["sd2-512"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_builtin_configs_have_the_published_sizes(variant):
    with torch.device("meta"):
        modules = build(variant)
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in modules.items()}
    assert counts == SIZES[variant]


# the original configs' values (CompVis v1-inference.yaml, Stability v2-inference(-v).yaml,
# generative-models sd_xl_base.yaml), in their own names
LDM_UNET = dict(in_channels=4, out_channels=4, model_channels=320, attention_resolutions=[4, 2, 1],
                num_res_blocks=2, channel_mult=[1, 2, 4, 4], transformer_depth=1)
ORIGINAL = {
    "sd1": (dict(LDM_UNET, num_heads=8, context_dim=768), 512, 0.18215),
    "sd2-512": (dict(LDM_UNET, num_head_channels=64, use_linear_in_transformer=True,
                     context_dim=1024), 512, 0.18215),
    "sd2-768-v": (dict(LDM_UNET, num_head_channels=64, use_linear_in_transformer=True,
                       context_dim=1024), 768, 0.18215),
    "sdxl": (dict(LDM_UNET, attention_resolutions=[4, 2], channel_mult=[1, 2, 4],
                  num_head_channels=64, use_linear_in_transformer=True,
                  transformer_depth=[1, 2, 10], context_dim=2048, num_classes="sequential",
                  adm_in_channels=2816), 1024, 0.13025),
}
DDCONFIG = dict(double_z=True, z_channels=4, resolution=256, in_channels=3, out_ch=3, ch=128,
                ch_mult=[1, 2, 4, 4], num_res_blocks=2, attn_resolutions=[])


@pytest.mark.filterwarnings("ignore:`image_size` is deprecated:FutureWarning")
@pytest.mark.parametrize("variant", VARIANTS)
def test_builtin_configs_are_diffusers_mapping_of_the_original_configs(variant):
    unet_params, size, scale = ORIGINAL[variant]
    original = {"model": {"params": {"unet_config": {"params": unet_params},
                                     "first_stage_config": {"params": {"ddconfig": DDCONFIG}},
                                     "scale_factor": scale}}}
    folder = ASSETS / variant
    for name, mapping in (("unet", sfu.create_unet_diffusers_config_from_ldm),
                          ("vae", sfu.create_vae_diffusers_config_from_ldm)):
        want = mapping(original, {}, image_size=size)
        ours = json.loads((folder / name / "config.json").read_text())
        for key, value in want.items():
            if value is not None or key in ours:
                assert ours[key] == value, (name, key)


@pytest.mark.parametrize("variant", VARIANTS)
def test_family_folders_are_diffusers_pipeline_folders(variant):
    import diffusers

    folder = ASSETS / variant
    index = json.loads((folder / "model_index.json").read_text())
    pipeline = getattr(diffusers, index["_class_name"])
    assert pipeline.__name__ == FAMILIES[FAMILY_OF[variant]].pipeline_class
    config = pipeline.load_config(str(folder))
    for component in ("unet", "vae", "scheduler", *CLASSES):
        if component in index:
            library, cls = index[component]
            assert (folder / component).is_dir() and library in ("diffusers", "transformers")
    scheduler = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["prediction_type"] == ("v_prediction" if variant == "sd2-768-v"
                                            else "epsilon")
    assert config["_class_name"] == index["_class_name"]


# shapes that real checkpoints of each family have (from their safetensors headers)
ANCHORS = {
    "sd1": {"model.diffusion_model.input_blocks.1.1.proj_in.weight": (320, 320, 1, 1),
            "model.diffusion_model.output_blocks.11.0.skip_connection.weight": (320, 640, 1, 1),
            "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc1.weight":
                (3072, 768)},
    "sd2-768-v": {"model.diffusion_model.input_blocks.1.1.proj_in.weight": (320, 320),
                  "model.diffusion_model.input_blocks.2.1.transformer_blocks.0.attn2.to_k.weight":
                      (320, 1024),
                  "cond_stage_model.model.transformer.resblocks.23.attn.in_proj_weight":
                      (3072, 1024)},
    "sdxl": {"model.diffusion_model.label_emb.0.0.weight": (1280, 2816),
             "model.diffusion_model.input_blocks.4.1.transformer_blocks.1.attn2.to_k.weight":
                 (640, 2048),
             "model.diffusion_model.input_blocks.7.1.transformer_blocks.9.ff.net.2.weight":
                 (1280, 5120),
             "conditioner.embedders.1.model.text_projection": (1280, 1280),
             "conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight":
                 (3840, 1280)},
}


def _flat(tensors, module):
    """transformers 5's CLIPTextModel has no ``text_model.`` level; diffusers' converters do."""
    strip = not hasattr(module, "text_model")
    return {(k.removeprefix("text_model.") if strip else k): v for k, v in tensors.items()}


@pytest.mark.parametrize("variant", ["sd1", "sd2-768-v", "sdxl"])
def test_a_real_shaped_header_is_detected_and_fully_read(variant):
    with FakeTensorMode():
        modules = build(variant)
        family = FAMILIES[FAMILY_OF[variant]]
        header = ldm_state_dict(**modules, family=family.name)
        found = families.detect(header.keys(), lambda k: tuple(header[k].shape))
        assert (found.family, found.context_dim, found.in_channels) == (
            family, family.context_dim, 4)
        assert found.has_vae and found.ema_keys == 0
        families.check_builtin_shape(found)
        for key, shape in ANCHORS[variant].items():
            assert tuple(header[key].shape) == shape, key
        unet = sfu.convert_ldm_unet_checkpoint(header, dict(modules["unet"].config))
        vae = sfu.convert_ldm_vae_checkpoint(header, dict(modules["vae"].config))
        for name, got in (("unet", unet), ("vae", vae)):
            want = modules[name].state_dict()
            assert sorted(got) == sorted(want), name
            assert all(got[k].shape == want[k].shape for k in want), name
        for slot in family.encoders:
            module = modules[slot.component]
            if slot.prefix.endswith("transformer."):
                got = sfu.convert_ldm_clip_checkpoint(header)
            else:
                got = sfu.convert_open_clip_checkpoint(module, header, prefix=slot.prefix)
            got, want = _flat(got, module), _flat(module.state_dict(), module)
            assert sorted(got) == sorted(want), slot.component
            assert all(got[k].shape == want[k].shape for k in want), slot.component


def keys_of(*prefixes):
    return {p + "x.weight": (4, 4) for p in prefixes}


UNET = families.UNET_PREFIX
ATTN = UNET + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"


@pytest.mark.parametrize("keys, message", [
    (keys_of(UNET, "conditioner.embedders.0.model."), "SDXL refiner"),
    (keys_of(UNET, "conditioner.embedders.1.model."), "conditioner.embedders.0.transformer"),
    (keys_of("down_blocks.0.", "cond_stage_model.transformer."), "diffusers UNet"),
])
def test_detection_names_what_it_cannot_load(keys, message):
    with pytest.raises(DetectionError, match=message):
        families.detect(keys, keys.__getitem__)


def test_shapes_the_builtin_configs_cannot_hold_point_at_config_dir():
    keys = {**keys_of(UNET, "cond_stage_model.transformer."), ATTN: (320, 1024),
            UNET + "input_blocks.0.0.weight": (320, 9, 3, 3)}
    found = families.detect(keys, keys.__getitem__)
    assert found.family.name == "sd1" and found.context_dim == 1024 and not found.has_vae
    with pytest.raises(DetectionError, match=r"width is 1024.*inpainting.*model\.config_dir"):
        families.check_builtin_shape(found)
    with pytest.raises(DetectionError, match=r"'sdxl' \(SDXL\), but the file is SD 1\.x"):
        families.check_requested(found, "sdxl")
    families.check_requested(found, "auto")


@pytest.mark.parametrize("metadata, keys, step, want", [
    ({"modelspec.prediction_type": "v"}, (), None, "v_prediction"),
    ({"modelspec.prediction_type": "epsilon"}, (), None, "epsilon"),
    ({"modelspec.architecture": "stable-diffusion-v2-768-v"}, (), None, "v_prediction"),
    ({"modelspec.architecture": "stable-diffusion-v2-512"}, (), None, "epsilon"),
    ({}, ("v_pred",), None, "v_prediction"),
    ({}, (), 875000, "epsilon"),
    ({}, (), 140000, None),
    ({"modelspec.architecture": "stable-diffusion-v1"}, (), None, None),
])
def test_what_a_file_says_about_its_prediction_type(metadata, keys, step, want):
    assert families.prediction_evidence(metadata, keys, step).prediction_type == want


def test_the_prediction_type_rule():
    sd1, sd2 = FAMILIES["sd1"], FAMILIES["sd2"]
    none, eps = Evidence(None, ""), Evidence("epsilon", "the file")
    choose = families.choose_prediction
    assert choose(sd2, "epsilon", Evidence("v_prediction", "f"), None) == (
        "epsilon", "model.prediction_type")
    assert choose(sd2, None, eps, "v_prediction") == ("epsilon", "the file")
    assert choose(sd2, None, none, "epsilon") == ("epsilon", "model.config_dir")
    pred, why = choose(sd2, None, none, None)
    assert pred == "v_prediction" and "model.prediction_type" in why
    assert choose(sd1, None, none, None)[0] == "epsilon"
    assert sd2.config_dir(pred).name == "sd2-768-v" and sd2.config_dir("epsilon").name == "sd2-512"


def test_description_is_one_readable_line():
    unet = json.loads((ASSETS / "sd2-768-v" / "unet" / "config.json").read_text())
    vae = json.loads((ASSETS / "sd2-768-v" / "vae" / "config.json").read_text())
    resolution = families.native_resolution(unet, vae)
    assert families.describe(FAMILIES["sd2"], "v_prediction", resolution) == \
        "SD 2.x, v-prediction, 768"
    assert families.describe(FAMILIES["sdxl"], "epsilon", 1024, ("F16 weights",)) == \
        "SDXL, epsilon, 1024 (F16 weights)"
