"""Continue from a LoRA file (sd-scripts' ``network_weights`` and ``dim_from_weights``).

The file is a kohya LoRA (``lora_down`` / ``lora_up`` / ``alpha``) or a LyCORIS file
(``hada_*``, ``lokr_*``, ...), ours or anyone's, on kohya's module names. Each module of the
network finds its tensors under the name the studio would write it with
(:mod:`trainer.export.lora`, :mod:`trainer.export.lycoris`), so a file we wrote loads back
exactly. sd-scripts loads with ``load_state_dict(strict=False)``: a module the file lacks keeps
its fresh initialisation, a tensor of another shape is an error; here that error names the
module, the file's rank and the config's. ``dim_from_weights`` builds the LoRA from the file
instead: its modules, each with its rank and alpha (sd-scripts' ``create_network_from_weights``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import kohya_module_name, text_encoder_module_path, unwrap


class WeightsFileError(ValueError):
    """network.network_weights cannot be used with this network (the message says why)."""


SD_1_OR_2 = "sd"  # file_family's answer for SD 1.x or 2.x module names (their folder's name)


def _family_of_version(version: str) -> Optional[str]:
    """The family whose ``ss_base_model_version`` (its spec's ``kohya_version``) begins
    ``version`` (``sd_v2_v`` -> sd2)."""
    from trainer.families import FAMILIES

    return next((s.name for s in FAMILIES.values()
                 if s.kohya_version and version.startswith(s.kohya_version)), None)


def family_label(family: str) -> str:
    from trainer.families import FAMILIES

    return FAMILIES[family].label if family in FAMILIES else "SD 1.x/2.x"


def read_weights(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise WeightsFileError(f"network.network_weights = {path!r}: no such file")
    with safe_open(path, "pt") as f:
        metadata = f.metadata() or {}
    return load_file(path), metadata


def file_family(keys: list[str], metadata: dict[str, str]) -> Optional[str]:
    """sd1 / sd2 / sdxl from ``ss_base_model_version``, else sd (1.x or 2.x), sdxl, flux1 or
    sd3 from the module names."""
    version = metadata.get("ss_base_model_version", "")
    named = _family_of_version(version)
    if named is not None:
        return named
    text = " ".join(keys[:2000])
    if "double_blocks" in text or "single_blocks" in text:
        return "flux1"
    if any(k.startswith("transformer.") for k in keys) or "joint_blocks" in text:
        return "sd3"
    if re.search(r"lora_te[12]_|lora_unet_(input|output)_blocks|lora_unet_middle_block", text):
        return "sdxl"
    if re.search(r"lora_te_|lora_unet_(down|up)_blocks|lora_unet_mid_block", text):
        return SD_1_OR_2
    return None


def own_forms(version: str, tensors: dict) -> dict:
    """The file's tensors as the family's lora role reads its peers' forms (fused layers,
    peft keys) into per-layer kohya names, where it does (``network_weights_tensors``)."""
    from trainer.families import FAMILIES, role

    lora = role(version, "lora") if version in FAMILIES else None
    convert = getattr(lora, "network_weights_tensors", None)
    return convert(tensors) if convert is not None else tensors


def file_kind(keys: list[str]) -> str:
    """lora (lora_down/up), loha, lokr, ia3, or the LyCORIS tensor names it has."""
    text = " ".join(keys)
    for marker, kind in ((".hada_w1", "loha"), (".lokr_w", "lokr"), (".on_input", "ia3"),
                         (".lora_down.", "lora")):
        if marker in text:
            return kind
    return "unknown"


def check_file(path: str, tensors: dict, metadata: dict, version: str, network_type: str) -> None:
    """Refuse a file of another family or network kind, naming both."""
    keys = list(tensors)
    family = file_family(keys, metadata)
    same = family == version or family == _folder(version)  # "sd": SD 1.x or 2.x
    if family is not None and not same:
        raise WeightsFileError(f"network.network_weights = {path!r} is a "
                               f"{family_label(family)} file; the model is "
                               f"{family_label(version) if _folder(version) else version}")
    kind = file_kind(keys)
    want = {"lora": "lora", "locon": "lora", "dora": "lora", "loha": "loha", "lokr": "lokr",
            "ia3": "ia3"}[network_type]
    if kind != want:
        raise WeightsFileError(f"network.network_weights = {path!r} holds a {kind} network; "
                               f"network.network_type = {network_type!r} trains {want}: set "
                               f"the file's type")


def _folder(version: str) -> Optional[str]:
    from trainer.families import FAMILIES

    return FAMILIES[version].folder if version in FAMILIES else None


def namers(model: Any, version: str, names: list[str]) -> dict[str, Callable[[str], str]]:
    """component -> (module path -> kohya module name), as trainer/export writes them; a family
    whose lora role names its modules itself (``network_module_name(component, path)``, the
    names its ``network_weights_tensors`` gives the file's tensors) by that."""
    from trainer.export.metadata import lora_naming
    from trainer.families import FAMILIES, role

    own = getattr(role(version, "lora"), "network_module_name", None) \
        if version in FAMILIES else None
    if own is not None:
        return {name: (lambda c: lambda p: own(c, p))(name) for name in names}
    naming = lora_naming(version)
    out = {}
    for name in names:
        if name == "unet":
            rename = naming.unet_rename(model.denoiser) or (lambda p: p)
            out[name] = (lambda r: lambda p: kohya_module_name("lora_unet", r(p)))(rename)
        else:
            prefix = {"text_encoder_2": "lora_te2", **naming.TE_PREFIXES}[name]
            out[name] = (lambda pre: lambda p: kohya_module_name(
                pre, text_encoder_module_path(p)))(prefix)
    return out


def file_ranks(tensors: dict) -> dict[str, tuple[int, float]]:
    """kohya module name -> (rank, alpha) of a LoRA file (no alpha: alpha = rank)."""
    out = {}
    for key, value in tensors.items():
        if key.endswith(".lora_down.weight"):
            name = key[: -len(".lora_down.weight")]
            alpha = tensors.get(name + ".alpha")
            out[name] = (value.shape[0], float(alpha) if alpha is not None else value.shape[0])
    return out


def config_from_weights(cfg: Any, root: torch.nn.Module, namer: Callable[[str], str],
                        ranks: dict[str, tuple[int, float]]) -> Optional[Any]:
    """dim_from_weights: a LoraConfig over exactly the file's modules of ``root``, each with
    the file's rank and alpha; None when the file has none there."""
    from peft import LoraConfig

    rank_pattern, alpha_pattern, paths = {}, {}, []
    for path, module in unwrap(root).named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and namer(path) in ranks:
            rank, alpha = ranks[namer(path)]
            key = re.escape(path)
            rank_pattern[key], alpha_pattern[key] = rank, alpha
            paths.append(path)
    if not paths:
        return None
    return LoraConfig(r=cfg.network.network_dim, lora_alpha=cfg.network.network_alpha,
                      lora_dropout=cfg.network.network_dropout or 0.0,
                      init_lora_weights="gaussian", target_modules=paths,
                      rank_pattern=rank_pattern, alpha_pattern=alpha_pattern)


def load_into_lora(path: str, tensors: dict, root: torch.nn.Module,
                   namer: Callable[[str], str]) -> int:
    """Copy the file's down/up weights into ``root``'s peft layers, and its alpha into their
    scaling; returns how many modules were loaded."""
    from trainer.export.lora import iter_lora_layers

    loaded = 0
    for module_path, layer in iter_lora_layers(root):
        name = namer(module_path)
        down, up = tensors.get(name + ".lora_down.weight"), tensors.get(name + ".lora_up.weight")
        if down is None or up is None:
            continue
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        if down.shape != a.shape or up.shape != b.shape:
            raise WeightsFileError(
                f"network.network_weights = {path!r}: module {name} has rank {down.shape[0]} "
                f"(shape {tuple(down.shape)}), the network's has rank {a.shape[0]} (shape "
                f"{tuple(a.shape)}): set network.network_dim / conv_dim to the file's, or "
                f"network.dim_from_weights = true")
        with torch.no_grad():
            a.copy_(down.to(a.dtype))
            b.copy_(up.to(b.dtype))
        alpha = tensors.get(name + ".alpha")
        if alpha is not None:
            layer.lora_alpha["default"] = float(alpha)
            layer.scaling["default"] = float(alpha) / a.shape[0]
        loaded += 1
    return loaded


def load_into_lycoris(path: str, tensors: dict, loras: list[Any],
                      names: dict[int, str]) -> int:
    """Load each lycoris module's own tensors (``<name>.<its state_dict key>``)."""
    loaded = 0
    for lora in loras:
        name = names.get(id(lora))
        own = {k[len(name) + 1:]: v for k, v in tensors.items() if name and
               k.startswith(name + ".")}
        if not own:
            continue
        state = lora.state_dict()
        for key, value in own.items():
            if key in state and state[key].shape != value.shape:
                raise WeightsFileError(
                    f"network.network_weights = {path!r}: {name}.{key} has shape "
                    f"{tuple(value.shape)}, the network's {tuple(state[key].shape)}: set "
                    f"network.network_dim / conv_dim / factor to the file's")
        lora.load_state_dict({k: v.to(state[k].dtype) for k, v in own.items() if k in state},
                             strict=False)
        loaded += 1
    return loaded


class NetworkWeights:
    """``network.network_weights`` of a run, read and checked once, for the LoRA method."""

    def __init__(self, cfg: Any, model: Any, components: list[str]):
        self.cfg, self.path = cfg, cfg.network.network_weights
        self.tensors, metadata = read_weights(self.path)
        self.tensors = own_forms(model.version, self.tensors)
        check_file(self.path, self.tensors, metadata, model.version, cfg.network.network_type)
        self.namers = namers(model, model.version, components)
        self.ranks = file_ranks(self.tensors)

    @classmethod
    def open(cls, cfg: Any, model: Any, components: list[str]) -> Optional[NetworkWeights]:
        return cls(cfg, model, components) if cfg.network.network_weights else None

    def config(self, component: str, root: torch.nn.Module) -> Optional[Any]:
        """dim_from_weights: the component's LoraConfig from the file (None: not asked, or the
        file has no module there)."""
        if not self.cfg.network.dim_from_weights:
            return None
        return config_from_weights(self.cfg, root, self.namers[component], self.ranks)

    def load(self, roots: list[tuple[str, torch.nn.Module]]) -> int:
        loaded = sum(load_into_lora(self.path, self.tensors, root, self.namers[name])
                     for name, root in roots)
        if not loaded:
            raise WeightsFileError(f"network.network_weights = {self.path!r}: none of its "
                                   f"modules is a module of this network (another model's "
                                   f"file, or only text-encoder modules with "
                                   f"train_text_encoder off?)")
        return loaded


def load_lycoris_weights(cfg: Any, model: Any, loras: list[Any], encoders: list[str]) -> int:
    """network_weights for the LyCORIS types: each module's tensors under the name
    :mod:`trainer.export.lycoris` (a transformer family's: trainer/export/flow_lycoris.py)
    writes it with."""
    path = cfg.network.network_weights
    tensors, metadata = read_weights(path)
    check_file(path, tensors, metadata, model.version, cfg.network.network_type)
    names = _flow_lycoris_names(model, loras, encoders)
    if names is None:
        names = _unet_lycoris_names(model, loras, encoders)
    loaded = load_into_lycoris(path, tensors, loras, names)
    if not loaded:
        raise WeightsFileError(f"network.network_weights = {path!r}: none of its modules is a "
                               f"module of this network")
    return loaded


def _flow_lycoris_names(model: Any, loras: list[Any], encoders: list[str]
                        ) -> Optional[dict[int, str]]:
    """A transformer family's names of the modules (its lora role's, as
    trainer/export/flow_lycoris.py writes them); None for a UNet family."""
    from trainer.families import spec

    if spec(model.version).denoiser != "transformer":
        return None
    from trainer.export.flow_lycoris import TRANSFORMER, lycoris_names

    roots = [(TRANSFORMER, model.denoiser)] + [(n, getattr(model, n)) for n in encoders]
    return lycoris_names(model.version, loras, roots)


def _unet_lycoris_names(model: Any, loras: list[Any], encoders: list[str]) -> dict[int, str]:
    from trainer.export.lycoris import _module_places
    from trainer.export.metadata import lora_naming

    naming = lora_naming(model.version)
    prefixes = {"text_encoder_2": "lora_te2", **naming.TE_PREFIXES}
    roots = [("lora_unet", model.denoiser, naming.unet_rename(model.denoiser))]
    roots += [(prefixes[n], getattr(model, n), text_encoder_module_path) for n in encoders]
    places = _module_places(roots)
    names = {}
    for lora in loras:
        place = places.get(id(lora.org_module[0]))
        if place is not None:
            prefix, module_path, rename = place
            names[id(lora)] = kohya_module_name(prefix, rename(module_path) if rename
                                                else module_path)
    return names
