"""GLoRA, BOFT and Diag-OFT through lycoris-lora (issue 21): a 2-step run trains them, and the
file, read back by the package's own loader (``create_network_from_weights``) onto a fresh UNet,
changes the UNet's output and reproduces the trained UNet's output; its metadata rebuilds the
same network (algo, constraint, rescaled)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from test_lycoris import unet_output
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink
from trainer.methods.lycoris import LycorisMethod
from trainer.run.loop import run

# a tensor only each algorithm writes (lycoris/modules/*.py weight_list), its rank, and options
ALGO_KEY = {"glora": ("a2.weight", {2, 4}), "boft": ("oft_blocks", {4}),
            "diag-oft": ("oft_blocks", {3})}
OPTIONS = {"glora": {"conv_dim": 2, "conv_alpha": 1.0},
           "boft": {"rescaled": True},
           "diag-oft": {"constraint": 0.5, "rescaled": True, "conv_dim": 2}}
_RUNS: dict[str, tuple] = {}


def oft_config(root: Path, network_type: str, **network):
    data = one_image_dataset(root / "data")
    return small_config(root, data, network={"network_type": network_type, "network_dim": 4,
                                             "network_alpha": 2.0, **network},
                        training={"max_train_steps": 2}, optimizer={"learning_rate": 1e-3})


def trained(tmp_path_factory, network_type: str, **network):
    """(config, result, the UNet's output at the final save) of a 2-step run."""
    key = network_type + json.dumps(network, sort_keys=True)
    if key not in _RUNS:
        cfg = oft_config(tmp_path_factory.mktemp(network_type), network_type, **network)
        outputs, save = [], LycorisMethod.save

        def capture(self, path, model, facts, final=True):
            outputs.append(unet_output(model.unet))
            return save(self, path, model, facts, final)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LycorisMethod, "save", capture)
            result = run(cfg, ListSink())
        assert result.status == "finished", result.error
        _RUNS[key] = (cfg, result, outputs[-1])
    return _RUNS[key]


def fresh_unet(tiny_model_dir: Path):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel.from_pretrained(tiny_model_dir / "unet")


def reloaded(path: str, tiny_model_dir: Path):
    """The package's loader builds the network from the file alone; (network, UNet output)."""
    from lycoris.kohya import create_network_from_weights

    unet = fresh_unet(tiny_model_dir)
    network, _ = create_network_from_weights(1.0, path, None, None, unet)
    network.apply_to(None, unet, apply_text_encoder=False, apply_unet=True)
    return network, unet_output(unet)


@pytest.mark.parametrize("network_type", list(ALGO_KEY))
def test_trained_file_carries_the_effect(tmp_path_factory, tiny_model_dir, network_type):
    cfg, result, at_end = trained(tmp_path_factory, network_type, **OPTIONS[network_type])
    base = unet_output(fresh_unet(tiny_model_dir))
    assert (at_end - base).abs().max() > 1e-5  # the adapters trained
    network, again = reloaded(result.output_path, tiny_model_dir)
    assert (again - base).abs().max() > 1e-5  # the file changes the UNet
    torch.testing.assert_close(again, at_end, rtol=1e-4, atol=1e-5)

    tensors = load_file(result.output_path)
    assert len(network.unet_loras) == len({k.split(".")[0] for k in tensors})
    suffix, ndims = ALGO_KEY[network_type]
    blocks = [t for k, t in tensors.items() if k.endswith("." + suffix)]
    assert blocks and {t.dim() for t in blocks} == ndims
    assert any(t.abs().max() > 0 for t in blocks)  # zero-initialized, moved by training
    if cfg.network.rescaled:
        assert any(k.endswith(".rescale") for k in tensors)
    with safe_open(result.output_path, "pt") as f:
        meta = f.metadata()
    args = json.loads(meta["ss_network_args"])
    assert meta["ss_network_module"] == "lycoris.kohya" and args["algo"] == network_type
    if network_type == "diag-oft":
        assert args["constraint"] == "0.5" and args["rescaled"] == "True"
        assert float(tensors[next(k for k in tensors if k.endswith(".alpha"))]) == 0.5


def test_constraint_bounds_the_rotation(tmp_path):
    """Diag-OFT's constraint (COFT): the generator's norm is cut to constraint * out_dim, so a
    tiny constraint leaves the weight nearly as it was, the unconstrained one does not."""
    from trainer.methods.lycoris import build_network
    from trainer.models.loader import load_base_model

    changes = {}
    for constraint in (None, 1e-6):
        cfg = oft_config(tmp_path / str(constraint), "diag-oft", constraint=constraint)
        unet = load_base_model(cfg.model).unet
        network = build_network(cfg, unet, [])
        lora = next(m for m in network.loras if m.oft_blocks.shape[-1] > 1)
        with torch.no_grad():
            torch.manual_seed(0)
            lora.oft_blocks.normal_()
        weight = lora.org_module[0].weight
        diff = lora.get_diff_weight(1.0, weight.shape, weight.device)[0]
        changes[constraint] = diff.norm() / weight.norm()
    assert changes[None] > 0.1 and changes[1e-6] < 1e-3


@pytest.mark.parametrize("network, message", [
    ({"network_type": "locon", "constraint": 0.1}, "network.constraint is set"),
    ({"network_type": "glora", "rescaled": True}, "network.rescaled is set"),
    ({"network_type": "boft", "use_tucker": True}, "network.use_tucker is set"),
    ({"network_type": "diag-oft", "conv_alpha": 2.0}, "network.conv_alpha is set"),
    ({"network_type": "lora", "bypass_mode": True}, "network.bypass_mode is set"),
    ({"network_type": "dora", "bypass_mode": True}, "network.bypass_mode is set"),
])
def test_options_the_type_does_not_read_are_refused(network, message):
    from trainer.config.files import ConfigError, from_dict

    with pytest.raises(ConfigError, match=message):
        from_dict({"mode": "lora", "network": network})
