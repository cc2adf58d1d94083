"""The embedded default model: built offline, deterministic, and an ordinary diffusers folder."""

import hashlib

import torch

from trainer.families.sd.tiny import build_components, build_tokenizer, learn_bpe, save_tiny_model


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_builds_identically_twice(tmp_path):
    a = save_tiny_model(tmp_path / "a")
    b = save_tiny_model(tmp_path / "b")
    assert _digest(a) == _digest(b)
    size = sum(f.stat().st_size for f in a.rglob("*") if f.is_file())
    assert size < 30 * 2**20


def test_loads_back_with_diffusers_offline(tiny_model_dir):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    ref = build_components()
    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    ids = pipe.tokenizer(["a red circle"], padding="max_length", max_length=77,
                         return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = pipe.text_encoder(ids)[0]
        assert torch.equal(hidden, ref["text_encoder"](ids)[0])
        assert torch.allclose(pipe.unet(x, 10, hidden).sample, ref["unet"](x, 10, hidden).sample,
                              atol=1e-5)
    assert pipe.vae.config.block_out_channels == [32, 32, 64, 64]  # factor-8 VAE
    assert 2 ** (len(pipe.vae.config.block_out_channels) - 1) == 8
    image = pipe("a red circle", num_inference_steps=2, height=64, width=64,
                 output_type="np").images
    assert image.shape == (1, 64, 64, 3)


def test_tokenizer_is_clip_bpe_built_locally():
    tok = build_tokenizer()
    ids = tok("a photo of a red circle").input_ids
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    # learned merges make common words single tokens
    assert len(tok.tokenize("circle")) == 1
    assert tok.decode(ids, skip_special_tokens=True).strip() == "a photo of a red circle"
    assert learn_bpe(["aab", "aab", "ab"], 2) == learn_bpe(["aab", "aab", "ab"], 2)
