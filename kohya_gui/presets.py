"""Presets and config files: where they are, reading them into a config, writing the form out.

Built-in presets are ``presets/<mode>/*.toml`` in the project; the user's are
``user_presets_dir()/<mode>/*.toml``. Both are partial configs in the config-file format; a preset
without ``mode`` takes its folder's mode. Saving writes only what differs from the defaults
(``config_io.dumps(cfg, only_changed=True)``), so loading a preset and saving it back gives the
same TOML.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainer.config import TrainConfig, paths
from trainer.config import files as config_io

USER_TAG = " (user)"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,79}$")


def builtin_dir(mode: str) -> Path:
    return paths.presets_dir() / mode


def user_dir(mode: str) -> Path:
    return paths.user_presets_dir() / mode


def list_presets(mode: str) -> list[tuple[str, str]]:
    """(label, path) of every preset of a mode: built-in first, then the user's."""
    out = []
    for folder, tag in ((builtin_dir(mode), ""), (user_dir(mode), USER_TAG)):
        if folder.is_dir():
            out += [(p.stem + tag, str(p)) for p in sorted(folder.glob("*.toml"))]
    return out


def find_preset(mode: str, name_or_path: str) -> Path:
    """A preset by its label, its file stem or its path (one of the listed ones only)."""
    for label, path in list_presets(mode):
        if name_or_path in (label, path, Path(path).stem):
            return Path(path)
    known = ", ".join(label for label, _ in list_presets(mode)) or "none"
    raise config_io.ConfigError([f"no {mode} preset named {name_or_path!r} (presets: {known})"])


def read_config(path: str | Path, mode: str | None = None) -> TrainConfig:
    """A preset or config file; without a ``mode`` key it takes ``mode`` (the tab's)."""
    path = Path(path).expanduser()
    text = config_io.read_config_text(path)  # size, UTF-8, folder: one error naming the file
    data = config_io.load_toml_text(text, str(path))
    if mode is not None:
        data.setdefault("mode", mode)
    cfg = config_io.from_dict(data, str(path))
    if mode is not None and cfg.mode != mode:
        raise config_io.ConfigError(
            [f"mode = {cfg.mode!r}: this is a {cfg.mode} config; open it in the {cfg.mode} tab"],
            str(path))
    return cfg


def preset_text(cfg: TrainConfig) -> str:
    """A preset's TOML: only what differs from the defaults."""
    return config_io.dumps(cfg, only_changed=True)


def save_user_preset(cfg: TrainConfig, name: str) -> Path:
    """Write ``cfg`` as the user preset ``name`` of its mode; returns the file."""
    name = name.strip().removesuffix(".toml").removesuffix(USER_TAG)
    if not _NAME_RE.match(name):
        raise config_io.ConfigError(
            [f"preset name {name!r}: use letters, digits, spaces, '.', '_' or '-' (up to 80)"])
    return config_io.save(cfg, user_dir(cfg.mode) / f"{name}.toml", only_changed=True)


def save_config(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the whole resolved config (every setting) to ``path``."""
    path = Path(path).expanduser()
    if path.suffix != ".toml":
        raise config_io.ConfigError([f"{path}: a config file name ends in .toml"])
    return config_io.save(cfg, path)
