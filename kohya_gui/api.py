"""Endpoints for scripts and ``gradio_client``: TOML in, the runner's snapshot out.

They are thin: a config arrives as TOML text and goes through ``config_io.from_dict`` like
every other config; the state is the same snapshot that the page polls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kohya_gui import presets
from kohya_gui.runner import QueueFull, Runner
from trainer.config import files as config_io
from trainer.methods import AVAILABLE_MODES


def api_functions(runner: Runner) -> dict[str, Callable[..., Any]]:
    def state() -> dict[str, Any]:
        """The training state: status, step, total, loss points, log tail, output, queue."""
        return runner.snapshot()

    def preset_toml(mode: str, name: str) -> str:
        """The TOML of a preset (only what differs from the defaults)."""
        cfg = presets.read_config(presets.find_preset(mode, name), mode)
        return presets.preset_text(cfg)

    def train_toml(toml_text: str, overrides: list[str] | None = None) -> dict[str, Any]:
        """Queue a training job from config TOML plus ``section.key=value`` overrides.
        Returns {"ok", "job_id", "status", "message"} or {"ok": False, "problems"}."""
        try:
            data = config_io.load_toml_text(toml_text, "request")
            data = config_io.apply_overrides(data, overrides or [])
            cfg = config_io.from_dict(data, "request")
        except config_io.ConfigError as exc:
            return {"ok": False, "problems": exc.problems}
        if cfg.mode not in AVAILABLE_MODES:
            return {"ok": False, "problems": [f"mode = {cfg.mode!r}: not available yet"]}
        try:
            return {"ok": True, **runner.submit(cfg)}
        except QueueFull as exc:
            return {"ok": False, "problems": [str(exc)]}

    return {"state": state, "preset_toml": preset_toml, "train_toml": train_toml}
