"""A FLUX.1 / SD 3.5 LoRA run's file: the tensors in the family's form and sd-scripts' metadata.

FLUX.1: sd-scripts' kohya keys on the BFL layout (trainer/families/flux/lora.py), CLIP-L as
``lora_te1_`` and T5 as ``lora_te3_``; SD 3.5: the ``transformer.*`` form that diffusers and
ComfyUI both load (trainer/families/sd3/lora.py); the family's lora role makes them
(``run_state_dict``). The metadata is the run's ``ss_*`` keys with the family's version,
architecture and the ``[flow]`` settings (trainer/families/common/mmdit_lora_file.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def flow_info(model: Any, cfg: Any) -> Any:
    """The file's record of the model and the objective's settings."""
    from trainer.families import family
    from trainer.families.common.mmdit_lora_file import FlowLoraInfo

    f = cfg.flow
    return FlowLoraInfo(
        family=model.version, variant=model.variant,
        guidance_scale=f.guidance_scale if family(model.version).takes_guidance else None,
        timestep_sampling=f.timestep_sampling, discrete_flow_shift=f.discrete_flow_shift,
        model_prediction_type=f.model_prediction_type, sigmoid_scale=f.sigmoid_scale,
        weighting_scheme=f.weighting_scheme, logit_mean=f.logit_mean, logit_std=f.logit_std,
        mode_scale=f.mode_scale)


def save_flow_run_lora(path: str | Path, model: Any, cfg: Any, facts: Any, dtype: torch.dtype,
                       encoders: list[str]) -> Path:
    """Write the run's LoRA at ``path``; ``encoders``: the text encoders that got one."""
    from trainer.export.metadata import build_lora_metadata
    from trainer.families import role
    from trainer.families.common.mmdit_lora_file import save_flow_lora

    transformer = model.denoiser if cfg.network.train_unet else None
    trained = {name: getattr(model, name) for name in encoders}
    lora = role(model.version, "lora")
    tensors = lora.run_state_dict(transformer, trained, dtype)
    if hasattr(lora, "save_run_lora"):  # a family that writes its file's metadata itself
        return lora.save_run_lora(path, tensors, model, cfg, build_lora_metadata(cfg, facts))
    return save_flow_lora(path, tensors, flow_info(model, cfg), build_lora_metadata(cfg, facts))


def save_flow_run_lycoris(path: str | Path, model: Any, cfg: Any, facts: Any,
                          dtype: torch.dtype, loras: list[Any], encoders: list[str]) -> Path:
    """Write the run's LyCORIS file at ``path``: each module under the family's name
    (trainer/export/flow_lycoris.py), the flow metadata (the family's writer's where it has
    one) with ``ss_network_module`` = ``lycoris.kohya`` and its ``ss_network_args``."""
    from trainer.export.flow_lycoris import TRANSFORMER, flow_lycoris_tensors
    from trainer.export.metadata import build_lora_metadata
    from trainer.families import role
    from trainer.families.common.mmdit_lora_file import save_flow_lora

    roots = [(TRANSFORMER, model.denoiser)] + [(name, getattr(model, name)) for name in encoders]
    tensors = flow_lycoris_tensors(model.version, loras, roots, dtype)
    lora = role(model.version, "lora")
    if hasattr(lora, "save_run_lora"):  # the family's own metadata, as for its LoRA
        return lora.save_run_lora(path, tensors, model, cfg, build_lora_metadata(cfg, facts))
    return save_flow_lora(path, tensors, flow_info(model, cfg), build_lora_metadata(cfg, facts))
