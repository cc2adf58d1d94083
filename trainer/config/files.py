"""TOML load and dump, dotted overrides, schema migrations and readable config errors.

Every way into a :class:`~trainer.config.TrainConfig` (a file, a preset, ``--set`` overrides, the
GUI form) ends in :func:`from_dict`, so every path gets the same validation and the same errors.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import tomli_w
import tomllib
from pydantic import ValidationError

from trainer.config.schema import SCHEMA_VERSION, SECTIONS, TrainConfig, iter_fields


class ConfigError(ValueError):
    """A config that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems) if len(problems) == 1 else
                         where + "\n  " + "\n  ".join(problems))


# Migrations: schema_version N -> N+1, each a function on the raw dict.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def all_paths() -> list[str]:
    """Every valid dotted key, e.g. ``optimizer.learning_rate``."""
    paths = ["schema_version"]
    for section, name, _ in iter_fields():
        paths.append(f"{section}.{name}" if section else name)
    return paths


def suggest(path: str) -> str | None:
    """The valid dotted key nearest to a mistyped one."""
    candidates = all_paths()
    leaf = path.rsplit(".", 1)[-1]
    match = difflib.get_close_matches(path, candidates, n=1, cutoff=0.6)
    if not match:  # a right name in the wrong section, or a typo in the leaf alone
        by_leaf = {c.rsplit(".", 1)[-1]: c for c in candidates}
        leaf_match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.7)
        match = [by_leaf[leaf_match[0]]] if leaf_match else []
    return match[0] if match else None


def _describe(err: Mapping[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        hint = suggest(loc)
        msg = f"{loc}: unknown key"
        return msg + (f"; did you mean '{hint}'?" if hint else "")
    if kind == "value_error" and not loc:  # a cross-field check: its message names the fields
        return str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 60 else "..."
    ctx = err.get("ctx") or {}
    if kind == "literal_error":
        allowed = ctx.get("expected", "")
        return f"{loc} = {shown}: must be one of {allowed}"
    bounds = {"greater_than_equal": ">= {ge}", "greater_than": "> {gt}",
              "less_than_equal": "<= {le}", "less_than": "< {lt}",
              "multiple_of": "a multiple of {multiple_of}"}
    if kind in bounds:
        return f"{loc} = {shown}: must be " + bounds[kind].format(**ctx)
    return f"{loc} = {shown}: {err['msg'][0].lower()}{err['msg'][1:]}"


def from_dict(data: Mapping[str, Any], source: str | None = None) -> TrainConfig:
    """Validate a raw (possibly partial) dict into a TrainConfig, migrating old schemas."""
    data = migrate(dict(data), source)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_describe(e) for e in exc.errors()], source) from None


def migrate(data: dict[str, Any], source: str | None = None) -> dict[str, Any]:
    version = data.get("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise ConfigError([f"schema_version = {version!r}: this version reads 1 to "
                           f"{SCHEMA_VERSION}; update the tool to read newer files"], source)
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
        data["schema_version"] = version
    return data


MAX_CONFIG_BYTES = 4 * 2**20  # a config, a preset, a kohya_ss file, a dataset TOML
MAX_DEPTH = 32  # tables and lists inside each other
MAX_INT = 2**63 - 1


def value_problems(data: Any, where: str = "", depth: int = 0) -> list[str]:
    """What no setting can hold, anywhere in a parsed file: nesting deeper than
    :data:`MAX_DEPTH`, numbers that are not finite (1e999 reads as inf) or do not fit in 64
    bits. The schema then checks each setting's own range and type."""
    if depth > MAX_DEPTH:
        return [f"{where or 'the file'}: nested more than {MAX_DEPTH} levels deep"]
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = ((f"[{i}]", v) for i, v in enumerate(data))
    elif isinstance(data, float) and not math.isfinite(data):
        return [f"{where} = {data}: not a finite number"]
    elif isinstance(data, int) and not isinstance(data, bool) and abs(data) > MAX_INT:
        shown = str(data) if len(str(data)) <= 40 else str(data)[:37] + "..."
        return [f"{where} = {shown}: too large (more than 2^63)"]
    else:
        return []
    problems: list[str] = []
    for key, value in items:
        name = f"{where}{key}" if str(key).startswith("[") else (
            f"{where}.{key}" if where else str(key))
        problems += value_problems(value, name, depth + 1)
        if len(problems) >= 10:
            break
    return problems


def check_values(data: Any, source: str | None = None) -> Any:
    """``data`` when :func:`value_problems` finds nothing, else a ConfigError naming them."""
    problems = value_problems(data)
    if problems:
        raise ConfigError(problems, source)
    return data


def load_toml_text(text: str, source: str | None = None) -> dict[str, Any]:
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{len(text) / 2**20:.1f} MB of text: a config is at most "
                           f"{MAX_CONFIG_BYTES // 2**20} MB"], source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], source) from None
    except RecursionError:
        raise ConfigError([f"not valid TOML here: nested more than {MAX_DEPTH} levels deep"],
                          source) from None
    return check_values(data, source)


def read_config_text(path: Path, encoding: str = "utf-8") -> str:
    """A config file's text; a missing, unreadable, oversized or non-UTF-8 file is a
    ConfigError naming it."""
    try:
        if path.is_dir():
            raise ConfigError(["is a folder, not a config file"], str(path))
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError([f"the file is {size / 2**20:.1f} MB; a config file is at most "
                               f"{MAX_CONFIG_BYTES // 2**20} MB: is it the right file?"],
                              str(path))
        return path.read_text(encoding=encoding)
    except FileNotFoundError:
        raise ConfigError(["file not found; check the path"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not UTF-8 text (invalid byte at position {exc.start}); save it "
                           "as UTF-8"], str(path)) from None
    except OSError as exc:
        raise ConfigError([f"cannot read the file ({exc.strerror or exc})"], str(path)) from None


def load(path: str | Path, overrides: Iterable[str] = ()) -> TrainConfig:
    """Read a TOML config (full or partial), apply ``a.b=value`` overrides and validate."""
    path = Path(path)
    data = load_toml_text(read_config_text(path), str(path))
    data = apply_overrides(data, overrides)
    return from_dict(data, str(path))


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML value when it parses as one, else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Set dotted keys (``optimizer.learning_rate=2e-4``) in a raw config dict."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError([f"override {item!r}: write it as section.key=value"], "--set")
        parts = key.split(".")
        if key not in all_paths():
            hint = suggest(key)
            raise ConfigError([f"{key}: unknown key" + (f"; did you mean '{hint}'?" if hint
                                                         else "")], "--set")
        target = data
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = parse_value(raw.strip())
    return data


def to_dict(cfg: TrainConfig, only_changed: bool = False) -> dict[str, Any]:
    """A TOML-ready dict: None values are left out (absent means unset)."""
    full = cfg.model_dump(mode="json", exclude_none=True)
    if not only_changed:
        return full
    default = TrainConfig().model_dump(mode="json", exclude_none=True)
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    for key, value in full.items():
        if isinstance(value, dict) and key in SECTIONS:
            changed = {k: v for k, v in value.items() if default[key].get(k) != v}
            if changed:
                out[key] = changed
        elif default.get(key) != value:
            out[key] = value
    return out


def dumps(cfg: TrainConfig, only_changed: bool = False) -> str:
    """The config as TOML text; ``only_changed`` writes only what differs from the defaults."""
    return tomli_w.dumps(to_dict(cfg, only_changed))


def save(cfg: TrainConfig, path: str | Path, only_changed: bool = False) -> Path:
    """Write the config as TOML atomically (a temporary name, then a rename)."""
    from trainer.system.safe_write import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(dumps(cfg, only_changed), encoding="utf-8")
    return path


def example_toml() -> str:
    """``config_example.toml``: every setting with its default and its help as a comment."""
    lines = [
        "# Example training config: every setting with its default value.",
        "# Generated from trainer/config.py by `python -m trainer example-config`; do not edit.",
        "# Settings shown commented out are unset by default.",
        "",
        f"schema_version = {SCHEMA_VERSION}",
    ]
    current = None
    for section, name, info in iter_fields():
        if section != current:
            current = section
            lines += ["", f"[{section}]"] if section else [""]
        lines.append(f"# {info.description}")
        default = info.get_default(call_default_factory=True)
        if default is None:
            lines.append(f"# {name} =")
        elif isinstance(default, dict):  # inline, so the section's keys that follow stay in it
            items = ", ".join(tomli_w.dumps({k: v}).strip() for k, v in default.items())
            lines.append(f"{name} = {{{items}}}" if items else f"{name} = {{}}")
        else:
            lines.append(tomli_w.dumps({name: default}).rstrip("\n"))
    return "\n".join(lines) + "\n"
