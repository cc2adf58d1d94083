"""What a failed launch says: the first rank's failure, from the launch's output (torchrun's
and the ranks' stderr, :data:`trainer.run.launch.OUTPUT`). A rank that fails takes the others
down with errors of the process group ("Connection closed by peer", "Connection reset by
peer"), which say nothing of the cause; a rank that crashes (a fatal signal, the out-of-memory
killer) writes no error line of its own, and torchrun's summary names it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

ROOT_CAUSE = "Root Cause (first observed failure):"  # torchrun's summary of a failed launch


def failure_text(error: str, output: Path) -> str:
    """A failed launch's error: the first rank's own first error, named as such, then what
    the others said and ``error`` (rank 0's, or the launch's exit status). A rank that fails
    takes the others down with errors of the process group ("Connection closed by peer"),
    which say nothing of the cause."""
    try:
        text = output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        text = []
    found = _first_failure(text)
    if found is None:
        return f"{error}: {chr(10).join(text[-12:]) or '(no output)'}"
    first, others = found
    lines = [first] + [f"then {line}" for line in others]
    if not any(error.splitlines()[0] in line for line in lines):
        lines.append(f"({error})")
    return "\n".join(lines)


def _first_failure(text: list[str]) -> Optional[tuple[str, list[str]]]:
    """``rank N failed first: ...``: a rank that torchrun's summary names as killed by a
    signal (not the SIGTERM torchrun sends the others) or as its "first observed failure", and
    that wrote no error line of its own (a crash, the out-of-memory killer: the others' errors
    are then the process group's reaction, and torchrun may observe one of those first); else
    the first rank's own error line. With the other ranks' error lines
    (``trainer.run.launch.worker``'s, in the order they were written). None when neither is
    there."""
    errors = [line for line in text if line.startswith("rank ") and ": error: " in line
              and line[5:].split(":")[0].isdigit()]
    said = {line[5:].split(":")[0] for line in errors}
    silent = [r for r in _summary([line.strip() for line in text]) if r["rank"] not in said]
    killed = [r for r in silent if r["exitcode"].startswith("-") and r["exitcode"] != "-15"]
    cause = (killed or [r for r in silent if r["root"]] or [None])[0]
    if cause is not None:
        why = cause.get("traceback", "")
        crash = _fatal_error(text)
        return (f"rank {cause['rank']} failed first: exit code {cause['exitcode']}"
                + (f" ({why})" if why and "N/A" not in why else "")
                + (f": {crash}" if crash else "")), errors
    if errors:
        rank, _, message = errors[0].partition(": error: ")
        return f"{rank} failed first: {message}", errors[1:]
    return None


def _summary(text: list[str]) -> list[dict[str, str]]:
    """torchrun's records of the ranks that failed (rank, exitcode, traceback; ``root``:
    "yes" for its first observed failure), from the summary it prints at the end."""
    if ROOT_CAUSE not in text:
        return []
    start = text.index("Failures:") if "Failures:" in text else text.index(ROOT_CAUSE)
    records: list[dict[str, str]] = []
    root = ""
    for line in text[start:]:
        root = "yes" if line == ROOT_CAUSE else root
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key == "rank":
            records.append({"rank": value.split()[0], "exitcode": "?", "root": root})
        elif sep and records and key == "exitcode":
            records[-1]["exitcode"] = value.split()[0]
        elif sep and records and key == "traceback":
            records[-1]["traceback"] = value.strip()
    return records


def _fatal_error(text: list[str]) -> str:
    """Python's own report of a fatal signal (faulthandler, on in every rank): the error and
    the innermost Python frame it was in, e.g. ``Fatal Python error: Aborted, in File ...``."""
    for i, line in enumerate(text):
        if line.startswith("Fatal Python error:"):
            frame = next((t.strip() for t in text[i + 1:i + 8] if t.strip().startswith("File ")),
                         "")
            return line.strip() + (f", in {frame}" if frame else "")
    return ""
