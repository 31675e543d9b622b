"""CPU seconds of one in-process ``fix_file`` (no model audit, no cache) on the ResNet50 fixture and on
the 2,008-line file of ``fix_speed.py``, for the tcaudit on ``PYTHONPATH``: compare two checkouts by
running it for each, in turns, on the same machine.

    PYTHONPATH=<checkout> .venv/bin/python benchmarks/fix_in_process.py LABEL [--rounds 3]

Prints one line per round: the label, then CPU seconds for each target, then the analyses the fix
engine made (its ``_analyse`` calls).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("label")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import fix_speed
    import tcaudit.fix.engine as engine
    from tcaudit.config import Settings

    calls = {"n": 0}
    analyse = engine._analyse

    def counted(*a, **k):
        calls["n"] += 1
        return analyse(*a, **k)

    engine._analyse = counted
    fixture = HERE.parent / "fixtures" / "resnet50" / "train.py"
    with tempfile.TemporaryDirectory() as tmp:
        big = fix_speed.two_thousand_line_file(Path(tmp))
        engine.fix_file(fixture, Settings())  # imports and first-use caches
        for _ in range(args.rounds):
            cells = []
            for name, target in (("fixture", fixture), ("2k-line file", big)):
                calls["n"] = 0
                start = time.process_time()
                engine.fix_file(target, Settings())
                cells.append(f"{name} {time.process_time() - start:.2f} s CPU, {calls['n']} analyses")
            print(args.label, "|", " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
