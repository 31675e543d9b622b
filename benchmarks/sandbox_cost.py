"""What the model-build sandbox costs: the audit process's start and one model's build, per level.

For each isolation level this machine offers (the audit hook alone; user and network namespaces;
user, network, PID, mount, IPC and UTS namespaces; those with the read-only file system view, made by
the audit process inside unshare's namespaces or by bubblewrap) it starts the audit process (the zygote that
imports torch once) and audits the same small model several times, and reports the median start
time and the median time per model build. CPU only; the levels differ only in how the process is
started, so the figures say what the namespaces add.

    python benchmarks/sandbox_cost.py --out benchmarks/results/sandbox_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tcaudit.model import sandbox  # noqa: E402

MODEL = """
import torch.nn as nn

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
"""


def _jobs(folder: Path) -> list[dict]:
    from tcaudit.config import Settings
    from tcaudit.engine import read_source
    from tcaudit.model import collect_jobs, ModelAuditResult
    from tcaudit.model.sandbox import Limits

    path = folder / "train.py"
    path.write_text(MODEL)
    jobs, _, _ = collect_jobs([read_source(path, "train.py")], Settings(), "bf16", Limits(), ModelAuditResult())
    return jobs


def measure(isolation: tuple[str, str, tuple[str, ...]], jobs: list[dict], builds: int) -> dict:
    level = isolation[0]
    sandbox._isolation.cache_clear()
    original = sandbox._isolation
    sandbox._isolation = lambda: isolation  # type: ignore[assignment]
    try:
        starts, times = [], []
        for _ in range(3):
            begun = time.perf_counter()
            zygote = sandbox.Zygote([])
            starts.append(time.perf_counter() - begun)
            for _ in range(builds):
                begun = time.perf_counter()
                facts = zygote.run(jobs[0], sandbox.Limits())
                times.append(time.perf_counter() - begun)
                assert facts.status == "ok", facts.reason
            zygote.close()
        return {"level": level, "start_s": round(statistics.median(starts), 3),
                "build_s": round(statistics.median(times), 4), "builds": len(times)}
    finally:
        sandbox._isolation = original  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--builds", type=int, default=5)
    args = parser.parse_args()
    levels = [(sandbox.HOOK_LEVEL, "", ()), *reversed(sandbox._LEVELS)]
    with tempfile.TemporaryDirectory() as folder:
        jobs = _jobs(Path(folder))
        rows = []
        for level, tool, flags in levels:
            if tool and not sandbox._probe(level, tool, flags):
                rows.append({"level": level, "available": False})
                continue
            rows.append(measure((level, tool, flags), jobs, args.builds))
            print(json.dumps(rows[-1]), flush=True)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs (CPU numbers)", "python": platform.python_version(),
              "command": "python " + " ".join(sys.argv), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
