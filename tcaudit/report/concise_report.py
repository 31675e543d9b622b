"""``path:line:col: CODE message``, one line per finding (ruff's concise format)."""

from __future__ import annotations

from typing import TextIO


def render(result, out: TextIO, *, rules, color: bool) -> None:
    for f in result.findings:
        loc = f.location
        out.write(f"{loc.path}:{loc.line}:{loc.column}: {f.rule} [{f.severity}] {f.message}\n")
    for note in result.notes:
        out.write(f"note: {note}\n")
