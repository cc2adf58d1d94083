"""Progress on the console: a tqdm bar on a terminal, plain whole lines anywhere else.

A bar redraws itself with carriage returns. Written to a file (``train ... > run.log 2>&1``,
nohup, a CI log) that is one endless line with the log lines glued into it, so where the
output is not a terminal each update worth telling is one line of its own: the first, every
tenth of the way or every :data:`EVERY_S` seconds, whichever comes first, and the last.
``KOHYA_STUDIO_PROGRESS=bar`` (or ``lines``) chooses either way wherever the output goes: the
peer benchmark reads the bar's every step from a pipe (bench/compare_peers.py).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional, TextIO

EVERY_S = 30.0
PARTS = 10
PROGRESS_ENV = "KOHYA_STUDIO_PROGRESS"


def on_terminal() -> bool:
    """Whether to draw a bar: both of the console's streams are terminals (a bar draws on
    stderr, the log on stdout), unless :data:`PROGRESS_ENV` says ``bar`` or ``lines``."""
    chosen = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if chosen in ("bar", "lines"):
        return chosen == "bar"
    return all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ConsoleProgress:
    """One stage's progress (``start``, ``update``, ``close``) and the log lines between
    (``write``): a tqdm bar when ``terminal`` (default: :func:`on_terminal`), else lines."""

    def __init__(self, terminal: Optional[bool] = None, stream: Optional[TextIO] = None,
                 every_s: float = EVERY_S):
        self.terminal = on_terminal() if terminal is None else terminal
        self.stream, self.every_s = stream, every_s
        self.bar: Any = None
        self.total, self.desc, self.unit = 0, "", "it"
        self.active = False
        self.started = self.last_time = 0.0
        self.last_done = 0

    def start(self, total: int, desc: str = "", unit: str = "it") -> None:
        self.close()
        self.total, self.desc, self.unit, self.active = total, desc, unit, True
        self.started = self.last_time = time.monotonic()
        self.last_done = 0
        if self.terminal:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc or None, unit=unit, dynamic_ncols=True,
                            file=self.stream or sys.stderr)

    def update(self, done: int, **postfix: Any) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if postfix:
                self.bar.set_postfix(**postfix)
            return
        now = time.monotonic()
        step = max(1, self.total // PARTS)
        due = (self.last_done == 0 or done >= self.total or done // step > self.last_done // step
               or now - self.last_time >= self.every_s)
        if self.active and done > self.last_done and due:
            self._line(done, now, postfix)
            self.last_done, self.last_time = done, now

    def _line(self, done: int, now: float, postfix: dict[str, Any]) -> None:
        elapsed = now - self.started
        words = [f"{self.desc + ': ' if self.desc else ''}{done}/{self.total}"
                 + (f" ({100 * done // self.total}%)" if self.total else "")]
        if elapsed > 0:
            words.append(f"{done / elapsed:.2f} {self.unit}/s")
        if 0 < done < self.total:
            words.append(f"ETA {_clock(elapsed / done * (self.total - done))}")
        words += [f"{k} {v}" for k, v in postfix.items()]
        self.write(", ".join(words))

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.active = None, False
