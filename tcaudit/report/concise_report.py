"""``path:line:col: CODE message``, one line per finding (ruff's concise format), in impact order
or, with ``--sort line``, line order (tcaudit/report/order.py).

Nothing else goes to this stream, so every line can be parsed the same way; the CLI sends notes
to stderr.
"""

from __future__ import annotations

from typing import TextIO

from tcaudit.report.order import ordered
from tcaudit.terminal import terminal_safe


def render(result, out: TextIO, *, rules, color: bool) -> None:
    for f in ordered(result.findings, rules, getattr(result, "sort", "impact")):
        loc = f.location
        out.write(f"{terminal_safe(loc.path, one_line=True)}:{loc.position}: {f.rule} {_one_line(f.message)}\n")


def _one_line(message: str) -> str:
    return terminal_safe(" ".join(message.split()), one_line=True)
