"""``python -m trainer import-kohya FILE.json [-o OUT.toml] [--mode MODE]``.

Prints the import report (on stderr when the TOML goes to stdout, so that ``> out.toml`` stays a
clean TOML) and writes the whole validated config atomically with ``-o``. A refused file (a
HunyuanImage config, broken JSON, a value out of range) prints one line per problem and exits
with 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.config import MODES


def _import_kohya(args: argparse.Namespace) -> int:
    from trainer.config import files as config_io
    from trainer.importers.kohya import import_kohya_file

    try:
        cfg, report = import_kohya_file(args.file, args.mode)
    except config_io.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        print(report.text(), file=sys.stderr)
        sys.stdout.write(config_io.dumps(cfg))
        return 0
    try:
        config_io.save(cfg, args.output)
    except OSError as exc:
        print(f"error: {args.output}: cannot write the config ({exc})", file=sys.stderr)
        return 1
    print(report.text())
    print(f"\nwrote {args.output}; train it with: python -m trainer train {args.output}")
    return 0


def add_import_command(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser("import-kohya", help="convert a kohya_ss GUI JSON config (or preset) "
                         "into a TOML config, with a report of every key")
    cmd.add_argument("file", type=Path, help="the kohya_ss .json file")
    cmd.add_argument("-o", "--output", type=Path,
                     help="write the TOML here (default: print it)")
    cmd.add_argument("--mode", choices=MODES,
                     help="the training mode (default: from the file's keys)")
    cmd.set_defaults(func=_import_kohya)
