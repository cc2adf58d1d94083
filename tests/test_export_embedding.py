"""Textual-inversion embeddings: the {"emb_params": [n, dim]} file diffusers loads."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.config import TrainConfig
from trainer.export.embedding import embedding_tensors, save_embedding


def test_diffusers_loads_the_embedding(tiny_model_dir, tmp_path):
    from diffusers import StableDiffusionPipeline

    vectors = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(mode="textual_inversion", network={"token_string": "<my-cat>"})
    path = save_embedding(tmp_path / "my-cat.safetensors", vectors, cfg=cfg)
    assert list(load_file(str(path))) == ["emb_params"]
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["modelspec.architecture"] == "stable-diffusion-v1/textual-inversion"
    assert meta["modelspec.trigger_phrase"] == "<my-cat>"

    pipe = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    pipe.load_textual_inversion(str(path), token="<my-cat>")
    ids = pipe.tokenizer.convert_tokens_to_ids(["<my-cat>", "<my-cat>_1"])
    table = pipe.text_encoder.get_input_embeddings().weight
    torch.testing.assert_close(table[ids], vectors)


def test_sdxl_layout_and_shape_checks():
    tensors = embedding_tensors(torch.zeros(3, 768), torch.zeros(3, 1280))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        "clip_l": (3, 768), "clip_g": (3, 1280)}
    with pytest.raises(ValueError, match="same number"):
        embedding_tensors(torch.zeros(3, 768), torch.zeros(2, 1280))
    with pytest.raises(ValueError, match=r"\[n_vectors, dim\]"):
        embedding_tensors(torch.zeros(768))
