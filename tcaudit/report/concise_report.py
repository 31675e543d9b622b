"""``path:line:col: CODE message``, one line per finding (ruff's concise format).

Nothing else goes to this stream, so every line can be parsed the same way; the CLI sends notes
to stderr.
"""

from __future__ import annotations

from typing import TextIO


def render(result, out: TextIO, *, rules, color: bool) -> None:
    for f in result.findings:
        loc = f.location
        out.write(f"{loc.path}:{loc.line}:{loc.column}: {f.rule} {_one_line(f.message)}\n")


def _one_line(message: str) -> str:
    return " ".join(message.split())
