"""A trained Stable Diffusion model as a diffusers folder, written without touching the model.

``StableDiffusionPipeline.save_pretrained`` saves the modules at their current dtype; a run that
goes on after an intermediate save must keep its fp32 weights, so this writes each component's
config with the library's own writers and its weights, cast to the save precision, as the
safetensors file that ``from_pretrained`` reads (``diffusion_pytorch_model.safetensors`` for
diffusers models, ``model.safetensors`` for transformers). The folder appears atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainer.system.safe_write import atomic_dir


def _weights(module: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict at ``dtype`` on the CPU; a tensor tied to an earlier one (T5's token
    embedding, ``shared`` and ``encoder.embed_tokens``) is written once, under its first name,
    as transformers writes it and re-ties it on load."""
    out, seen = {}, set()
    for key, tensor in module.state_dict().items():
        if tensor.data_ptr() in seen and tensor.numel():
            continue
        seen.add(tensor.data_ptr())
        t = tensor.detach().to("cpu")
        out[key] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
    return out


def _diffusers_model(module: Any, folder: Path, dtype: torch.dtype) -> None:
    folder.mkdir()
    module.save_config(folder)
    save_file(_weights(module, dtype), str(folder / "diffusion_pytorch_model.safetensors"))


def _transformers_model(module: Any, folder: Path, dtype: torch.dtype) -> None:
    folder.mkdir()
    module.config.save_pretrained(folder)
    save_file(_weights(module, dtype), str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def save_pipeline_folder(path: str | Path, model: Any, unet: Any, text_encoder: Any,
                         dtype: torch.dtype, text_encoder_2: Any = None) -> Path:
    """Write ``model`` (a trainer BaseModel, with ``unet``/``text_encoder``(``_2``) unwrapped)
    as a ``StableDiffusionPipeline`` (SDXL: ``StableDiffusionXLPipeline``) folder that
    ``from_pretrained`` loads; returns the path."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    scheduler = DDIMScheduler.from_config(model.noise_scheduler.config)
    parts = {"vae": model.vae, "text_encoder": text_encoder, "tokenizer": model.tokenizer,
             "unet": unet, "scheduler": scheduler}
    if text_encoder_2 is not None:
        parts.update(text_encoder_2=text_encoder_2, tokenizer_2=model.tokenizer_2)
        pipe = StableDiffusionXLPipeline(**parts)
    else:
        pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
    path = Path(path)
    with atomic_dir(path) as tmp:
        pipe.save_config(tmp)  # model_index.json
        _diffusers_model(unet, tmp / "unet", dtype)
        _diffusers_model(model.vae, tmp / "vae", dtype)
        for name in ("text_encoder", "text_encoder_2"):
            if parts.get(name) is not None:
                _transformers_model(parts[name], tmp / name, dtype)
                tok = "tokenizer" + name[len("text_encoder"):]
                parts[tok].save_pretrained(tmp / tok)
        scheduler.save_pretrained(tmp / "scheduler")
    return path


def _processor(processor: Any, folder: Path) -> None:
    """An image processor's folder (``processor/``), named in ``model_index.json`` by the
    transformers class it is (a family may hold a local subclass of it: Qwen-Image-Edit's
    processor has no video part), as the released folders name it."""
    import json

    processor.save_pretrained(folder / "processor")
    index_path = folder / "model_index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    known = next(c for c in type(processor).__mro__ if c.__module__.startswith("transformers."))
    index["processor"] = ["transformers", known.__name__]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_flow_pipeline_folder(path: str | Path, model: Any, transformer: Any,
                              encoders: dict[str, Any], dtype: torch.dtype) -> Path:
    """Write a FLUX.1 / SD 3.5 ``model`` as its ``FluxPipeline`` / ``StableDiffusion3Pipeline``
    folder, with ``transformer`` and the text encoders of ``encoders`` (name -> unwrapped
    module; the model's own for the others) at ``dtype``; the scheduler as loaded."""
    from trainer.families import family_of

    family = family_of(model)
    names = [name for name, _, _ in family.text_encoders(model)]
    modules = {name: encoders.get(name, getattr(model, name)) for name in names}
    # the pipeline the folder names: a family may name another than its samples' (an edit
    # variant's own, with its image processor, so that the folder loads as that model again)
    pipe = getattr(family, "folder_pipeline", family.pipeline)(model, transformer,
                                                               model.noise_scheduler)
    path = Path(path)
    with atomic_dir(path) as tmp:
        pipe.save_config(tmp)  # model_index.json
        processor = pipe.components.get("processor")
        if processor is not None:
            _processor(processor, tmp)
        _diffusers_model(transformer, tmp / "transformer", dtype)
        _diffusers_model(model.vae, tmp / "vae", dtype)
        for name, module in modules.items():
            _transformers_model(module, tmp / name, dtype)
            tok = "tokenizer" + name[len("text_encoder"):]
            getattr(model, tok).save_pretrained(tmp / tok)
        model.noise_scheduler.save_pretrained(tmp / "scheduler")
    return path
