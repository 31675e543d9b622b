"""What a check reports: a rule id at a place, with a message and, where it has one, a fix."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected info, warning or error)") from None

    def __str__(self) -> str:
        return self.name.lower()


class FixClass(str, enum.Enum):
    SAFE = "safe"
    NUMERICS = "numerics"
    STRUCTURAL = "structural"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class Location:
    """1-based line and column, end inclusive of the last character's line, exclusive column."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True)
class Fix:
    """Where and how a finding would be fixed.

    ``available`` is False when the fix is declined; ``reason`` then says why. ``anchor`` records where
    the edit goes (line ranges and the kind of edit) so that the rewriter and the reports agree.
    """

    fix_class: FixClass
    description: str
    available: bool = True
    reason: str | None = None
    anchor: dict[str, Any] = field(default_factory=dict)
    # A structural fix runs only when asked for by name: ``ddp``, ``dali`` or ``compile``
    # (``tcaudit fix --ddp``, or ``structural-fixes = ["ddp"]`` in the config).
    option: str | None = None

    @property
    def applies_by_default(self) -> bool:
        """Whether plain ``tcaudit fix`` applies it: available, and not a structural opt-in."""
        return self.available and self.fix_class is not FixClass.STRUCTURAL

    def enabled(self, classes: "frozenset[FixClass]", options: "frozenset[str] | tuple[str, ...]") -> bool:
        """Whether a fix run with these classes and structural options applies this fix."""
        if self.fix_class is FixClass.STRUCTURAL:
            return self.option is not None and self.option in options
        return self.fix_class in classes

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "class": str(self.fix_class),
            "description": self.description,
            "available": self.available,
        }
        if self.reason:
            data["reason"] = self.reason
        if self.option:
            data["option"] = self.option
        if self.anchor:
            data["anchor"] = dict(self.anchor)
        return data


@dataclass
class Finding:
    rule: str
    name: str
    severity: Severity
    location: Location
    message: str
    fix: Fix | None = None
    # Model findings carry module path, shapes, FLOP share and estimated time lost here.
    details: dict[str, Any] = field(default_factory=dict)
    # Text of the first flagged line and the enclosing def, used for baseline fingerprints.
    source_line: str = ""
    scope: str = ""
    fingerprint: str = ""

    @property
    def sort_key(self) -> tuple:
        loc = self.location
        return (loc.path, loc.line, loc.column, self.rule, self.message)

    def to_dict(self) -> dict[str, Any]:
        loc = self.location
        data: dict[str, Any] = {
            "rule": self.rule,
            "name": self.name,
            "severity": str(self.severity),
            "path": loc.path,
            "line": loc.line,
            "column": loc.column,
            "end_line": loc.end_line,
            "end_column": loc.end_column,
            "message": self.message,
            "fix": self.fix.to_dict() if self.fix else None,
            "fingerprint": self.fingerprint,
        }
        if self.details:
            data["details"] = self.details
        return data


def _path_key(path: str, root: "Path | None") -> str:
    """The path as seen from the project root, so a baseline works from any working directory."""
    if root is None:
        return path
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return path


def assign_fingerprints(findings: list[Finding], root: "Path | None" = None) -> None:
    """Give each finding a fingerprint that survives unrelated line shifts.

    The fingerprint hashes the rule, the file, the enclosing scope and the flagged line's text
    (whitespace-normalised), plus the occurrence index among findings sharing those, so that an
    edit above a finding does not change it, while a second identical finding stays distinct.
    """
    seen: dict[str, int] = {}
    for finding in sorted(findings, key=lambda f: f.sort_key):
        text = " ".join(finding.source_line.split())
        base = "\x1f".join((finding.rule, _path_key(finding.location.path, root), finding.scope, text))
        index = seen.get(base, 0)
        seen[base] = index + 1
        digest = hashlib.sha256(f"{base}\x1f{index}".encode("utf-8")).hexdigest()
        finding.fingerprint = digest[:20]
