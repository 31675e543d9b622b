"""What the fixes' edits cost ``api.scan`` (issue 50, CPU): a scan without edits, the default scan (edits
made lazily, on first read), reading one finding's edits and every finding's edits after it, and a scan
that makes every edit during the scan (``edits=True``), on the 2,006-line file of training steps
(``large_file.py``'s: a TC202 finding with a fix in each of its 155 functions) and on the 2,018-line
ResNet50 file of ``fix_speed.py``.

    PYTHONPATH=. .venv/bin/python benchmarks/api_edits.py [--repeat 3] [--out benchmarks/results/api_edits.json]

In-process wall time (``time.perf_counter``), the best of ``--repeat`` runs after one warm-up scan (the
rules' imports); the edits of a lazy scan are read from a fresh scan each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def best(repeat: int, run) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(path: Path, repeat: int) -> dict:
    from tcaudit import api

    text = path.read_text(encoding="utf-8")
    settings = api.load([], isolated=True, exec_models=False)

    def scan(edits):
        return api.scan(text=text, filename=path.name, settings=settings, edits=edits)

    scan(False)  # imports
    fixable = [f for f in scan("lazy") if f.fix is not None and f.fix.available and f.fix.plan is not None]

    def read_one():
        found = [f for f in scan("lazy") if f.fix is not None and f.fix.available and f.fix.plan is not None]
        started = time.perf_counter()
        found[len(found) // 2].fix.edits
        return time.perf_counter() - started

    def read_all():
        found = [f for f in scan("lazy") if f.fix is not None and f.fix.available and f.fix.plan is not None]
        started = time.perf_counter()
        for finding in found:
            finding.fix.edits
        return time.perf_counter() - started

    no_edits = best(repeat, lambda: scan(False))
    lazy = best(repeat, lambda: scan("lazy"))
    one = min(read_one() for _ in range(repeat))
    every = min(read_all() for _ in range(repeat))
    eager = best(1 if len(fixable) > 50 else repeat, lambda: scan(True))
    return {
        "lines": text.count("\n"),
        "fixable_findings": len(fixable),
        "scan_no_edits_s": round(no_edits, 3),
        "scan_default_lazy_s": round(lazy, 3),
        "lazy_over_no_edits": round(lazy / no_edits, 2),
        "read_one_finding_edits_s": round(one, 3),
        "read_every_finding_edits_s": round(every, 3),
        "scan_edits_true_s": round(eager, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "api_edits.json"))
    args = parser.parse_args()
    import fix_speed
    from scan_speed import training_steps_file

    rows = {}
    with tempfile.TemporaryDirectory(prefix="tcaudit-api-edits-") as tmp:
        steps = training_steps_file(Path(tmp), 2000)
        (Path(tmp) / "big").mkdir()
        big = fix_speed.two_thousand_line_file(Path(tmp) / "big")
        for name, path in (("training steps, 2k lines", steps), ("resnet50 + helpers, 2k lines", big)):
            rows[name] = measure(path, args.repeat)
            print(name, rows[name], file=sys.stderr, flush=True)
    result = {
        "command": "benchmarks/api_edits.py " + " ".join(sys.argv[1:]),
        "timings": "CPU only: in-process wall time, best of --repeat",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "load_average_at_end": os.getloadavg(),
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
