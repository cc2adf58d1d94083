"""The import report, and the context that the key handlers write into.

Every key of a kohya_ss JSON ends in exactly one list of :class:`ImportReport`: mapped (with its
new dotted key), left at our default (kohya's empty/0 "not set"), not supported (with the
reason), not needed here (with the reason) or unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.table import Noted, Refused, Rule


@dataclass
class ImportReport:
    source: str
    mode: str = "lora"
    mapped: list[tuple[str, Any, str, Any]] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unsupported: list[tuple[str, Any, str]] = field(default_factory=list)
    not_needed: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[tuple[str, Any]] = field(default_factory=list)
    same_as_default: set[str] = field(default_factory=set)  # mapped keys equal to our default

    def keys(self) -> set[str]:
        """Every kohya key the report accounts for (``additional_parameters --flag`` counts as
        ``additional_parameters``)."""
        out = {m[0] for m in self.mapped} | set(self.unset) | {u[0] for u in self.unsupported}
        out |= {n[0] for n in self.not_needed} | {u[0] for u in self.unknown}
        return {k.split(" ", 1)[0] for k in out}

    def lines(self) -> list[tuple[str, list[str]]]:
        """(heading, lines) of each non-empty part, the ones to read first first."""
        set_off = [k for k, v, _ in self.unsupported if is_off(v)]
        on = [(k, v, r) for k, v, r in self.unsupported if not is_off(v)]
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.not_needed:
            by_reason.setdefault(reason, []).append(key)
        parts = [
            ("Not supported (the value was not imported)",
             [f"{k} = {_short(v)}: {r}" for k, v, r in on]),
            ("Unknown keys (not imported)", [f"{k} = {_short(v)}" for k, v in self.unknown]),
            ("Notes", list(self.notes)),
            ("Imported", [f"{k} = {_short(v)} -> {t} = {_short(n)}"
                          for k, v, t, n in self.mapped if k not in self.same_as_default]),
            ("Imported, the same as the studio's default",
             [", ".join(sorted(self.same_as_default))] if self.same_as_default else []),
            ("Empty or off in the file, so the studio's default stands",
             [", ".join(sorted(set(self.unset) | set(set_off)))]
             if self.unset or set_off else []),
            ("Not needed here", [f"{', '.join(keys)}: {reason}"
                                 for reason, keys in by_reason.items()]),
        ]
        return [(head, body) for head, body in parts if body]

    def text(self) -> str:
        out = [f"Imported {self.source} as a {self.mode} config."]
        for head, body in self.lines():
            out += ["", f"{head}:"] + [f"  {line}" for line in body]
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"**Imported `{self.source}` as a {self.mode} config.**"]
        for head, body in self.lines():
            out += ["", f"**{head}:**"] + [f"- `{line}`" for line in body]
        return "\n".join(out)


def is_off(value: Any) -> bool:
    return c.is_empty(value) or value in (False, 0, "0", "False", "false", [], {})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Ctx:
    """What the handlers see: the raw file, the target mode, the config being built."""

    def __init__(self, data: dict[str, Any], mode: str, report: ImportReport,
                 paths: set[str], defaults: dict[str, Any]):
        self.data, self.mode, self.report, self.paths = data, mode, report, paths
        self.defaults = defaults  # dotted key -> the schema's default
        self.out: dict[str, Any] = {"mode": mode}
        self.problems: list[str] = []
        self.targets: dict[str, str] = {}  # dotted key -> kohya key, for error messages

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def num(self, key: str) -> float | None:
        try:
            return c.number(self.data.get(key))
        except ValueError as exc:
            self.problems.append(f"{key} = {self.data.get(key)!r}: {exc}")
            return None

    def set(self, key: str, target: str, value: Any, raw: Any = None) -> None:
        if target not in self.paths:
            self.refuse(key, f"needs {target}, which this version of the schema lacks")
            return
        section, _, name = target.rpartition(".")
        (self.out.setdefault(section, {}) if section else self.out)[name] = value
        self.targets[target] = key
        raw = self.data.get(key) if raw is None else raw
        self.report.mapped.append((key, raw, target, value))
        same = self.defaults.get(target, object()) == value
        if same and all(k != key or self.defaults.get(t) == v
                        for k, _, t, v in self.report.mapped):
            self.report.same_as_default.add(key)
        else:
            self.report.same_as_default.discard(key)

    def note(self, key: str, text: str) -> None:
        self.report.notes.append(f"{key}: {text}")

    def refuse(self, key: str, reason: str, raw: Any = None) -> None:
        raw = self.data.get(key) if raw is None else raw
        self.report.unsupported.append((key, raw, reason))

    def skip(self, key: str, reason: str) -> None:
        self.report.not_needed.append((key, reason))

    def unset(self, key: str) -> None:
        self.report.unset.append(key)

    def apply(self, key: str, rule: Rule, value: Any = None) -> None:
        """Convert ``value`` (the file's, by default) with ``rule`` and record the result."""
        value = self.data.get(key) if value is None else value
        if self.mode not in rule.modes:
            self.skip(key, f"not used in {self.mode} mode")
            return
        try:
            out = rule.convert(value)
        except ValueError as exc:
            self.problems.append(f"{key} = {value!r}: {exc}")
            return
        if isinstance(out, Refused):
            self.refuse(key, out.reason, value)
            return
        if isinstance(out, Noted):
            self.note(key, out.note)
            out = out.value
        if out is c.UNSET:
            self.unset(key)
        else:
            self.set(key, rule.target, out, value)
