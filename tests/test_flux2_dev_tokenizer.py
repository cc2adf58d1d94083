"""FLUX.2 [dev]'s Mistral-Small-3 tokenizer found as the Qwen ones are (the "mistral3" kind of
:mod:`trainer.families.common.qwen_tokenizers`): ``model.tokenizer``, beside the file, the
Hugging Face cache, never the network here; none found is one error with the ``hf download``
command; the doctor lists it. A published dev folder names a ``PixtralProcessor`` (torchvision)
as its tokenizer: the folder loads with the tokenizer alone. The tiny Mistral tokenizer stands in
for the real files."""

from __future__ import annotations

import json
import shutil

import pytest
from test_qwen_tokenizers import save_qwen

from trainer.config import ModelSection
from trainer.families.common import qwen_tokenizers as qt
from trainer.families.common.tiny_mistral import CHAT_TEMPLATE, build_mistral_tokenizer
from trainer.families.spec import ModelLoadError
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.models.tokenizers import TokenizerNotFound

pytestmark = pytest.mark.usefixtures("no_network")
MESSAGES = [[{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
             {"role": "user", "content": [{"type": "text", "text": "a red circle"}]}]]


def save_mistral(folder):
    build_mistral_tokenizer().save_pretrained(str(folder))
    return folder


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))

    def add(repo: str, sub: str = ""):
        repo_dir = root / ("models--" + repo.replace("/", "--"))
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text("0" * 40)
        return save_mistral(repo_dir / "snapshots" / ("0" * 40) / sub)

    return add


def ids(tokenizer):
    return tokenizer.apply_chat_template(MESSAGES, tokenize=True, return_dict=True,
                                         padding="max_length", max_length=64)["input_ids"]


def test_the_setting_beside_the_file_and_the_cache(tmp_path, hf_cache):
    folder = resolve_model_path("embedded:tiny-flux2-dev")  # a diffusers dev folder
    assert qt.locate("mistral3", str(folder), None) == qt.Found(folder / "tokenizer",
                                                                "model.tokenizer")
    beside = save_mistral(tmp_path / "models" / "tokenizer")
    found = qt.locate("mistral3", None, tmp_path / "models" / "mistral_3_small_flux2.safetensors")
    assert found.folder == beside and found.where.startswith("beside the file")
    cached = hf_cache("black-forest-labs/FLUX.2-dev", "tokenizer")
    found = qt.locate("mistral3", None, tmp_path / "elsewhere" / "te.safetensors")
    assert found == qt.Found(cached, "Hugging Face cache (black-forest-labs/FLUX.2-dev/tokenizer)")
    assert ids(qt.load(found, "mistral3")) == ids(build_mistral_tokenizer())


def test_a_qwen_tokenizer_is_not_mistrals_and_none_found_names_the_command(tmp_path, hf_cache):
    qwen = save_qwen(tmp_path / "qwen")
    with pytest.raises(TokenizerNotFound, match=r"model.tokenizer = .*\[SYSTEM_PROMPT\]"):
        qt.locate("mistral3", str(qwen), None)
    with pytest.raises(ModelLoadError) as caught:
        qt.load_qwen_tokenizer("mistral3", None, tmp_path / "models" / "te.safetensors")
    message = str(caught.value)
    assert 'hf download black-forest-labs/FLUX.2-dev --include "tokenizer/*"' in message
    assert "Mistral-Small-3 (FLUX.2 [dev])" in message and "model.tokenizer" in message
    assert "gated repository" in message


def test_a_processors_template_in_chat_template_json_is_read(tmp_path):
    """A processor's save: the template in ``chat_template.json``, not the tokenizer's."""
    folder = save_mistral(tmp_path / "processor")
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    tokenizer = qt.load_qwen_tokenizer("mistral3", str(folder), None)
    assert ids(tokenizer) == ids(build_mistral_tokenizer())


def test_doctor_lists_it(hf_cache):
    label = "Mistral-Small-3 (FLUX.2 [dev])"
    assert dict(qt.cache_report())[label] == f"tokenizer not found: {qt.FETCH['mistral3']}"
    hf_cache("black-forest-labs/FLUX.2-dev", "tokenizer")
    assert dict(qt.cache_report())[label].startswith("ready, tokenizer from the Hugging Face")


def test_a_published_dev_folder_loads_with_its_tokenizer_alone(tmp_path):
    """FLUX.2-dev's model_index names PixtralProcessor (which needs torchvision)."""
    folder = tmp_path / "FLUX.2-dev"
    shutil.copytree(resolve_model_path("embedded:tiny-flux2-dev"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["tokenizer"] = ["transformers", "PixtralProcessor"]
    (folder / "model_index.json").write_text(json.dumps(index))
    model = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
    assert model.variant == "dev" and ids(model.tokenizer) == ids(build_mistral_tokenizer())
