"""trainer.system.quiet: known-harmless third-party chatter becomes debug-level, and a run
prints nothing of its own accord (the trainer talks through events)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from trainer.system import quiet

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record):
        self.seen.append((record.levelname, record.getMessage()))


def test_a_known_record_is_shown_only_at_debug_level():
    logger = logging.getLogger("kohya.test.quiet")
    handler = Records()
    logger.addHandler(handler)
    logger.propagate = False
    logger.addFilter(quiet.Demote(r"optional kernel"))
    try:
        logger.setLevel(logging.WARNING)
        logger.warning("no optional kernel here")  # known: dropped
        logger.warning("the disk is full")  # not known: untouched
        assert handler.seen == [("WARNING", "the disk is full")]
        logger.setLevel(logging.DEBUG)  # the user asked for debug output
        logger.warning("no optional kernel here")
        assert handler.seen[-1] == ("DEBUG", "no optional kernel here")
    finally:
        logger.removeHandler(handler)


def test_the_filters_are_installed_once_on_the_known_loggers():
    quiet.quiet_third_party()
    quiet.quiet_third_party()
    for known in quiet.KNOWN:
        filters = [f for f in logging.getLogger(known.logger).filters
                   if isinstance(f, quiet.Demote)]
        assert [f.pattern.pattern for f in filters] == [known.pattern]


def test_a_first_run_prints_nothing(tmp_path):
    """Building the embedded model, saving it, loading it and training two steps, in a fresh
    process and a fresh data folder: the trainer emits events and nothing reaches stderr (no
    progress bars of model loads and saves, no warnings about image processors)."""
    code = (
        "from trainer.config.files import from_dict\n"
        "from trainer.run.loop import run\n"
        "class Silent:\n"
        "    def emit(self, event):\n"
        "        pass\n"
        "cfg = from_dict({'model': {'pretrained_model_name_or_path': 'embedded:tiny-sd15'},\n"
        "                 'dataset': {'resolution': 64, 'enable_bucket': False},\n"
        "                 'training': {'max_train_steps': 2, 'log_with': 'none'},\n"
        f"                 'saving': {{'output_dir': {str(tmp_path / 'out')!r}}}}})\n"
        "result = run(cfg, Silent())\n"
        "print(result.status, result.error or '')\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    env.update(KOHYA_STUDIO_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env=env, timeout=540)
    assert proc.stdout.split() == ["finished"], proc.stdout + proc.stderr[-2000:]
    assert proc.stderr == ""


def test_bars_are_off_even_when_the_libraries_came_first():
    """An application that imports transformers before the trainer (its variable is read at
    import) gets the same quiet loads."""
    code = ("import transformers.utils.logging as tl\n"
            "assert tl.is_progress_bar_enabled()\n"
            "import trainer\n"
            "print(tl.is_progress_bar_enabled())\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env=env, timeout=300)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]
