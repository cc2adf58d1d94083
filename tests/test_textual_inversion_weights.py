"""network.embedding_weights (sd-scripts' --weights, kohya_ss's "Resume TI training" file): the
token's vectors start from an embedding file, read as sd-scripts' load_weights reads it (our
``emb_params``, AUTOMATIC1111's ``string_to_param``, diffusers' ``{token: vector}``, SDXL's
``clip_l`` / ``clip_g``); a file of another width, family or vector count is refused naming
both; a 2-step run continues from the file of an earlier run."""

from __future__ import annotations

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from safetensors.torch import load_file, save_file
from train_helpers import one_image_dataset, small_config

from trainer.config import EMBEDDED_SDXL
from trainer.export.embedding import save_embedding
from trainer.methods.textual_inversion import TextualInversionMethod, TokenError
from trainer.models.loader import load_base_model
from trainer.run.loop import run

TOKEN, WIDTH, WIDTH_G = "<tok>", 32, 48  # the tiny text encoders' widths (SDXL: 32 and 48)


def ti_config(tmp_path, network=None, **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data, caption=f"a photo of {TOKEN}")
    net = {"token_string": TOKEN, "init_word": "circle", **(network or {})}
    sections.setdefault("optimizer", {}).update(learning_rate=5e-3)
    return small_config(tmp_path, data, mode="textual_inversion", network=net, **sections)


def start_rows(cfg) -> list[torch.Tensor]:
    """The new tokens' rows of each text encoder right after the method prepared the model."""
    model = load_base_model(cfg.model)
    method = TextualInversionMethod(cfg)
    method.prepare(model)
    return [t.detach().clone() for t in method.embeddings(model)]


def vectors(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("form", ["ours", "a1111", "diffusers"])
def test_the_vectors_start_from_the_file(tmp_path, form):
    want = vectors(2 if form != "diffusers" else 1, WIDTH, 1)
    path = tmp_path / ("e.safetensors" if form == "ours" else "e.pt")
    if form == "ours":
        save_embedding(path, want)
    elif form == "a1111":  # AUTOMATIC1111's .pt: the vectors under string_to_param["*"]
        torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": want},
                    "name": "e", "step": 100}, path)
    else:  # diffusers' learned_embeds: {token: vector}, one 1-D vector
        torch.save({"<cat>": want[0]}, path)
    cfg = ti_config(tmp_path, {"embedding_weights": str(path),
                               "num_vectors_per_token": want.shape[0]})
    (rows,) = start_rows(cfg)
    assert torch.equal(rows, want)  # the file's vectors, not init_word's
    (from_word,) = start_rows(ti_config(tmp_path, {"num_vectors_per_token": want.shape[0]}))
    assert not torch.equal(from_word, want)


def test_sdxl_reads_clip_l_and_clip_g(tmp_path):
    want_l, want_g = vectors(2, WIDTH, 2), vectors(2, WIDTH_G, 3)
    path = tmp_path / "xl.safetensors"
    save_embedding(path, want_l, vectors_g=want_g)
    cfg = ti_config(tmp_path, {"embedding_weights": str(path), "num_vectors_per_token": 2},
                    model={"pretrained_model_name_or_path": EMBEDDED_SDXL})
    rows_l, rows_g = start_rows(cfg)
    assert torch.equal(rows_l, want_l) and torch.equal(rows_g, want_g)
    save_file({"clip_l": want_l}, str(tmp_path / "half.safetensors"))
    half = ti_config(tmp_path, {"embedding_weights": str(tmp_path / "half.safetensors"),
                                "num_vectors_per_token": 2},
                     model={"pretrained_model_name_or_path": EMBEDDED_SDXL})
    with pytest.raises(TokenError, match="no clip_g vectors"):
        start_rows(half)


@pytest.mark.parametrize("tensors, count, named", [
    ({"emb_params": vectors(3, WIDTH, 4)}, 2, "has 3 vectors, network.num_vectors_per_token = 2"),
    ({"emb_params": vectors(1, 768, 4)}, 1, "shape (1, 768); this model's text encoder is 32"),
    ({"clip_l": vectors(1, WIDTH, 4), "clip_g": vectors(1, WIDTH_G, 4)}, 1,
     "is an SDXL embedding"),
])
def test_a_file_that_does_not_fit_is_refused_naming_both(tmp_path, tensors, count, named):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    cfg = ti_config(tmp_path, {"embedding_weights": str(path), "num_vectors_per_token": count})
    with pytest.raises(TokenError) as err:
        start_rows(cfg)
    assert named in str(err.value) and "network.embedding_weights" in str(err.value)
    missing = ti_config(tmp_path, {"embedding_weights": str(tmp_path / "none.safetensors")})
    with pytest.raises(TokenError, match="no such file"):
        start_rows(missing)


def test_two_steps_continue_from_the_file_of_an_earlier_run(tmp_path,
                                                            one_torch_thread):  # noqa: F811
    first = run(ti_config(tmp_path, {"num_vectors_per_token": 2},
                          training={"max_train_steps": 2}))
    assert first.status == "finished", first.error
    earlier = load_file(first.output_path)["emb_params"]
    cfg = ti_config(tmp_path, {"num_vectors_per_token": 2,
                               "embedding_weights": first.output_path},
                    training={"max_train_steps": 2}, saving={"output_name": "again"})
    assert torch.equal(start_rows(cfg)[0], earlier)
    second = run(cfg)
    assert second.status == "finished", second.error
    later = load_file(second.output_path)["emb_params"]
    assert later.shape == earlier.shape and not torch.equal(later, earlier)
    # 2 steps at 5e-3 move the vectors a little from where the file left them
    assert (later - earlier).abs().max() < 0.1


def test_import_kohya_reads_the_ti_tabs_weights():
    from trainer.importers.kohya import import_kohya

    cfg, report = import_kohya({"token_string": "<cat>", "init_word": "cat",
                                "num_vectors_per_token": 2, "weights": "/emb/cat.pt"})
    assert cfg.network.embedding_weights == "/emb/cat.pt" and not report.unsupported
    cfg, report = import_kohya({"token_string": "<cat>", "weights": ""})
    assert cfg.network.embedding_weights is None and "weights" in report.unset
    _, report = import_kohya({"LoRA_type": "Standard", "weights": "/emb/cat.pt"})
    assert ("weights", "not used in lora mode") in report.not_needed
