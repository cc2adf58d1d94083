"""The advisor's report in words: a summary line for the panel under Train, and the whole
report (steps, the memory table at the peak, with and without gradient checkpointing, the time,
the advice) as markdown, which the GUI shows and ``python -m trainer advise`` prints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

from trainer.advisor.advice import Advice, Steps, gib
from trainer.advisor.rules import Recommendation


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else (
        f"{minutes} min {secs:02d} s" if minutes else f"{secs} s")


def summary(advice: Advice) -> str:
    """One line: peak memory of the device's, time per step and for the run."""
    if advice.memory is None:
        return "No estimate: " + "; ".join(advice.problems)
    m, t = advice.memory, advice.timing
    of = f" of {gib(m.capacity)}" if m.capacity else ""
    verdict = "fits" if m.fits else "**does not fit**"
    if not advice.fits_ram:
        verdict += "; **does not fit in RAM**"
    run = f", {duration(t.total_seconds)} for {advice.steps.total_steps} steps" \
        if t and t.total_seconds else ""
    return (f"Estimated peak memory **{gib(m.peak)}**{of} ({verdict}); "
            f"~{duration(t.seconds_per_step if t else None)} per step{run}")


def _steps_markdown(s: Steps, cfg: Any) -> str:
    if s.problem:
        return f"Steps: unknown ({s.problem})"
    tr = cfg.training
    held = f" ({s.validation_images} held out for validation)" if s.validation_images else ""
    return (f"{s.images} images{held} -> {s.samples_per_epoch} samples per epoch / batch "
            f"{tr.train_batch_size} = {s.batches_per_epoch} batches"
            + (f" / accumulation {tr.gradient_accumulation_steps} = {s.steps_per_epoch} steps"
               if tr.gradient_accumulation_steps > 1 else "")
            + f"; {s.epochs} epoch(s) -> **{s.total_steps} steps**")


def changes_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in changes.items())


def recommendation_markdown(r: Recommendation) -> str:
    sets = f" (`{changes_text(r.changes)}`)" if r.changes else ""
    saves = f", saves {gib(r.saves)}" if r.saves else ""
    return f"- {'✓ ' if r.done else ''}**{r.title}**: {r.why}{saves}{sets}"


def advice_markdown(advice: Advice, cfg: Any) -> str:
    """The whole report: the summary, steps, the memory table, the time, the advice."""
    lines = [summary(advice), "", f"Device: {advice.device}; precision: {advice.precision}",
             "", _steps_markdown(advice.steps, cfg)]
    m, o = advice.memory, advice.other
    if m is not None and o is not None:
        lines += ["", f"| at the peak ({m.phase}) | memory |", "|---|---:|"]
        lines += [f"| {what} | {gib(b)} |" for what, b in m.lines]
        lines += [f"| **total** | **{gib(m.peak)}** |", "",
                  f"Gradient checkpointing {'on' if m.checkpointing else 'off'}: "
                  f"{gib(m.peak)}; {'on' if o.checkpointing else 'off'}: {gib(o.peak)} "
                  f"(~{duration(advice.other_timing.seconds_per_step)} per step)"]
    lines += _phases_markdown(advice)
    if advice.timing is not None:
        t = advice.timing
        lines += ["", f"Time: {t.tflop_per_step:.3g} TFLOP per step at the largest bucket "
                  f"({t.basis}) -> ~{duration(t.seconds_per_step)} per step, "
                  f"~{duration(t.total_seconds)} for the run (loading and caching not counted)"]
    if advice.recommendations:
        lines += ["", "Advice:"] + [recommendation_markdown(r) for r in advice.recommendations]
    if advice.problems:
        lines += ["", "Problems:"] + [f"- {p}" for p in advice.problems]
    return "\n".join(lines)


def _phases_markdown(advice: Advice) -> list[str]:
    """The RAM (and the device's memory) phase by phase, and whether the RAM holds them."""
    if not advice.phases:
        return []
    on_device = any(p.device is not None for p in advice.phases)
    ram = f" of {gib(advice.ram)}" if advice.ram else ""
    head = "| phase | host memory (RAM) |" + (" device |" if on_device else "")
    out = ["", head, "|---|---:|" + ("---:|" if on_device else "")]
    for p in advice.phases:
        out.append(f"| {p.name} | {gib(p.host)} |" + (f" {gib(p.device)} |" if on_device
                                                       else ""))
    peak = advice.host_peak()
    verdict = "fits in RAM" if advice.fits_ram else "**does not fit in RAM**"
    out += ["", f"Host memory at its peak ({peak.name}): {gib(peak.host)}{ram} ({verdict})"]
    return out


# --- the command line ---------------------------------------------------------------------

def _command(args: argparse.Namespace) -> int:
    from trainer.config import files as config_io

    try:
        cfg = config_io.load(args.config, args.set or [])
    except config_io.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from trainer.advisor.estimate import advise

    advice = advise(cfg)
    print(advice_markdown(advice, cfg))
    return 1 if advice.memory is None else 0


def add_advise_command(sub: Any) -> None:
    """``python -m trainer advise CONFIG.toml [--set key=value ...]``."""
    parser = sub.add_parser("advise", help="estimate memory and time of a config on this "
                            "device, with advice, before training")
    parser.add_argument("config", type=Path, help="the config file")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a setting, e.g. --set training.train_batch_size=4")
    parser.set_defaults(func=_command)
