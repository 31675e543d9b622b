"""What the fix engine's guards cost: `fix_file` over every fix fixture (CPU, one process).

The engine checks each kept edit for statements after a `return`, names used before their import and
the situations other rules' declines protect; this times the whole fix of each fixture so the cost of
those checks can be compared with a run of the same script on a commit without them.

    PYTHONPATH=$PWD python benchmarks/fix_guards.py            # best of 3, total seconds
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from test_fix import PAIRS, _settings_for  # noqa: E402
from tcaudit.fix.engine import fix_file  # noqa: E402


def main(repeats: int = 3) -> None:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for path in PAIRS:
            fix_file(path, _settings_for(path))
        best = min(best, time.perf_counter() - start)
    print(f"{len(PAIRS)} fixtures fixed in {best:.2f} s (best of {repeats})")


if __name__ == "__main__":
    main()
