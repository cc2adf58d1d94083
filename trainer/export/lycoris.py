"""A LyCORIS file (LoCon, LoHa, LoKr, IA3, DoRA) as sd-scripts with lycoris-lora writes it.

sd-scripts trains LyCORIS with ``--network_module=lycoris.kohya``; the file holds every module's
own tensors (what ``LycorisNetworkKohya.save_weights`` writes: its ``state_dict`` cast to the save
precision) under kohya's module names::

    lora_unet_<module path, '.' -> '_'>.lora_down.weight / .lora_up.weight / .alpha   LoCon
    ... .hada_w1_a / .hada_w1_b / .hada_w2_a / .hada_w2_b / .alpha                      LoHa
    ... .lokr_w1 (or _a/_b) / .lokr_w2 (or _a/_b) / .alpha                            LoKr
    ... .weight / .on_input                                                           IA3
    ... .dora_scale                                                  DoRA (+ the LoCon keys)

The module names are the ones :mod:`trainer.export.lora` gives plain LoRA: diffusers' paths for
an SD 1.x/2.x UNet, the original SGM layout for SDXL (:func:`~trainer.export.lora.sgm_unet_names`,
``lora_unet_input_blocks_4_1_...``), ``lora_te_text_model_...`` for the text encoder
(``lora_te1_`` / ``lora_te2_`` for SDXL's two). The package names the modules by the paths of
the model it was given, so each module is renamed here by the module it adapts, never by
string surgery on the package's name. AUTOMATIC1111 and ComfyUI find the algorithm from the
tensor names (``hada_w1_a``, ``lokr_w1``, ``on_input``, ...) and the module from the name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.lora import (
    SAVE_DTYPES,
    kohya_module_name,
    sgm_unet_names,
    text_encoder_module_path,
    unwrap,
)
from trainer.export.lycoris_args import (  # noqa: F401 - re-exported for readers
    ALGOS,
    NETWORK_MODULE,
    conv_rank,
    lycoris_network_args,
)

Rename = Optional[Callable[[str], str]]


def _module_places(roots: Iterable[tuple[str, Any, Rename]]) -> dict[int, tuple[str, str, Rename]]:
    """id(module) -> (kohya prefix, module path, rename) for every module under the roots."""
    places = {}
    for prefix, root, rename in roots:
        if root is not None:
            for path, module in unwrap(root).named_modules():
                places.setdefault(id(module), (prefix, path, rename))
    return places


def lycoris_tensors(
    loras: Iterable[Any],
    unet: Optional[torch.nn.Module],
    text_encoders: Iterable[tuple[str, Optional[torch.nn.Module]]] = (),
    *,
    dtype: torch.dtype = torch.float16,
    sdxl: bool = False,
) -> dict[str, torch.Tensor]:
    """The tensors of lycoris modules under kohya's names. ``text_encoders`` are (component
    name, module): ``text_encoder`` is ``lora_te`` (SDXL: ``lora_te1``), ``text_encoder_2``
    ``lora_te2``."""
    prefixes = {"text_encoder": "lora_te1" if sdxl else "lora_te", "text_encoder_2": "lora_te2"}
    roots = [("lora_unet", unet, sgm_unet_names(unet) if sdxl and unet is not None else None)]
    roots += [(prefixes[name], module, text_encoder_module_path)
              for name, module in text_encoders]
    places = _module_places(roots)
    out: dict[str, torch.Tensor] = {}
    for lora in loras:
        place = places.get(id(lora.org_module[0]))
        if place is None:
            raise ValueError(f"{lora.lora_name}: its module is in none of the saved models")
        prefix, path, rename = place
        name = kohya_module_name(prefix, rename(path) if rename else path)
        for key, tensor in lora.state_dict().items():
            if f"{name}.{key}" in out:
                raise ValueError(f"two modules map to the same kohya name {name!r}")
            out[f"{name}.{key}"] = tensor.detach().to("cpu", dtype).clone().contiguous()
    if not out:
        raise ValueError("no LyCORIS modules to save")
    return out


def save_lycoris(
    path: str | Path,
    loras: Iterable[Any],
    unet: Optional[torch.nn.Module],
    text_encoders: Iterable[tuple[str, Optional[torch.nn.Module]]],
    cfg: Any,
    facts: Any,
    dtype: Optional[torch.dtype] = None,
) -> Path:
    """Write the LyCORIS file with ``ss_*`` (``ss_network_module = lycoris.kohya``),
    ``modelspec.*`` and ``sshs_*`` metadata, atomically, in ``saving.save_precision``."""
    from trainer.export.hashes import add_hashes
    from trainer.export.metadata import RunFacts, build_lora_metadata, lora_naming, resolved_version
    from trainer.system.safe_write import save_safetensors_atomic

    facts = facts if facts is not None else RunFacts()
    dtype = dtype or SAVE_DTYPES[cfg.saving.save_precision]
    tensors = lycoris_tensors(loras, unet, text_encoders, dtype=dtype,
                              sdxl=lora_naming(resolved_version(cfg, facts)).SGM_LAYOUT)
    metadata = add_hashes(build_lora_metadata(cfg, facts), tensors)
    return save_safetensors_atomic(path, tensors, metadata)
