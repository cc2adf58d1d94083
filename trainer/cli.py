"""``python -m trainer``: train from a TOML config, check the environment, build the embedded model.

    python -m trainer train CONFIG.toml [--set section.key=value ...]
    python -m trainer doctor
    python -m trainer tiny-model DIR
    python -m trainer example-config [--check]
    python -m trainer advise CONFIG.toml [--set ...]  (memory, time and advice before a run)
    python -m trainer import-kohya FILE.json [-o OUT.toml] [--mode lora]  (a kohya_ss config)
    python -m trainer inspect | merge | resize | extract | caption | tag ...  (the tools; see
        trainer/tools/cli.py or `python -m trainer TOOL --help`)

Config errors print one line per problem (naming the dotted key) and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional

from trainer.config.paths import PROJECT_ROOT

EXAMPLE_PATH = PROJECT_ROOT / "config_example.toml"


class ConsoleSink:
    """Prints the trainer's events: log lines, the progress of each stage of preparation (e.g.
    generating class images) and of the steps; a bar on a terminal, whole lines elsewhere
    (trainer/system/console.py)."""

    def __init__(self, terminal: Optional[bool] = None) -> None:
        from trainer.system.console import ConsoleProgress

        self.progress = ConsoleProgress(terminal)
        self.stage: Optional[str] = None  # the preparation followed, None for the steps

    def emit(self, event) -> None:
        from trainer import events as ev

        if isinstance(event, ev.Progress):
            if self.stage != event.stage or not self.progress.active:
                self.progress.start(event.total, event.stage)
                self.stage = event.stage
            self.progress.update(event.done)
        elif isinstance(event, ev.Started):
            self.progress.start(event.total_steps, unit="step")
            self.stage = None
        elif isinstance(event, ev.Step) and self.progress.active and self.stage is None:
            self.progress.update(event.step, epoch=event.epoch, loss=f"{event.loss_avg:.4f}",
                                 lr=f"{event.lr:.2e}")
        elif isinstance(event, ev.Log):
            self.progress.write(("WARNING: " if event.level == "warning" else "")
                                + event.message)
        elif isinstance(event, ev.Finished):
            self.progress.close()
            self.progress.write(f"{event.status} at step {event.step}"
                                + (f": {event.output_path}" if event.output_path else ""))


def _train(args: argparse.Namespace) -> int:
    from trainer.config import files as config_io
    from trainer.run.launch import run_from_cli

    overrides = list(args.set or [])
    if args.num_processes is not None:
        overrides.append(f"training.num_processes={args.num_processes}")
    try:
        cfg = config_io.load(args.config, overrides)
    except config_io.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_from_cli(cfg, ConsoleSink(), args)  # in-process, or torchrun for DDP
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
        return 1
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from trainer.families.sd.tiny import save_tiny_model

    path = save_tiny_model(args.dir)
    print(f"wrote the tiny SD 1.x model to {path}")
    return 0


def _example_config(args: argparse.Namespace) -> int:
    from trainer.config.files import example_toml

    text = example_toml()
    if args.check:
        current = EXAMPLE_PATH.read_text(encoding="utf-8") if EXAMPLE_PATH.exists() else ""
        if current != text:
            print(f"{EXAMPLE_PATH} is stale: run `python -m trainer example-config`",
                  file=sys.stderr)
            return 1
        print(f"{EXAMPLE_PATH} is up to date")
        return 0
    from trainer.system.safe_write import atomic_path

    with atomic_path(EXAMPLE_PATH) as tmp:  # a reader never sees it half-written
        tmp.write_text(text, encoding="utf-8")
    print(f"wrote {EXAMPLE_PATH}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from trainer.tools import doctor

    return doctor.main(["--model", args.model] if args.model else [])


CORE_COMMANDS = ("train", "doctor", "tiny-model", "example-config")


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """All the subcommands; for one of ``CORE_COMMANDS`` only those, so that a ``train``
    imports neither the tools nor the importers nor the advisor."""
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a TOML config (full or partial)")
    train.add_argument("config", type=Path, help="the config file, e.g. presets/lora/default.toml")
    train.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a setting, e.g. --set optimizer.learning_rate=2e-4")
    from trainer.run.launch import add_launch_arguments

    add_launch_arguments(train)  # --num-processes and the multi-machine rendezvous
    train.set_defaults(func=_train)
    doctor = sub.add_parser("doctor", help="report the device, the torch build and known "
                            "problems")
    doctor.add_argument("--model", metavar="PATH", help="also say which family a base model "
                        "is, as train and advise read it, and which parts a file holds")
    doctor.set_defaults(func=_doctor)
    tiny = sub.add_parser("tiny-model", help="write the embedded tiny SD 1.x model to DIR")
    tiny.add_argument("dir", type=Path)
    tiny.set_defaults(func=_tiny_model)
    example = sub.add_parser("example-config", help="write config_example.toml from the schema")
    example.add_argument("--check", action="store_true", help="only check that it is fresh")
    example.set_defaults(func=_example_config)
    if command in CORE_COMMANDS:
        return parser
    from trainer.tools.cli import add_tool_commands

    add_tool_commands(sub)
    from trainer.advisor.report import add_advise_command

    add_advise_command(sub)
    from trainer.importers.kohya.cli import add_import_command

    add_import_command(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return args.func(args)
