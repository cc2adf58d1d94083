"""The dataset as the advisor reads it: ``trainer.data.prepare_dataset`` once per dataset, kept
while its folders (and the model, whose family says which control images it takes) do not
change; the step arithmetic (:mod:`trainer.advisor.estimate`) and the controls' count
(:mod:`trainer.advisor.edit_sequence`) read the same one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

_DATA_CACHE: dict[str, Any] = {}


def _folder_stamp(value: Optional[str]) -> list:
    if not value or value.startswith("embedded:"):
        return [value]
    root = Path(value).expanduser()
    try:
        return [value] + sorted((p.name, p.stat().st_mtime_ns) for p in [root, *root.iterdir()]
                                if p.is_dir())
    except OSError:
        return [value, None]


def _toml_stamp(path: Optional[str]) -> list:
    """A dataset TOML's own time and its image folders' stamps (its subsets can change)."""
    if not path:
        return []
    from trainer.data.dataset_toml import read_toml

    try:
        toml = Path(path).expanduser()
        raw = read_toml(toml)
    except (OSError, ValueError):
        return [path, None]
    dirs = [sub.get("image_dir") for d in raw.get("datasets", []) if isinstance(d, dict)
            for sub in d.get("subsets", []) if isinstance(sub, dict)]
    return [path, toml.stat().st_mtime_ns] + [
        _folder_stamp(str(toml.parent / d)) for d in dirs if isinstance(d, str)]


def prepared(cfg: Any) -> Any:
    """``prepare_dataset(cfg)``, cached while the folders and the model do not change."""
    from trainer.data import prepare_dataset

    ds = cfg.dataset
    key = json.dumps([ds.model_dump(mode="json"), cfg.mode, cfg.training.seed,
                      # the model's family says which controls it takes
                      cfg.model.pretrained_model_name_or_path, cfg.model.model_version,
                      cfg.training.prior_loss_weight, cfg.network.model_dump(mode="json")]
                     + [_folder_stamp(d) for d in (ds.train_data_dir, ds.reg_data_dir,
                                                   ds.validation_data_dir)]
                     + _toml_stamp(ds.dataset_config), default=str)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()  # one dataset at a time: the form's
        _DATA_CACHE[key] = prepare_dataset(cfg, warn=lambda message: None)
    return _DATA_CACHE[key]
