"""How a run talks: log lines (to the process log and as ``Log`` events), events to its sink,
and Stop, read between the set-up stages (:class:`trainer.run.session.Reporter` is the
protocol set-up asks for; this is the run's own)."""

from __future__ import annotations

import logging

from trainer.events import Control, Event, EventSink, Log, safe_emit

log = logging.getLogger("trainer.run.loop")


class StoppedBeforeTraining(Exception):
    """Stop was pressed while the data or the model were being prepared."""


class Reporter:
    """The output channel of one run: its sink and its Control."""

    def __init__(self, sink: EventSink, control: Control):
        self.sink, self.control = sink, control

    def log(self, message: str, level: str = "info") -> None:
        getattr(log, "warning" if level == "warning" else "info")(message)
        safe_emit(self.sink, Log(message, level))

    def emit(self, event: Event) -> None:
        safe_emit(self.sink, event)

    def check_stop(self) -> None:
        if self.control.stop_requested:
            raise StoppedBeforeTraining
