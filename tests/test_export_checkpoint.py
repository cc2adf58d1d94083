"""Single-file checkpoints in the original layout, held to diffusers' own reader.

Every model here has random weights in every parameter (norms included), so a swapped pair of
same-shaped tensors cannot pass as equal.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders import single_file_utils as sfu
from safetensors import safe_open
from safetensors.torch import load_file
from train_helpers import randomize
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from trainer.export.lora import text_encoder_module_path
from trainer.families.sd.checkpoint import ldm_state_dict, save_checkpoint
from trainer.families.sd.tiny import build_components, build_tokenizer


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert got[key].shape == tensor.shape, key
        assert torch.equal(got[key].to(tensor.dtype), tensor), key


def assert_same_module(got: torch.nn.Module, want: torch.nn.Module) -> None:
    assert_same(got.state_dict(), want.state_dict())


def te_keys(text_encoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The text encoder's weights under transformers 4's ``text_model.`` names."""
    return {text_encoder_module_path(k) if not k.startswith("text_projection") else k: v
            for k, v in text_encoder.state_dict().items()}


def under(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if k.startswith(prefix)}


def assert_unet_vae_read_back(ckpt, unet, vae) -> None:
    """diffusers' converters give back exactly the modules' weights, and consume every key."""
    assert_same(sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config)), unet.state_dict())
    assert len(under(ckpt, "model.diffusion_model.")) == len(unet.state_dict())
    assert_same(sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config)), vae.state_dict())
    assert len(under(ckpt, "first_stage_model.")) == len(vae.state_dict())


def text_config(width: int, layers: int, **kw) -> CLIPTextConfig:
    return CLIPTextConfig(vocab_size=761, hidden_size=width, intermediate_size=2 * width,
                          num_hidden_layers=layers, num_attention_heads=4,
                          max_position_embeddings=77, **kw)


def small_unet(**kw) -> UNet2DConditionModel:
    args = dict(sample_size=8, in_channels=4, out_channels=4, norm_num_groups=8,
                block_out_channels=(16, 32), layers_per_block=1, attention_head_dim=4,
                cross_attention_dim=32, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    args.update(kw)
    return UNet2DConditionModel(**args)


def small_vae() -> AutoencoderKL:
    return AutoencoderKL(block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1,
                         down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4)


def tiny_sd1(folder) -> dict:
    parts = {
        "unet": UNet2DConditionModel.from_pretrained(folder, subfolder="unet"),
        "vae": AutoencoderKL.from_pretrained(folder, subfolder="vae"),
        "text_encoder": CLIPTextModel.from_pretrained(folder, subfolder="text_encoder"),
    }
    return {k: randomize(m, seed) for seed, (k, m) in enumerate(parts.items())}


# --- SD 1.x -----------------------------------------------------------------------------------


def test_sd1_loads_back_through_from_single_file(tiny_model_dir, tmp_path):
    from diffusers import StableDiffusionPipeline

    parts = tiny_sd1(tiny_model_dir)
    path = save_checkpoint(tmp_path / "model.safetensors", **parts, dtype=torch.float32)
    pipe = StableDiffusionPipeline.from_single_file(str(path), config=str(tiny_model_dir),
                                                    local_files_only=True)
    for name, module in parts.items():
        assert_same_module(getattr(pipe, name), module)


def test_sd1_every_key_is_one_diffusers_reads(tiny_model_dir):
    parts = tiny_sd1(tiny_model_dir)
    ckpt = ldm_state_dict(**parts)
    assert_unet_vae_read_back(ckpt, parts["unet"], parts["vae"])
    clip = under(ckpt, "cond_stage_model.transformer.text_model.")
    assert not any("position_ids" in k for k in ckpt)
    assert len(clip) == len(ckpt) - len(under(ckpt, "model.")) - len(under(ckpt, "first_"))
    assert_same(sfu.convert_ldm_clip_checkpoint(ckpt), te_keys(parts["text_encoder"]))
    assert sfu.infer_diffusers_model_type(ckpt) == "v1"
    # the VAE's mid attention is a 1x1 conv in the original
    assert ckpt["first_stage_model.decoder.mid.attn_1.q.weight"].dim() == 4


def test_unet_map_follows_the_config(tmp_path):
    torch.manual_seed(0)
    unet = randomize(small_unet(
        layers_per_block=2, block_out_channels=(16, 16, 32), transformer_layers_per_block=2,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")), 3)
    tiny = build_components()
    vae, te = randomize(tiny["vae"], 4), randomize(tiny["text_encoder"], 5)
    path = save_checkpoint(tmp_path / "m.safetensors", unet, vae, te, dtype=torch.float32)
    ckpt = load_file(str(path))
    assert_unet_vae_read_back(ckpt, unet, vae)
    blocks = {".".join(k.split(".")[2:4]) for k in ckpt if k.startswith("model.diffusion_model")}
    assert {f"input_blocks.{i}" for i in range(9)} <= blocks and "input_blocks.9" not in blocks
    assert {f"output_blocks.{i}" for i in range(9)} <= blocks and "output_blocks.9" not in blocks
    m = "model.diffusion_model."
    for key in ("input_blocks.3.0.op", "input_blocks.6.0.op",  # after 2 layers, not the last
                "output_blocks.2.1.conv",  # UpBlock2D: upsampler right after the resnet
                "output_blocks.5.2.conv",  # CrossAttnUpBlock2D: after the attention
                "input_blocks.4.1.transformer_blocks.1.attn2.to_k",
                "middle_block.1.proj_in", "output_blocks.8.0.skip_connection"):
        assert m + key + ".weight" in ckpt, key
    assert m + "input_blocks.7.1.norm.weight" not in ckpt  # DownBlock2D has no attention
    unet.save_pretrained(tmp_path / "cfg" / "unet")
    loaded = UNet2DConditionModel.from_single_file(
        str(path), config=str(tmp_path / "cfg"), subfolder="unet", local_files_only=True)
    assert_same_module(loaded, unet)


def test_fp16_save_with_metadata_leaves_the_model_alone(tiny_model_dir, tmp_path):
    parts = tiny_sd1(tiny_model_dir)
    meta = {"modelspec.title": "tiny", "ss_output_name": "dog"}
    path = save_checkpoint(tmp_path / "half.safetensors", **parts, metadata=meta)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == meta
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes == {torch.float16}
    assert all(p.dtype == torch.float32 for m in parts.values() for p in m.parameters())
    half = load_file(str(path))
    want = ldm_state_dict(**parts)
    assert sorted(half) == sorted(want)
    assert torch.equal(half["model.diffusion_model.out.2.weight"],
                       want["model.diffusion_model.out.2.weight"].half())
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("kwargs, message", [
    ({"family": "sd3"}, "family 'sd3'"),
    ({"family": "sdxl"}, "needs text_encoder_2"),
    ({"family": "sd1", "text_encoder_2": torch.nn.Linear(1, 1)}, "one text encoder"),
])
def test_refuses_what_the_layout_cannot_hold(kwargs, message):
    tiny = build_components()
    with pytest.raises(ValueError, match=message):
        ldm_state_dict(tiny["unet"], tiny["vae"], tiny["text_encoder"], **kwargs)


def test_refuses_unet_blocks_without_an_original_name():
    unet = small_unet(down_block_types=("AttnDownBlock2D", "DownBlock2D"))
    tiny = build_components()
    with pytest.raises(ValueError, match="AttnDownBlock2D"):
        ldm_state_dict(unet, tiny["vae"], tiny["text_encoder"])


# --- SD 2.x -----------------------------------------------------------------------------------


def tiny_sd2() -> dict:
    torch.manual_seed(0)
    unet = small_unet(use_linear_projection=True, attention_head_dim=(2, 4))
    te = CLIPTextModel(text_config(32, 2, hidden_act="gelu"))
    parts = {"unet": unet, "vae": small_vae(), "text_encoder": te}
    return {k: randomize(m, seed) for seed, (k, m) in enumerate(parts.items())}


def test_sd2_loads_back_through_from_single_file(tmp_path):
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    parts = tiny_sd2()
    folder = tmp_path / "sd2"
    scheduler = DDIMScheduler(steps_offset=1, clip_sample=False)
    StableDiffusionPipeline(**parts, tokenizer=build_tokenizer(), scheduler=scheduler,
                            safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(folder)
    path = save_checkpoint(tmp_path / "sd2.safetensors", **parts, family="sd2",
                           dtype=torch.float32)
    ckpt = load_file(str(path))
    assert "cond_stage_model.model.transformer.resblocks.1.attn.in_proj_weight" in ckpt
    assert ckpt["model.diffusion_model.input_blocks.1.1.proj_in.weight"].dim() == 2  # linear
    assert_unet_vae_read_back(ckpt, parts["unet"], parts["vae"])
    te = parts["text_encoder"]
    assert_same(sfu.convert_open_clip_checkpoint(te, ckpt), te_keys(te))
    pipe = StableDiffusionPipeline.from_single_file(str(path), config=str(folder),
                                                    local_files_only=True)
    for name, module in parts.items():
        assert_same_module(getattr(pipe, name), module)


def test_sd2_vit_h_gets_its_24th_block_back_as_an_identity():
    """diffusers keeps 23 of ViT-H's 24 blocks; the file holds 24, the last one a no-op."""
    torch.manual_seed(0)
    te23 = randomize(CLIPTextModel(text_config(8, 23, hidden_act="gelu")), 1)
    prefix = "cond_stage_model.model."
    tiny = build_components()
    ckpt = ldm_state_dict(tiny["unet"], tiny["vae"], te23, family="sd2")
    assert f"{prefix}transformer.resblocks.23.attn.in_proj_weight" in ckpt
    assert torch.equal(ckpt[f"{prefix}text_projection"], torch.eye(8))
    # diffusers' reader skips exactly the padding and reads the 23 blocks back
    padding = {k for k in ckpt if ".resblocks.23." in k or k.endswith("text_projection")}
    assert padding == set(sfu.SD_2_TEXT_ENCODER_KEYS_TO_IGNORE)
    assert_same(sfu.convert_open_clip_checkpoint(te23, ckpt), te_keys(te23))
    # read all 24 blocks (under another prefix nothing is skipped): same output as 23
    te24 = CLIPTextModel(text_config(8, 24, hidden_act="gelu")).eval()
    all24 = {k.replace(prefix, "x."): v for k, v in ckpt.items() if k.startswith(prefix)}
    state = sfu.convert_open_clip_checkpoint(te24, all24, prefix="x.")
    state.pop("text_projection.weight")
    te24.load_state_dict({k.removeprefix("text_model."): v for k, v in state.items()}
                         if not hasattr(te24, "text_model") else state)
    ids = torch.randint(0, 761, (2, 77), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(te24(ids)[0], te23(ids)[0], rtol=0, atol=0)


# --- SDXL -------------------------------------------------------------------------------------


def tiny_sdxl() -> dict:
    torch.manual_seed(0)
    te2 = CLIPTextModelWithProjection(text_config(48, 2, hidden_act="gelu", projection_dim=40))
    unet = small_unet(
        layers_per_block=2, cross_attention_dim=32 + 48, use_linear_projection=True,
        transformer_layers_per_block=(1, 2), attention_head_dim=(2, 4),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=40 + 6 * 8)
    parts = {"unet": unet, "vae": small_vae(), "text_encoder": CLIPTextModel(text_config(32, 2)),
             "text_encoder_2": te2}
    return {k: randomize(m, seed) for seed, (k, m) in enumerate(parts.items())}


def test_sdxl_loads_back_through_from_single_file(tmp_path):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    parts = tiny_sdxl()
    folder = tmp_path / "sdxl"
    StableDiffusionXLPipeline(**parts, tokenizer=build_tokenizer(),
                              tokenizer_2=build_tokenizer(),
                              scheduler=EulerDiscreteScheduler()).save_pretrained(folder)
    path = save_checkpoint(tmp_path / "xl.safetensors", **parts, family="sdxl",
                           dtype=torch.float32)
    ckpt = load_file(str(path))
    for key in ("model.diffusion_model.label_emb.0.0.weight",
                "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
                "conditioner.embedders.1.model.transformer.resblocks.1.mlp.c_proj.bias"):
        assert key in ckpt, key
    assert ckpt["conditioner.embedders.1.model.text_projection"].shape == (48, 40)
    assert_unet_vae_read_back(ckpt, parts["unet"], parts["vae"])
    assert_same(sfu.convert_ldm_clip_checkpoint(ckpt), te_keys(parts["text_encoder"]))
    te2 = parts["text_encoder_2"]
    state = sfu.convert_open_clip_checkpoint(te2, ckpt, prefix="conditioner.embedders.1.model.")
    assert_same(state, te_keys(te2))
    pipe = StableDiffusionXLPipeline.from_single_file(str(path), config=str(folder),
                                                      local_files_only=True)
    for name, module in parts.items():
        assert_same_module(getattr(pipe, name), module)


def test_sdxl_needs_the_projection_of_its_second_encoder():
    parts = tiny_sdxl()
    parts["text_encoder_2"] = CLIPTextModel(text_config(48, 2))
    with pytest.raises(ValueError, match="text_projection"):
        ldm_state_dict(**parts, family="sdxl")
