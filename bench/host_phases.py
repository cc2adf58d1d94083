"""A run's host memory phase by phase, measured, beside the advisor's estimate of each phase.

    python bench/host_phases.py CONFIG.toml [--set KEY=VALUE ...] [--avx2]

The run is a fresh process on the CPU; its peak RSS (VmHWM, reset at each phase's start through
/proc/self/clear_refs, Linux) is noted as each phase ends, read from the run's own log:

- load: the base model loaded ("Base model: ..."; with text first the transformer waits);
- text cache: every caption encoded ("Text encoders released" or "Text-encoder cache ready");
- transformer: built after the text encoders went (text first: "Transformer built");
- step: the first training step (the adapters, the latents the first epoch encodes).

The estimate is ``trainer.advisor.estimate.advise`` for the same config in this process.
``--avx2`` limits PyTorch's CPU kernels to AVX2, as on a CPU without bf16 units.
"""

from __future__ import annotations

import argparse
import sys
import time

from childproc import ROOT, parse_or_run_child, run_child

MARKS = [("load", ("Base model:",)),
         ("text cache", ("Text encoders released", "Text-encoder cache ready")),
         ("transformer", ("Transformer built",)), ("step", ())]


def _peak_and_reset() -> int:
    """VmHWM in bytes since the last reset, then reset (clear_refs 5)."""
    with open("/proc/self/status", encoding="ascii") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return peak * 1024


class PhasePeaks:
    """An event sink that notes each phase's peak RSS and seconds as the run's log ends it."""

    def __init__(self, echo: bool = False) -> None:
        self.echo, self.start, self.done = echo, time.perf_counter(), []
        self.left = list(MARKS)
        _peak_and_reset()

    def emit(self, event) -> None:
        """A phase ends at its mark; the phases before it that this run has not (no text
        first) are skipped."""
        from trainer.events import Log, Step

        if self.echo and isinstance(event, Log):
            print(event.message, file=sys.stderr, flush=True)
        for index, (name, marks) in enumerate(self.left):
            if (isinstance(event, Step) and not marks) or (
                    marks and isinstance(event, Log) and event.message.startswith(marks)):
                now = time.perf_counter()
                self.done.append({"phase": name, "peak": _peak_and_reset(),
                                  "seconds": round(now - self.start, 1)})
                self.start, self.left = now, self.left[index + 1:]
                return


def _measure(config: str, overrides: list) -> dict:
    sys.path.insert(0, str(ROOT))
    from trainer.config import files as config_io
    from trainer.run.loop import run

    cfg = config_io.load(config, overrides)
    sink = PhasePeaks(echo=True)
    result = run(cfg, sink)
    return {"status": result.status, "error": result.error, "phases": sink.done}


def measure_phases(config: str, overrides: list, **env: str) -> dict:
    """The run's phases measured in a child process: {"status", "error", "phases": [...]}."""
    return run_child(__file__, [config, overrides], **env)


def estimated_phases(config: str, overrides: list) -> dict:
    """The advisor's host bytes per phase for the same config, by phase name."""
    sys.path.insert(0, str(ROOT))
    from trainer.advisor.estimate import advise
    from trainer.config import files as config_io

    advice = advise(config_io.load(config, overrides))
    return {p.name: p.host for p in advice.phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--avx2", action="store_true")
    args = parse_or_run_child(parser, _measure)
    env = {"HF_HUB_OFFLINE": "1", "KOHYA_STUDIO_PROGRESS": "lines"}
    if args.avx2:
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    measured = measure_phases(args.config, args.set, **env)
    estimate = estimated_phases(args.config, args.set)
    print(f"run: {measured['status']}" + (f" ({measured['error']})" if measured["error"] else ""))
    print("| phase | measured peak RSS | advise | error | time |\n|---|---:|---:|---:|---:|")
    total = 0.0
    for phase in measured["phases"]:
        total += phase["seconds"]
        got, est = phase["peak"] / 2**30, estimate.get(phase["phase"], 0) / 2**30
        print(f"| {phase['phase']} | {got:.2f} GiB | {est:.2f} GiB | "
              f"{(est - got) / got:+.1%} | {phase['seconds']:.0f} s (at {total:.0f} s) |")


if __name__ == "__main__":
    main()
