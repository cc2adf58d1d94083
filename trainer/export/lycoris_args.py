"""What a LyCORIS file says about its network: ``ss_network_module`` (``lycoris.kohya``) and the
``ss_network_args`` that make lycoris-lora build the same network again.

The LyCORIS method (:mod:`trainer.methods.lycoris`), its writer (:mod:`trainer.export.lycoris`)
and the metadata (:mod:`trainer.export.metadata`) read these; it imports only the config's rules.
"""

from __future__ import annotations

from typing import Any

NETWORK_MODULE = "lycoris.kohya"
# network.network_type -> lycoris' ``algo`` and the extra network_args it implies
ALGOS: dict[str, tuple[str, dict[str, str]]] = {
    "locon": ("locon", {}), "loha": ("loha", {}), "lokr": ("lokr", {}),
    "ia3": ("ia3", {"preset": "ia3"}), "dora": ("lora", {"dora_wd": "True"}),
    "glora": ("glora", {}), "boft": ("boft", {}), "diag-oft": ("diag-oft", {}),
}
# schema name -> the network_args name that lycoris.kohya's create_network reads
ARG_NAMES = {"network_dropout": "dropout", "lycoris_preset": "preset"}


def file_network_module(meta: dict[str, Any], own: str) -> str:
    """``ss_network_module`` of a family's file: a LyCORIS file's metadata (``meta``, the run's)
    keeps ``lycoris.kohya``, which tells readers its tensors are lycoris modules'; a LoRA
    file names the family's own trainer module (``own``)."""
    return NETWORK_MODULE if meta.get("ss_network_module") == NETWORK_MODULE else own


def _arg(value: Any) -> str:
    """A value as a user types it in sd-scripts' ``network_args`` (``4``, ``0.5``, ``True``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(int(value)) if float(value).is_integer() else str(value)


def conv_rank(net: Any) -> tuple[int, float]:
    """(conv_dim, conv_alpha) as lycoris.kohya resolves them: unset, network_dim and
    network_alpha (peft LoRA instead trains no convolution without conv_dim)."""
    dim = net.conv_dim if net.conv_dim is not None else net.network_dim
    return dim, net.conv_alpha if net.conv_alpha is not None else net.network_alpha


def lycoris_network_args(cfg: Any) -> dict[str, str]:
    """``ss_network_args``: the ``network_args`` that make ``lycoris.kohya`` build this network
    (algo, conv_dim/conv_alpha as resolved, and the options the algorithm reads)."""
    from trainer.config.rules.network import NETWORK_OPTIONS

    net = cfg.network
    algo, extra = ALGOS[net.network_type]
    args = {"algo": algo, **extra}
    conv_dim, conv_alpha = conv_rank(net)
    values = {
        "conv_dim": conv_dim, "conv_alpha": conv_alpha, "dropout": net.network_dropout,
        "factor": -1 if net.factor is None else net.factor,  # lycoris' "pick it"
        "bypass_mode": net.bypass_mode or None,  # off: lycoris' own choice, as when unset
    }
    for name, types in NETWORK_OPTIONS.items():
        key = ARG_NAMES.get(name, name)
        value = values.get(key, getattr(net, name, None))
        if net.network_type in types and value is not None:
            args[key] = _arg(value)
    return args
