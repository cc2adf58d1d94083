"""Makes the files of :mod:`trainer.advisor.shipped`: ``python -m trainer.advisor.make_shipped
[--only MODEL ...] [--jobs N]``. Each task runs in a worker process with a disk cache of its
own (nothing shipped is read meanwhile), and what it stored there is what ships."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from typing import Any, Optional

from trainer.advisor.shipped import (
    _LOADED,
    FAMILIES,
    FLOW_BUILDER,
    FLOW_MODELS,
    FOLDER,
    MODELS,
    UNET_BUILDER,
    UNET_MODELS,
    _stamp,
    code_stamp,
    entry_id,
    family_of,
    file_name,
)


def networks() -> list[tuple[str, dict[str, Any]]]:
    """(mode, settings) of the shipped step laws: the presets' networks."""
    out: list[tuple[str, dict[str, Any]]] = []
    for te in (False, True):
        out += [("lora", {"network": {"network_dim": 8, "network_alpha": alpha,
                                      "train_text_encoder": te}}) for alpha in (8.0, 4.0)]
        out.append(("dreambooth", {"network": {"train_text_encoder": te}}))
    out.append(("textual_inversion", {"network": {"token_string": "<token>"}}))
    return out


def unet_configs(model: str) -> Any:
    from trainer.advisor.model_configs import built_configs, folder_configs

    if model.startswith("embedded:"):
        return built_configs(model)
    return folder_configs(FAMILIES / model, str(FAMILIES / model), load_extra=0)


def flow_config(model: str) -> dict:
    if model.startswith("embedded:"):
        from trainer.families import role

        transformer = role(family_of(model), "memory").tiny_components()["transformer"]
        return dict(transformer.config, _class_name=type(transformer).__name__)
    return json.loads((FAMILIES / model / "transformer" / "config.json").read_text("utf-8"))


def model_key(model: str) -> str:
    if model in FLOW_MODELS:
        from trainer.advisor.flow_memory import _model

        return _model(flow_config(model))
    return unet_configs(model).key


def tasks(model: str) -> list[tuple[Any, ...]]:
    if model in FLOW_MODELS:
        from trainer.families import role

        blocks = role(family_of(model), "memory").TRAIN_BLOCKS
        return [("flow", model, b, gc, batch) for b in blocks for gc in (False, True)
                for batch in (1, 2)] + [("flow weights", model, b) for b in blocks]
    return [("unet", model)] + [("step", model, mode, json.dumps(settings), gc, batch)
                                for mode, settings in networks() for gc in (False, True)
                                for batch in (1, 2)]


def run_task(task: tuple[Any, ...]) -> dict[str, Any]:
    """The entries of one task, made in a worker with a disk cache of its own (a folder
    removed when the task is done)."""
    import tempfile

    home = tempfile.mkdtemp(prefix="advisor-shipped-")
    try:
        return _run_task(task, home)
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def _run_task(task: tuple[Any, ...], home: str) -> dict[str, Any]:
    import os

    import torch

    from trainer.advisor import flow_memory, footprint
    from trainer.advisor.model_configs import _CACHE
    from trainer.config.files import from_dict

    os.environ["KOHYA_STUDIO_HOME"] = home
    _LOADED["index"] = {}  # nothing shipped while the files are made: simulate everything
    kind, model = task[0], task[1]
    if kind == "unet":
        from trainer.advisor.base_weights import unet_weights

        configs = unet_configs(model)
        footprint.param_counts(configs)
        unet_weights(configs)
        for batch in (1, 2):
            footprint.encode_law(configs, batch)
    elif kind == "step":
        configs = unet_configs(model)
        cfg = from_dict({"mode": task[2], **json.loads(task[3])}, "shipped")
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            footprint.step_law(configs, cfg, dtype, task[4], task[5])
    else:
        config = flow_config(model)
        # the model's family named: train_blocks is read by some flow families only
        cfg = from_dict({"model": {"model_version": family_of(model)},
                         "network": {"network_dim": 4, "train_blocks": task[2]}}, "shipped")
        if kind == "flow weights":
            flow_memory.flow_weights(config, cfg)
        else:
            for blocks in flow_memory._shapes(config):
                flow_memory.flow_law(config, blocks, cfg, task[3], task[4])
    # what the worker stored on its disk is what ships, under the same keys
    from trainer.advisor.disk_cache import _read, _stamp, cache_file

    stored, made = _read(cache_file()), {}
    for key in list(_CACHE):
        name = hashlib.sha256((_stamp() + key).encode()).hexdigest()
        if name in stored and key.startswith(SHIPPED_KINDS):
            made[entry_id(key)] = stored[name]
    return made


SHIPPED_KINDS = ("params:", '["step-law"', '["encode-law"', '["flow-law"', '["flow-weights"',
                 '["unet-base-weights"')


def build(models: tuple[str, ...], jobs: int) -> None:
    import multiprocessing
    from importlib.metadata import version

    FOLDER.mkdir(parents=True, exist_ok=True)
    index_path = FOLDER / "index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    index.pop("code", None)  # one stamp for every model: the index before per-model stamps
    index["models"] = {k: v for k, v in index.get("models", {}).items() if isinstance(v, dict)}
    index["versions"] = {n: version(n) for n in ("torch", "diffusers", "peft", "transformers")}
    with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=8) as pool:
        for model in models:
            work = tasks(model)
            entries: dict[str, Any] = {}
            for i, got in enumerate(pool.imap_unordered(run_task, work), 1):
                entries.update(got)
                print(f"{model}: {i}/{len(work)}", flush=True)
            with gzip.open(FOLDER / file_name(model), "wt", encoding="utf-8") as f:
                json.dump({"model": model, "entries": entries}, f, sort_keys=True)
            index["models"] = {k: v for k, v in index["models"].items()
                               if v["file"] != file_name(model)}
            index["models"][entry_id(model_key(model))] = {"file": file_name(model),
                                                           "code": code_stamp(model)}
            index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n",
                                  encoding="utf-8")
    write_embedded()


def add_base_weights(models: tuple[str, ...] = UNET_MODELS) -> None:
    """Counts the UNets' weights for the memory options (trainer/advisor/base_weights.py) into
    the shipped files as they are, without making the laws again (seconds)."""
    from dataclasses import asdict

    from trainer.advisor.base_weights import count_unet, weights_key

    for model in models:
        configs, path = unet_configs(model), FOLDER / file_name(model)
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        data["entries"][entry_id(weights_key(configs))] = asdict(count_unet(configs))
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
        print(f"{model}: base weights", flush=True)


def write_embedded() -> None:
    from trainer.advisor.model_configs import built_configs

    unet = {m: built_configs(m) for m in UNET_MODELS if m.startswith("embedded:")}
    flow = {m: flow_config(m) for m in FLOW_MODELS if m.startswith("embedded:")}
    data = {"unet": {"stamp": _stamp(UNET_BUILDER), "models": {
        m: {"family": c.family, "unet": c.unet, "vae": c.vae,
            "text_encoders": [list(e) for e in c.text_encoders]} for m, c in unet.items()}},
        "flow": {"stamp": _stamp(FLOW_BUILDER), "models": flow}}
    (FOLDER / "embedded.json").write_text(
        json.dumps(data, indent=1, sort_keys=True, default=list) + "\n", encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=MODELS, help="these models only")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--base-weights", action="store_true",
                        help="only count the UNets' weights for the memory options into the "
                             "shipped files (seconds)")
    args = parser.parse_args(argv)
    if args.base_weights:
        add_base_weights(tuple(m for m in args.only or UNET_MODELS if m in UNET_MODELS))
        return
    build(tuple(args.only or MODELS), args.jobs)


if __name__ == "__main__":
    main()
