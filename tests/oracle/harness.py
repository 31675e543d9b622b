"""Run original and patched training scripts under the oracle shim and read back what they computed."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ORACLE = Path(__file__).resolve().parent
REPO = ORACLE.parent.parent
SHIM = ORACLE / "shim"
PRINTED_LOSS = re.compile(r"loss\s+(-?[\d.]+(?:e-?\d+)?|nan|inf)")


@dataclass(frozen=True)
class ScriptRun:
    """One script to run: its text, its command-line arguments and the folder it runs in."""

    id: str
    text: str
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float = 240
    world_size: int = 1  # >1: run as that many ranks (RANK, WORLD_SIZE, MASTER_ADDR/PORT set)
    files: tuple[tuple[str, str], ...] = ()  # the project's other files beside the script: (relative path, text)
    path: tuple[str, ...] = ()  # folders (relative) put on sys.path after the script's, as an installed src/ layout


@dataclass
class RunResult:
    id: str
    rc: int
    seconds: float
    cpu_seconds: float
    stdout: str
    stderr: str
    losses: list[float] = field(default_factory=list)  # what backward() saw, in order, all processes
    processes: int = 0
    by_rank: dict = field(default_factory=dict)  # {rank: losses} for the processes that had a rank
    # With TCAUDIT_ORACLE_STEPS=1 (shim/sitecustomize.py): each optimizer step attempt, all processes in
    # the order of ``losses``, as [sum of the optimizer's parameters before it, after it, skipped].
    steps: list = field(default_factory=list)

    @property
    def printed(self) -> list[float]:
        return [float(x) for x in PRINTED_LOSS.findall(self.stdout)]

    @property
    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(x) for x in self.losses)

    def explain(self) -> str:
        return f"{self.id}: rc {self.rc}, {len(self.losses)} losses\n{self.stderr[-2500:]}"


def _losses(out: Path) -> tuple[list[float], int, dict, list]:
    records = [json.loads(p.read_text()) for p in out.glob("losses-*.json")]
    # Processes with a rank in rank order, then the others (one process in nearly every script).
    records.sort(key=lambda r: (r["rank"] is None, int(r["rank"]) if r["rank"] is not None else 0, r["pid"]))
    by_rank = {int(r["rank"]): r["losses"] for r in records if r["rank"] is not None}
    steps = [step for r in records for step in r.get("steps", [])]
    return [x for r in records for x in r["losses"]], len(records), by_rank, steps


def run_scripts(runs: list[ScriptRun], workdir: Path, mode: str = "cpu", seed: int = 0, parallel: int = 2, gpu: bool = False):
    """Run every script in a fresh folder of ``workdir`` (forked from one process), in CPU or
    CUDA-semantics mode; returns {id: RunResult}. ``gpu``: leave the GPUs visible (the runner
    imports torch but never initialises CUDA before it forks). A run that hit torch's gloo teardown
    abort (tests/helpers.py: GLOO_TEARDOWN_ABORT, upstream) is repeated once in a fresh folder."""
    from helpers import GLOO_TEARDOWN_ABORT

    results = _run_once(runs, workdir, mode, seed, parallel, gpu)
    again = [run for run in runs if results[run.id].rc and GLOO_TEARDOWN_ABORT in results[run.id].stderr]
    if again:
        results.update(_run_once(again, workdir / "again", mode, seed, parallel, gpu))
    return results


def _run_once(runs: list[ScriptRun], workdir: Path, mode: str, seed: int, parallel: int, gpu: bool):
    assert mode in ("cpu", "cuda")
    jobs = []
    for run in runs:
        folder = workdir / run.id
        folder.mkdir(parents=True)
        script = folder / "train.py"
        script.write_text(run.text, encoding="utf-8")
        for relative, text in run.files:
            extra = folder / relative
            extra.parent.mkdir(parents=True, exist_ok=True)
            extra.write_text(text, encoding="utf-8")
        jobs.append(
            {
                "id": run.id,
                "script": str(script),
                "argv": list(run.argv),
                "cwd": str(folder),
                "env": {"TCAUDIT_ORACLE_OUT": str(folder / "oracle"), **dict(run.env)},
                "stdout": str(folder / "stdout.txt"),
                "stderr": str(folder / "stderr.txt"),
                "timeout": run.timeout,
                "world_size": run.world_size,
                "path": list(run.path),
            }
        )
    (workdir / "jobs.json").write_text(json.dumps(jobs))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIM), str(REPO)]),
        "TCAUDIT_ORACLE_OUT": str(workdir / "runner"),
        "TCAUDIT_ORACLE_MODE": mode,
        "TCAUDIT_ORACLE_SEED": str(seed),
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "MASTER_ADDR": "127.0.0.1",
    }
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    subprocess.run(
        [sys.executable, str(ORACLE / "runner.py"), str(workdir / "jobs.json"), str(workdir / "results.json"), str(parallel)],
        env=env, cwd=workdir, check=True, timeout=sum(j["timeout"] for j in jobs) + 60,
    )
    status = json.loads((workdir / "results.json").read_text())
    results = {}
    for job in jobs:
        folder = Path(job["cwd"])
        losses, processes, by_rank, steps = _losses(folder / "oracle")
        stdout, stderr = (
            "".join(p.read_text(errors="replace") for p in sorted(folder.glob(f"{name}.txt*")))
            for name in ("stdout", "stderr")
        )
        results[job["id"]] = RunResult(
            id=job["id"],
            rc=status[job["id"]]["rc"],
            seconds=status[job["id"]]["seconds"],
            cpu_seconds=status[job["id"]].get("cpu_seconds", 0.0),
            stdout=stdout,
            stderr=stderr,
            losses=losses,
            processes=processes,
            by_rank=by_rank,
            steps=steps,
        )
    return results


def max_relative_difference(a: list[float], b: list[float]) -> float:
    """The largest |a-b| / max(|a|, |b|, 1e-12) over paired values (inf when lengths differ)."""
    if len(a) != len(b):
        return math.inf
    return max((abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)
