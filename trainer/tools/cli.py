"""The tools' subcommands of ``python -m trainer``: one per tool, arguments from its options.

    python -m trainer inspect FILE [--json]
    python -m trainer merge BASE LORA [LORA ...] --weights 0.8 0.5 --save-to OUT.safetensors
    python -m trainer resize FILE SAVE_TO --rank 8 [--dynamic-method sv_fro --dynamic-param 0.9]
    python -m trainer extract BASE TUNED SAVE_TO --rank 32 [--conv-rank 16]
    python -m trainer caption FOLDER MODEL_DIR [--prefix sks] [--overwrite]
    python -m trainer tag FOLDER MODEL_DIR [--general-threshold 0.35] [--exclude-tags a b]

Invalid options exit with status 2 (one line per problem), a tool that cannot do its job
with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from trainer.tools import options as o

# name -> (options, "module:function" that runs it, "module:function" that formats the
# report, one line of help)
TOOLS: dict[str, tuple[type[o.ToolOptions], str, str, str]] = {
    "inspect": (o.InspectOptions, "trainer.tools.inspect:inspect",
                "trainer.tools.inspect:format_inspect",
                "show what a LoRA, LyCORIS or embedding file holds"),
    "merge": (o.MergeOptions, "trainer.tools.merge:merge", "trainer.tools.merge:format_merge",
              "merge LoRAs into a base model and save a checkpoint"),
    "resize": (o.ResizeOptions, "trainer.tools.resize:resize",
               "trainer.tools.resize:format_resize", "lower a LoRA's rank by SVD"),
    "extract": (o.ExtractOptions, "trainer.tools.extract:extract",
                "trainer.tools.extract:format_extract",
                "extract a LoRA from a fine-tuned model and its base"),
    "caption": (o.CaptionOptions, "trainer.tools.caption:caption_with_model",
                "trainer.tools.caption:format_caption",
                "caption a folder with a transformers image-to-text model"),
    "tag": (o.TagOptions, "trainer.tools.caption:tag_with_tagger",
            "trainer.tools.caption:format_caption",
            "tag a folder with a WD14-style ONNX tagger"),
}


def _load(ref: str) -> Callable[..., Any]:
    import importlib

    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


class ConsoleToolProgress:
    """The tools' progress callback on the console, one bar (or lines) per stage."""

    def __init__(self) -> None:
        from trainer.system.console import ConsoleProgress

        self.progress = ConsoleProgress(stream=sys.stderr)
        self.what = ""

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.progress.active or what != self.what:
            self.progress.start(total, what)
            self.what = what
        self.progress.update(done)

    def close(self) -> None:
        self.progress.close()


def _run(name: str, args: argparse.Namespace) -> int:
    from trainer.tools.common import ToolError

    model, run, fmt, _ = TOOLS[name]
    try:
        opts = o.from_args(model, args)
    except o.OptionsError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    progress = ConsoleToolProgress()
    try:
        report = _load(run)(opts) if name == "inspect" else _load(run)(opts, progress)
    except ToolError as exc:
        progress.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    progress.close()
    if getattr(args, "json", False):
        print(json.dumps(dataclasses.asdict(report), indent=2, default=str))
    else:
        print(_load(fmt)(report))
    return 0


def add_tool_commands(sub: Any) -> None:
    """Add one subcommand per tool to ``python -m trainer``'s subparsers."""
    for name, (model, _, _, help) in TOOLS.items():
        parser = sub.add_parser(name, help=help, description=help)
        o.add_arguments(parser, model)
        if name == "inspect":
            parser.add_argument("--json", action="store_true",
                                help="print the whole report, metadata included, as JSON")
        parser.set_defaults(func=lambda args, name=name: _run(name, args))
