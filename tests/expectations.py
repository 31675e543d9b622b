"""Expected findings written into fixtures as ``# expect: TC201 TC204`` comments on the flagged line."""

from __future__ import annotations

import re
from pathlib import Path

_EXPECT = re.compile(r"#\s*expect:\s*((?:TC\d{3}\s*)+)")


def expected_findings(path: Path, families: tuple[str, ...]) -> set[tuple[str, int]]:
    text = path.read_bytes().decode("utf-8", errors="replace")
    out = set()
    for number, line in enumerate(text.splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            for code in match.group(1).split():
                if code.startswith(families):
                    out.add((code, number))
    return out
