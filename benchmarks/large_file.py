"""In-process CPU time of ``scan`` and ``fix`` on one generated file of training-step functions, at
several sizes, to check that both grow linearly with the file (issue 49: 100k lines within 1.5x of 10x
the 10k-line time). No model audit, no cache, no process start-up: only the analysis and the fix.

    PYTHONPATH=. .venv/bin/python benchmarks/large_file.py --lines 10000,100000

CPU only (``time.process_time`` of this process); writes ``benchmarks/results/large_file.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scan_speed import training_steps_file  # noqa: E402 - the same generated file as scan_speed.py's

RESULTS = Path(__file__).resolve().parent / "results" / "large_file.json"


def measure(path: Path) -> dict[str, float]:
    from tcaudit.config import Settings
    from tcaudit.engine import _scan_one
    from tcaudit.fix.engine import fix_file
    from tcaudit.rules.registry import lazy_rules

    settings = Settings(exec_models=False)
    started = time.process_time()
    scanned = _scan_one(path, path.name, None, lazy_rules(settings), settings, True, None)
    scan_s = time.process_time() - started
    started = time.process_time()
    fixed = fix_file(path, settings)
    fix_s = time.process_time() - started
    return {"scan_cpu_s": round(scan_s, 2), "fix_cpu_s": round(fix_s, 2), "findings": len(scanned.findings),
            "fixed": fixed.applied}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", default="10000,100000", help="sizes, comma-separated (default 10000,100000)")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.lines.split(","))
    out: dict = {"benchmark": "large_file", "timings": "CPU only (process_time), in-process, no model audit",
                 "date": time.strftime("%Y-%m-%d"), "loadavg_1m_before": round(os.getloadavg()[0], 2), "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="tcaudit-large-") as tmp:
        for lines in sizes:
            # A fresh interpreter per size would be fairer to the larger one; one process keeps it simple
            # and the smaller size runs first, so imports are paid there.
            out["sizes"][str(lines)] = measure(training_steps_file(Path(tmp), lines))
            print(lines, out["sizes"][str(lines)], file=sys.stderr, flush=True)
    small, large = str(sizes[0]), str(sizes[-1])
    for key in ("scan_cpu_s", "fix_cpu_s"):
        out[f"{key}_ratio"] = round(out["sizes"][large][key] / max(out["sizes"][small][key], 1e-9), 2)
    out["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
