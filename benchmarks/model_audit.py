"""Model audit benchmark (CPU, fake tensors): audit time and peak RSS per model.

    .venv/bin/python benchmarks/model_audit.py [--repeat 5] [--out benchmarks/results/model_audit.json]

For each model a fresh process starts the audit child (``import torch`` plus a one-off warm-up of
``torch.export`` and the fx fast path: what every scan that audits a model pays once), then audits
the model ``--repeat`` times. Reported per model: the audit time beyond that start (median wall time
of a whole audit as the scanner sees it: fork, slice, build on fake tensors, capture, normalise,
result back), how the graph was captured (``fx`` fast path, else ``export``/``dynamo``, and why the
fast path was not taken), the child's own CPU time and phases, its peak RSS (including the ~0.7 GiB
that importing torch maps), and one end-to-end ``tcaudit scan FILE --select TC1`` in a fresh
interpreter. Results go to JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {
    "resnet50": REPO / "fixtures" / "resnet50" / "train.py",
    "gpt2-xl": REPO / "benchmarks" / "model_audit_gpt2_xl.py",
    "llama-7b": REPO / "benchmarks" / "model_audit_llama_7b.py",
}


def one(name: str, path: Path, repeat: int) -> dict:
    """Runs in its own process: start the audit child, then audit one model ``repeat`` times."""
    from tcaudit.config import Settings
    from tcaudit.engine import report
    from tcaudit.model import ModelAuditResult, discover_file
    from tcaudit.rules.registry import discover_model_rules
    from tcaudit.model.sandbox import Limits, Sandbox, Zygote
    from tcaudit.source.parsing import read_source

    started = time.perf_counter()
    source = read_source(path)
    targets = discover_file(source)
    discovery_s = time.perf_counter() - started
    [(target, failure, imports)] = targets
    assert failure is None, failure
    sandbox = Sandbox()
    started = time.perf_counter()
    sandbox.zygote = Zygote(sorted(imports & {"torchvision"}))
    startup_s = time.perf_counter() - started
    job = {"target": target, "precision": "bfloat16", "limits": {"time_limit": 600}}
    walls, facts_list = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        [facts] = sandbox.run([job], Limits(time_limit=600.0), [])
        walls.append(time.perf_counter() - started)
        assert facts.status == "ok", facts.reason
        facts_list.append(facts)
    sandbox.close()
    facts = facts_list[-1]
    result = ModelAuditResult()
    settings = Settings(select=("TC1",), root=path.parent)
    rules = [cls() for _, cls in sorted(discover_model_rules().items())]
    report([facts], rules, settings, [source], result)

    def median_of(key: str) -> float:
        return round(statistics.median(f.timings.get(key, 0.0) for f in facts_list), 3)

    return {
        "model": name,
        "script": str(path.relative_to(REPO)),
        "params": facts.param_count,
        "forward_gflop": round(facts.total_flops / 1e9, 1),
        "input": facts.input.get("shapes"),
        "capture": facts.capture.method,
        "fast_path_not_taken": facts.capture.fast_path,
        "graph_ops": len(facts.ops),
        "discovery_s": round(discovery_s, 3),
        "startup_s": round(startup_s, 2),
        "audit_s": round(statistics.median(walls), 3),
        "audit_s_all": [round(w, 3) for w in walls],
        "child_cpu_s": median_of("cpu_s"),
        "child_build_s": median_of("build_s"),
        "child_capture_s": median_of("capture_s"),
        "child_normalise_s": median_of("normalise_s"),
        "peak_rss_mib": max(f.timings.get("peak_rss_mib", 0.0) for f in facts_list),
        "findings": sorted(f"{f.rule}:{f.location.line}:{f.severity}" for f in result.findings),
    }


def end_to_end(path: Path) -> dict:
    """One cold ``tcaudit scan FILE --select TC1`` and the peak RSS of every process it started."""
    code = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run([sys.executable, '-m', 'tcaudit', 'scan', sys.argv[1], '--select', 'TC1', "
        "'--isolated', '--format', 'json'], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'wall_s': round(wall, 2), 'max_rss_mib': round(rss, 1), 'exit': p.returncode}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout)


def torch_import_s() -> float:
    out = subprocess.run(
        [sys.executable, "-c", "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"],
        capture_output=True, text=True, check=True,
    )
    return round(float(out.stdout), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "model_audit.json"))
    parser.add_argument("--only", choices=sorted(MODELS), action="append")
    parser.add_argument("--one", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.repeat)))
        return 0
    rows = []
    for name in args.only or list(MODELS):
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name, str(MODELS[name]), "--repeat", str(args.repeat)],
            capture_output=True, text=True, cwd=REPO,
        )
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["end_to_end"] = end_to_end(MODELS[name])
        rows.append(row)
        print(json.dumps(row), flush=True)
    import torch  # noqa: F401 - only for the version in the results (the benchmark's own process)

    data = {
        "command": f"{Path(sys.executable).name} benchmarks/model_audit.py --repeat {args.repeat}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu": _cpu_name(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        },
        "torch_import_s": torch_import_s(),
        "models": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
