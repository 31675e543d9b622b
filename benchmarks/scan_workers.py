"""CPU time of each process of one ``tcaudit scan --no-cache --no-exec --jobs 2 DIR``: the parent
and each forked worker (up to the end of its last file). On a machine others share, wall time
swings with their load; the CPU each process spends swings much less, and ``parent + slowest
worker`` is about what the wall time would be on two idle cores.

    PYTHONPATH=/path/to/checkout .venv/bin/python benchmarks/scan_workers.py DIR [LABEL]

Prints one JSON line. Works on 0.1.0's checkout too (it patches ``engine._scan_in_worker``, which
both have). CPU timings; no GPU is involved.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time


RECORDS = tempfile.mkdtemp(prefix="tcaudit-workers-")
_scan_in_worker = None


def timed_scan_in_worker(*args):
    """The engine's worker function, then this worker's CPU so far into RECORDS (module-level: the
    pool sends it by name)."""
    result = _scan_in_worker(*args)
    times = os.times()  # a forked child's times start at zero
    with open(os.path.join(RECORDS, str(os.getpid())), "w") as out:
        out.write(repr(times.user + times.system))
    return result


def main() -> None:
    global _scan_in_worker
    started = time.perf_counter()
    target = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else ""

    from tcaudit import engine

    _scan_in_worker = engine._scan_in_worker
    engine._scan_in_worker = timed_scan_in_worker  # forked workers see the patched module
    from tcaudit.cli.main import main as tcaudit

    with contextlib.redirect_stdout(io.StringIO()):
        tcaudit(["scan", "--no-cache", "--no-exec", "--jobs", "2", target])
    own = os.times()
    workers = sorted(float(open(os.path.join(RECORDS, name)).read()) for name in os.listdir(RECORDS))
    parent = own.user + own.system
    print(json.dumps({
        "label": label,
        "parent_cpu": round(parent, 3),
        "worker_cpu": [round(w, 3) for w in workers],
        "parent_plus_slowest_worker": round(parent + max(workers, default=0.0), 3),
        "total_cpu": round(parent + sum(workers), 3),
        "wall": round(time.perf_counter() - started, 3),
    }))


if __name__ == "__main__":
    main()
