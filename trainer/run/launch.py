"""More than one process: start the run with torchrun, and read rank 0's events back.

:func:`run_launched` has the signature of ``trainer.run.loop.run`` (config, sink, control) and is
what the CLI and the GUI's runner call when ``training.num_processes > 1`` (or with more than
one machine). It writes the config to a temporary folder and starts::

    python -m torch.distributed.run --nproc-per-node N [--nnodes M --node-rank R
        --master-addr IP --master-port PORT] -m trainer.run.launch CONFIG.toml FOLDER

Every process then runs ``trainer.run.loop.run`` (trainer/system/distributed.py says how they
share the work). Rank 0 writes its events as JSON lines to ``FOLDER/events.jsonl`` and its
process id to ``FOLDER/rank0.pid``; :func:`run_launched` follows that file and hands the events
to the sink, so a caller cannot tell the difference from a run in-process. Stop is SIGINT to
rank 0, which turns it into a stop request: every process stops at the same step boundary and
rank 0 saves. A launch that fails without rank 0's Finished event ends as failed with the tail
of its output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainer.events import Control, Event, EventSink, Finished, NullSink, safe_emit
from trainer.run.launch_failures import failure_text
from trainer.system import parent_death

EVENTS = "events.jsonl"
PID = "rank0.pid"
OUTPUT = "launch.log"
STOPPED_EARLY = 3  # rank 0 stopped before the first step: torchrun must end the other ranks


@dataclass(frozen=True)
class LaunchOptions:
    """Where the processes run: torchrun's rendezvous (the names are accelerate launch's)."""

    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None

    def problems(self) -> list[str]:
        out = []
        if self.num_machines < 1 or not 0 <= self.machine_rank < self.num_machines:
            out.append(f"--machine-rank {self.machine_rank} must be in 0..--num-machines - 1 "
                       f"({self.num_machines - 1})")
        if self.num_machines > 1 and (not self.main_process_ip or not self.main_process_port):
            out.append("more than one machine needs --main-process-ip and --main-process-port "
                       "(the address of machine 0, the same on every machine)")
        return out


def needs_launch(cfg, options: Optional[LaunchOptions] = None) -> bool:
    """True when the run takes more than one process (here or on other machines)."""
    return cfg.training.num_processes > 1 or (options is not None and options.num_machines > 1)


# -- events as JSON lines ---------------------------------------------------------------------
EVENT_TYPES = {cls.__name__: cls for cls in typing.get_args(Event)}


def to_json(event: Event) -> str:
    return json.dumps({"event": type(event).__name__, **dataclasses.asdict(event)})


def from_json(line: str) -> Event:
    data = json.loads(line)
    cls = EVENT_TYPES[data.pop("event")]
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


class JsonLinesSink:
    """Rank 0's sink: one JSON object per line, flushed at once for the reader to follow."""

    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the run

    def emit(self, event: Event) -> None:
        self._file.write(to_json(event) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _Follower:
    """Reads the complete lines appended to the events file since the last call."""

    def __init__(self, path: Path):
        self.path, self._offset, self._rest = path, 0, ""

    def new_events(self) -> list[Event]:
        if not self.path.is_file():
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self._offset)
            text = f.read()
            self._offset = f.tell()
        lines = (self._rest + text).split("\n")
        self._rest = lines.pop()
        return [from_json(line) for line in lines if line.strip()]


# -- the launcher side ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(config: Path, folder: Path, nproc: int,
                     options: LaunchOptions) -> list[str]:
    """The command line that starts this machine's processes. One machine with no address
    given: torchrun's standalone rendezvous, whose store binds a free port itself (a port
    picked here and bound later by torchrun could be taken by another launch meanwhile)."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if options.num_machines == 1 and not options.main_process_ip \
            and not options.main_process_port:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [f"--nnodes={options.num_machines}", f"--node-rank={options.machine_rank}",
                      f"--master-addr={options.main_process_ip or '127.0.0.1'}",
                      f"--master-port={options.main_process_port or free_port()}"]
    return [*run, *rendezvous, "-m", "trainer.run.launch", str(config), str(folder)]


def _environment(nproc: int) -> dict[str, str]:
    from trainer.config.paths import PROJECT_ROOT

    # a rank killed by a fatal signal (SIGSEGV, SIGABRT) prints its Python stack to the output
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT),
                                                    env.get("PYTHONPATH")) if p)
    # torch would pick 1 thread per process; share the cores (a CPU run trains on them)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def run_launched(cfg, sink: Optional[EventSink] = None, control: Optional[Control] = None,
                 options: Optional[LaunchOptions] = None, poll: float = 0.2) -> Finished:
    """Train ``cfg`` with ``cfg.training.num_processes`` processes on this machine; events and
    Stop as ``trainer.run.loop.run``. Never raises for a training error: it ends in Finished."""
    from trainer.config import files as config_io

    sink, control = sink or NullSink(), control or Control()
    options = options or LaunchOptions()
    problems = options.problems()
    if problems:
        return _finish(sink, Finished("failed", 0, error="; ".join(problems)))
    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as tmp:
        folder = Path(tmp)
        config_io.save(cfg, folder / "config.toml")
        nproc = cfg.training.num_processes
        with open(folder / OUTPUT, "wb") as output:
            proc = subprocess.Popen(
                torchrun_command(folder / "config.toml", folder, nproc, options),
                stdout=output, stderr=subprocess.STDOUT, env=_environment(nproc),
                start_new_session=True,  # a terminal's Ctrl-C reaches us, not torchrun
                preexec_fn=parent_death.preexec(signal.SIGTERM))  # we die: torchrun stops
            try:
                finished = _follow(proc, folder, sink, control, poll)
            finally:
                _end(proc)
        if finished is None:
            finished = _without_rank0(proc.returncode, folder / OUTPUT, control)
        elif finished.status == "failed":  # another rank may have failed first: say which
            finished = dataclasses.replace(
                finished, error=failure_text(finished.error, folder / OUTPUT))
        return _finish(sink, finished)


def _follow(proc: subprocess.Popen, folder: Path, sink: EventSink, control: Control,
            poll: float) -> Optional[Finished]:
    """Hand rank 0's events to the sink until the processes end; Stop becomes SIGINT to
    rank 0. Returns rank 0's Finished (not yet handed on), or None when it never came."""
    follower, signalled, finished = _Follower(folder / EVENTS), False, None
    while True:
        done = proc.poll() is not None
        for event in follower.new_events():
            if isinstance(event, Finished):  # handed on when the processes have ended
                finished = event
            else:
                safe_emit(sink, event)
        if done:
            return finished
        if control.stop_requested and not signalled:
            signalled = _signal_rank0(folder / PID)
        time.sleep(poll)


def _signal_rank0(pid_file: Path) -> bool:
    """SIGINT to rank 0 (it saves and stops at the next step); False while it has not started."""
    try:
        os.kill(int(pid_file.read_text(encoding="utf-8")), signal.SIGINT)
    except (OSError, ValueError):
        return False
    return True


def _end(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """Wait for the launch to end (ask, then force it, when the caller stopped waiting)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except (OSError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _without_rank0(returncode: int, output: Path, control: Control) -> Finished:
    """The end of a launch whose rank 0 said nothing (it crashed, or it runs elsewhere)."""
    if returncode == 0:
        return Finished("stopped" if control.stop_requested else "finished", 0)
    return Finished("failed", 0, error=failure_text(
        f"the training processes failed (exit status {returncode})", output))


def _finish(sink: EventSink, finished: Finished) -> Finished:
    safe_emit(sink, finished)
    return finished


# -- the command line ---------------------------------------------------------------------------
def add_launch_arguments(parser) -> None:
    """``train``'s flags for more than one process (names as in ``accelerate launch``)."""
    group = parser.add_argument_group("more than one process (DDP; see the README)")
    group.add_argument("--num-processes", type=int, metavar="N",
                       help="processes on this machine, one per GPU (sets "
                            "training.num_processes)")
    group.add_argument("--num-machines", type=int, default=1, metavar="M",
                       help="machines taking part; run the same command on each")
    group.add_argument("--machine-rank", type=int, default=0, metavar="R",
                       help="this machine's number, 0 .. M-1 (machine 0 writes the outputs)")
    group.add_argument("--main-process-ip", metavar="IP", help="machine 0's address")
    group.add_argument("--main-process-port", type=int, metavar="PORT",
                       help="a free port on machine 0 (the same on every machine)")


def run_from_cli(cfg, sink: EventSink, args) -> Finished:
    """One process in-process; more through torchrun, Ctrl-C being Stop (a second Ctrl-C
    ends the processes)."""
    options = LaunchOptions(args.num_machines, args.machine_rank, args.main_process_ip,
                            args.main_process_port)
    control = Control()
    if not needs_launch(cfg, options):
        from trainer.run.loop import run

        return run(cfg, sink, control)
    _stop_on_signals(control)
    return run_launched(cfg, sink, control, options)


# -- the worker side: one of the processes torchrun starts ------------------------------------
def worker(config: Path, folder: Path) -> int:
    """Run this process's part of the training; rank 0 reports to ``folder``."""
    import logging

    from trainer.config import files as config_io
    from trainer.run.loop import run
    from trainer.system.distributed import rank

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    control = Control()
    _stop_on_signals(control)
    parent_death.die_with_parent(signal.SIGTERM)  # torchrun killed: this rank stops too
    sink: EventSink = NullSink()
    if rank() == 0:
        sink = JsonLinesSink(folder / EVENTS)
        (folder / PID).write_text(str(os.getpid()), encoding="utf-8")
    try:
        result = run(config_io.load(config), sink, control)
    except BaseException as exc:  # past run's own net: still this rank's error line
        print(f"rank {rank()}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
    if result.status == "failed":
        print(f"rank {rank()}: error: {result.error}", file=sys.stderr, flush=True)
        return 1
    if result.step == 0 and result.status == "stopped":
        return STOPPED_EARLY
    _leave()
    return 0


def _stop_on_signals(control: Control) -> None:
    """SIGINT / SIGTERM: stop at the next step boundary (a second one interrupts at once)."""

    def handler(signum, frame):  # noqa: ARG001 - the signal module's signature
        control.request_stop()
        signal.signal(signum, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _leave() -> None:
    """Wait for the other processes (rank 0 may still be saving), then close the group."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def end_process(code: int) -> typing.NoReturn:
    """End this rank now, without Python's finalization: its output flushed, its exit code kept.

    A process group's gloo worker threads outlive ``destroy_process_group`` while anything still
    holds the group (after FSDP2, DTensor's redistribution planners keep its device mesh and the
    mesh keeps the group; ``gc.collect()`` frees neither), and such a thread may still be
    dropping the last reference to a finished collective's tensors. Done during finalization,
    that needs the GIL, which a finalizing interpreter no longer hands out: the thread is unwound
    and the process aborts ("terminate called without an active exception", SIGABRT) after a
    run that had finished and saved; about 1 rank in 15 did on the FSDP tests. An unfinalized
    exit has no such window. What a rank writes (files, events) is written and flushed before
    it gets here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to keep
            pass
    os._exit(code)


if __name__ == "__main__":
    end_process(worker(Path(sys.argv[1]), Path(sys.argv[2])))
