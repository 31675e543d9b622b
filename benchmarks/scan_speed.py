"""Scan speed: ``tcaudit scan`` against TorchFix 0.7 on torchvision's installed package.

    .venv/bin/python benchmarks/scan_speed.py [--repeat 3] [--torchfix PATH] [--target DIR]

Each run is a fresh process (cold: nothing cached, the interpreter and LibCST imported each
time), timed from outside, so the ``import torchvision`` that locates the target is not counted.
The tools take turns, round by round, so that other work on the machine slows them alike; the
1-minute load average before and after is recorded with the results.
tcaudit runs ``scan --no-exec --format concise --isolated`` with every rule; TorchFix runs
``torchfix --select ALL`` with its default job count (one per core). Prints a table and writes
``benchmarks/results/scan_speed.json``. TorchFix is skipped, with a message, when it is not found.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "scan_speed.json"


def locate_torchvision() -> Path:
    """torchvision's package folder, found in a child process so this one never imports torch."""
    proc = subprocess.run(
        [sys.executable, "-c", "import pathlib, torchvision; print(pathlib.Path(torchvision.__file__).parent)"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"torchvision is not importable here ({proc.stderr.strip().splitlines()[-1:]}); pass --target DIR")
    return Path(proc.stdout.strip())


def version_of(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def find_torchfix(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    beside = Path(sys.executable).with_name("torchfix")
    return str(beside) if beside.is_file() else shutil.which("torchfix")


def tool_version(command: list[str]) -> str:
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True)
    return (proc.stdout or proc.stderr).strip().splitlines()[-1] if proc.returncode == 0 else "unknown"


def time_once(command: list[str], cwd: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "exit_code": proc.returncode,
        "output_lines": len(proc.stdout.splitlines()),
        "stderr_tail": proc.stderr.strip().splitlines()[-3:],
    }


def summarize(command: list[str], runs: list[dict]) -> dict:
    return {
        "command": " ".join(command),
        "runs": runs,
        "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
        "output_lines": runs[-1]["output_lines"],
        "exit_codes": sorted({r["exit_code"] for r in runs}),
    }


def measure(commands: dict[str, list[str]], cwd: Path, repeat: int) -> dict[str, dict]:
    """Run the tools in turn, ``repeat`` rounds, so that background load hits them alike."""
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for index in range(repeat):
        for name, command in commands.items():
            run = time_once(command, cwd)
            runs[name].append(run)
            print(f"  {name} run {index + 1}/{repeat}: {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} s CPU, "
                  f"exit {run['exit_code']}, {run['output_lines']} output lines", file=sys.stderr)
    return {name: summarize(commands[name], runs[name]) for name in commands}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool; the median is reported (default 3)")
    parser.add_argument("--torchfix", metavar="PATH", help="the torchfix executable (default: beside python, or PATH)")
    parser.add_argument("--target", metavar="DIR", help="folder to scan (default: torchvision's installed package)")
    parser.add_argument("--output", metavar="FILE", default=str(RESULTS), help="where to write the JSON results")
    args = parser.parse_args()

    target = Path(args.target).resolve() if args.target else locate_torchvision()
    files = sorted(target.rglob("*.py"))
    lines = sum(len(f.read_bytes().splitlines()) for f in files)
    print(f"target: {target} ({len(files)} .py files, {lines} lines)", file=sys.stderr)

    load_before = os.getloadavg()
    commands = {
        "tcaudit": [sys.executable, "-m", "tcaudit", "scan", str(target), "--no-exec", "--format", "concise",
                    "--isolated"],
    }
    versions = {"tcaudit": version_of("tcaudit")}
    torchfix = find_torchfix(args.torchfix)
    if torchfix is None:
        print("TorchFix skipped: no torchfix executable found (pip install 'torchfix==0.7.*' into its own "
              "virtualenv, since it pins an older LibCST, and pass --torchfix PATH)", file=sys.stderr)
    else:
        commands["torchfix"] = [torchfix, "--select", "ALL", str(target)]
        versions["torchfix"] = tool_version([torchfix])
    measured = measure(commands, REPO, args.repeat)
    tools = {name: {"version": versions[name], **data} for name, data in measured.items()}
    if any(code not in (0, 1) for code in tools["tcaudit"]["exit_codes"]):
        tail = tools["tcaudit"]["runs"][-1]["stderr_tail"]
        print(f"warning: tcaudit exited {tools['tcaudit']['exit_codes']}: {tail}", file=sys.stderr)

    results = {
        "benchmark": "scan_speed",
        "date": time.strftime("%Y-%m-%d"),
        "target": {"path": str(target), "package": "torchvision", "version": version_of("torchvision"),
                   "files": len(files), "lines": lines},
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            # Other work on the machine skews wall times; the 1-minute load average shows how much.
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "python": platform.python_version(),
        "libcst": version_of("libcst"),
        "repeat": args.repeat,
        "command": " ".join([Path(sys.executable).name, "benchmarks/scan_speed.py", *sys.argv[1:]]),
        "tools": tools,
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    print(f"\nScan speed: {len(files)} files, {lines} lines, {os.cpu_count()} CPUs, "
          f"median of {args.repeat} cold runs\n")
    print("| tool | version | wall (s) | CPU (s) | files/s | output lines |")
    print("|---|---|---|---|---|---|")
    for name, data in tools.items():
        rate = len(files) / data["median_wall_s"] if data["median_wall_s"] else float("inf")
        print(f"| {name} | {data['version']} | {data['median_wall_s']:.2f} | {data['median_cpu_s']:.2f} | "
              f"{rate:.0f} | {data['output_lines']} |")
    if "torchfix" in tools:
        ratio = tools["torchfix"]["median_wall_s"] / tools["tcaudit"]["median_wall_s"]
        print(f"\ntcaudit is {ratio:.1f}x faster than TorchFix (wall clock)")
    print(f"\nwrote {output.relative_to(REPO) if output.is_relative_to(REPO) else output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
