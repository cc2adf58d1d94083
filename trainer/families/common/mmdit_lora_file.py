"""The metadata and the file of a FLUX.1 or SD 3.5 LoRA, as sd-scripts writes them.

The tensors come from :func:`trainer.families.flux.lora.flux_kohya_state_dict` (FLUX.1, kohya
keys on the BFL layout) or :func:`trainer.families.sd3.lora.sd3_state_dict` (SD 3.5,
``transformer.*``). The metadata is the run's ``ss_*`` / ``modelspec.*`` (from
:func:`trainer.export.metadata.build_lora_metadata`, written for the UNet families) with what
differs for the flow families set here, checked in kohya-ss/sd-scripts at 48d368fa:

- ``ss_base_model_version``: ``flux1`` (``flux_utils.MODEL_VERSION_FLUX_V1``); for SD3 the model
  type ``medium``, ``5-medium`` or ``5-large`` (``sd3_utils``: qk-norm and dual attention tell
  them apart), which ``sd3_train_network.py`` returns as the model version.
- ``modelspec.architecture`` (``sai_model_spec.determine_architecture``): ``flux-1-dev/lora``,
  ``flux-1-schnell/lora``; ``stable-diffusion-3-`` + the SD3 model type + ``/lora``
  (``stable-diffusion-3-5-large/lora``). ``modelspec.implementation``: BFL's repository for
  FLUX.1, ``diffusers`` for an SD3 LoRA. FLUX.1 files have no ``modelspec.prediction_type``;
  SD3's is ``epsilon`` (sd-scripts passes no v-parameterization).
- The objective's settings, under the names of ``update_metadata`` in ``flux_train_network.py``
  (``ss_model_type``, ``ss_guidance_scale``, ``ss_timestep_sampling``, ``ss_sigmoid_scale``,
  ``ss_model_prediction_type``, ``ss_discrete_flow_shift``, the weighting scheme's, the T5 mask)
  and ``sd3_train_network.py`` (the weighting scheme's, ``ss_apply_lg_attn_mask``,
  ``ss_apply_t5_attn_mask``), each value as ``str()`` of sd-scripts' argparse value: floats as
  floats (``"1.0"``, not ``"1"``), booleans ``"True"`` / ``"False"``, unset ``"None"``.
- ``ss_network_module``: ``networks.lora_flux`` for a FLUX.1 LoRA (the file is that module's
  format); a LyCORIS file keeps ``lycoris.kohya`` (trainer/export/flow_lycoris.py).
  An SD 3.5 file keeps the base value: its ``transformer.*`` form is not ``networks.lora_sd3``'s.

``sshs_model_hash`` and ``modelspec.hash_sha256`` are computed over the final tensors
(:mod:`trainer.export.hashes`), and the file is written atomically.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import torch

FLUX_VERSION = "flux1"
FLUX_VARIANTS = ("dev", "schnell")
SD3_VARIANTS = ("medium", "5-medium", "5-large")
IMPL_FLUX = "https://github.com/black-forest-labs/flux"
IMPL_DIFFUSERS = "diffusers"
FLUX_NETWORK_MODULE = "networks.lora_flux"
HASH_KEYS = ("sshs_model_hash", "sshs_legacy_hash", "modelspec.hash_sha256")


@dataclasses.dataclass(frozen=True)
class FlowLoraInfo:
    """What a flow-family LoRA file records about its model and objective.

    ``variant``: ``dev`` / ``schnell`` for FLUX.1; ``medium`` (SD 3), ``5-medium``, ``5-large``
    for SD 3 / 3.5. The objective's fields are the training settings under sd-scripts' names.
    """

    family: str  # "flux1", "sd3", or a family whose lora role has file_metadata()
    variant: str
    guidance_scale: Optional[float] = None
    timestep_sampling: Optional[str] = None
    discrete_flow_shift: Optional[float] = None
    model_prediction_type: Optional[str] = None
    sigmoid_scale: Optional[float] = None
    weighting_scheme: Optional[str] = None
    logit_mean: Optional[float] = None
    logit_std: Optional[float] = None
    mode_scale: Optional[float] = None
    apply_t5_attn_mask: bool = False
    apply_lg_attn_mask: bool = False  # SD3: the CLIP-L/G attention mask

    def __post_init__(self) -> None:
        variants = {"flux1": FLUX_VARIANTS, "sd3": SD3_VARIANTS}.get(self.family)
        if variants is None and not _names_its_file(self.family):
            raise ValueError(f"family {self.family!r}: a flow LoRA is 'flux1' or 'sd3', or a "
                             f"family whose lora role has file_metadata()")
        if variants is not None and self.variant not in variants:
            raise ValueError(f"{self.family} variant {self.variant!r}: one of {variants} "
                             "(sd-scripts' names)")


def _names_its_file(family: str) -> bool:
    """Whether ``family``'s lora role says what its files' metadata hold (file_metadata)."""
    from trainer.families import FAMILIES, role

    return family in FAMILIES and hasattr(role(family, "lora"), "file_metadata")


def _float(value: Optional[float]) -> str:
    """A float setting as ``str()`` of sd-scripts' argparse float: ``1`` -> ``"1.0"``."""
    return "None" if value is None else str(float(value))


def base_model_version(info: FlowLoraInfo) -> str:
    """``ss_base_model_version``: ``flux1``, or the SD3 model type (``5-large``...)."""
    return FLUX_VERSION if info.family == "flux1" else info.variant


def modelspec_architecture(info: FlowLoraInfo, adapter: str = "lora") -> str:
    """``flux-1-dev/lora``, ``flux-1-schnell/lora``, ``stable-diffusion-3-5-large/lora``..."""
    arch = (f"flux-1-{info.variant}" if info.family == "flux1"
            else f"stable-diffusion-3-{info.variant}")
    return f"{arch}/{adapter}" if adapter else arch


def _weighting(info: FlowLoraInfo) -> dict[str, str]:
    return {
        "ss_apply_t5_attn_mask": str(info.apply_t5_attn_mask),
        "ss_weighting_scheme": str(info.weighting_scheme),
        "ss_logit_mean": _float(info.logit_mean),
        "ss_logit_std": _float(info.logit_std),
        "ss_mode_scale": _float(info.mode_scale),
    }


def _sampling(info: FlowLoraInfo) -> dict[str, str]:
    return {
        "ss_guidance_scale": _float(info.guidance_scale),
        "ss_timestep_sampling": str(info.timestep_sampling),
        "ss_sigmoid_scale": _float(info.sigmoid_scale),
        "ss_model_prediction_type": str(info.model_prediction_type),
        "ss_discrete_flow_shift": _float(info.discrete_flow_shift),
    }


def objective_metadata(info: FlowLoraInfo) -> dict[str, str]:
    """The ``ss_*`` keys sd-scripts' ``update_metadata`` adds for the family. SD3 gets the
    sampling keys too where they are set (sd-scripts' SD3 trainer records none: our SD 3.5
    runs can use FLUX.1's samplings, and a file should say which)."""
    if info.family != "sd3":  # FLUX.1's trainer's keys (sd-scripts trains Chroma with it)
        return {"ss_model_type": "flux", **_weighting(info), **_sampling(info)}
    meta = {"ss_apply_lg_attn_mask": str(info.apply_lg_attn_mask), **_weighting(info)}
    fields = {"ss_guidance_scale": info.guidance_scale,
              "ss_timestep_sampling": info.timestep_sampling,
              "ss_sigmoid_scale": info.sigmoid_scale,
              "ss_model_prediction_type": info.model_prediction_type,
              "ss_discrete_flow_shift": info.discrete_flow_shift}
    meta.update({k: v for k, v in _sampling(info).items() if fields[k] is not None})
    return meta


def flow_lora_metadata(info: FlowLoraInfo, base: Optional[Mapping[str, str]] = None
                       ) -> dict[str, str]:
    """``base`` (the run's ``build_lora_metadata``, or nothing) with the flow family's
    version, architecture, implementation and objective keys; stale hashes dropped."""
    meta = {k: v for k, v in (base or {}).items() if k not in HASH_KEYS}
    meta.update(objective_metadata(info))
    meta["ss_base_model_version"] = base_model_version(info)
    meta["ss_v2"] = "False"
    meta["modelspec.architecture"] = modelspec_architecture(info)
    if info.family == "flux1":
        if meta.get("ss_network_module", "networks.lora") == "networks.lora":  # not lycoris'
            meta["ss_network_module"] = FLUX_NETWORK_MODULE
        meta["modelspec.implementation"] = IMPL_FLUX
        meta.pop("modelspec.prediction_type", None)
    elif info.family == "sd3":
        meta["modelspec.implementation"] = IMPL_DIFFUSERS
        meta["modelspec.prediction_type"] = "epsilon"
    else:  # another flow family: what its lora role's file_metadata() says
        from trainer.export.lycoris_args import file_network_module
        from trainer.families import role

        meta.pop("modelspec.prediction_type", None)
        own = role(info.family, "lora").file_metadata(info)
        if "ss_network_module" in own:  # a LyCORIS file keeps lycoris.kohya
            own["ss_network_module"] = file_network_module(meta, own["ss_network_module"])
        meta.update(own)
    if "modelspec.sai_model_spec" not in meta:
        meta["modelspec.sai_model_spec"] = "1.0.1"
    return meta


def save_flow_lora(path: str | Path, tensors: Mapping[str, torch.Tensor], info: FlowLoraInfo,
                   metadata: Optional[Mapping[str, Any]] = None) -> Path:
    """Write a FLUX.1 / SD 3.5 LoRA: ``tensors`` as the exporters made them, the metadata of
    :func:`flow_lora_metadata` over ``metadata``, the ``sshs_*`` hashes; atomically."""
    from trainer.export.hashes import add_hashes
    from trainer.system.safe_write import save_safetensors_atomic

    if not tensors:
        raise ValueError(f"{path}: no LoRA tensors to save")
    meta = flow_lora_metadata(info, {k: str(v) for k, v in (metadata or {}).items()})
    return save_safetensors_atomic(path, tensors, add_hashes(meta, tensors))
