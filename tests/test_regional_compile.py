"""training.compile_scope = "regional": the denoiser's repeated blocks compiled in place, the
run the same as eager, the saved file's names unchanged (issue 20)."""

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import Log, Step
from trainer.run.loop import run
from trainer.run.regional_compile import compile_regional, repeated_block_names
from trainer.system import speed


class Sink:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)

    def losses(self):
        return [e.loss for e in self.events if isinstance(e, Step)]


def test_regional_compile_trains_like_eager_and_saves_the_same_names(tmp_path, monkeypatch):
    data = one_image_dataset(tmp_path / "data")
    eager = Sink()
    plain = run(small_config(tmp_path / "e", data), eager)
    assert plain.status == "finished", plain.error
    monkeypatch.setenv(speed.ENV_BACKEND, "eager")  # dynamo's capture, no C++ generated
    torch._dynamo.reset()
    regional = Sink()
    cfg = small_config(tmp_path / "r", data,
                       training={"compile": True, "compile_scope": "regional"})
    result = run(cfg, regional)
    assert result.status == "finished", result.error
    assert any(isinstance(e, Log) and "repeated blocks compiled" in e.message
               for e in regional.events)
    assert regional.losses() == pytest.approx(eager.losses(), rel=1e-4)
    assert sorted(load_file(result.output_path)) == sorted(load_file(plain.output_path))


def test_only_the_repeated_blocks_are_compiled(tiny_model_dir):
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(tiny_model_dir, subfolder="unet")
    names = list(unet.state_dict())
    assert repeated_block_names(unet) == ("BasicTransformerBlock",)
    count = compile_regional(unet, {"backend": "eager"})
    blocks = [m for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    assert count == len(blocks) > 0
    assert all(b._compiled_call_impl is not None for b in blocks)
    assert unet._compiled_call_impl is None  # the UNet itself runs eager
    assert list(unet.state_dict()) == names


def test_a_model_without_repeated_blocks_is_refused_by_name():
    with pytest.raises(ValueError, match="compile_scope = 'regional'.*set it to 'model'"):
        compile_regional(torch.nn.Linear(2, 2), {})
