"""Orchestrate ``tcaudit verify``: make the patched copy, train both under the harness, compare."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tcaudit.config import Settings
from tcaudit.findings import FixClass

DEFAULT_TOLERANCE = 0.10


class VerifyError(Exception):
    pass


@dataclass
class RunMetrics:
    label: str
    status: str
    device: str
    cuda: bool
    torch: str
    world_size: int
    samples_per_s: float
    step_ms_p50: float
    step_ms_p90: float
    peak_memory_gib: float
    final_loss: float | None
    mean_loss: float | None
    step_times: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    warmup: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def summarize(label: str, ranks: list[dict]) -> RunMetrics:
    first = ranks[0]
    warmup = first["warmup"]
    timed_per_rank = [(r["step_times"][warmup:], r["samples"][warmup:]) for r in ranks]
    throughput = 0.0
    for times, samples in timed_per_rank:
        if times and sum(times) > 0:
            throughput += sum(samples) / sum(times)
    times0 = first["step_times"][warmup:]
    losses = [l for l in first["losses"][warmup:] if l is not None]
    return RunMetrics(
        label=label,
        status=first["status"],
        device=first["device"],
        cuda=first["cuda"],
        torch=first["torch"],
        world_size=first["world_size"],
        samples_per_s=throughput,
        step_ms_p50=_percentile(times0, 0.5) * 1000,
        step_ms_p90=_percentile(times0, 0.9) * 1000,
        peak_memory_gib=max(r["peak_memory_gib"] for r in ranks),
        final_loss=losses[-1] if losses else None,
        mean_loss=statistics.fmean(losses) if losses else None,
        step_times=first["step_times"],
        samples=first["samples"],
        losses=first["losses"],
        warmup=warmup,
    )


def loss_parity(original: RunMetrics, patched: RunMetrics, tolerance: float) -> tuple[bool, str]:
    """Same seed and data: the patched run's mean loss over the second half of the timed steps must be
    within ``tolerance`` (relative) of the original's, and every patched loss finite."""
    def tail(run: RunMetrics) -> list[float]:
        values = [l for l in run.losses[run.warmup:] if l is not None]
        return values[len(values) // 2:] or values

    a, b = tail(original), tail(patched)
    if not a or not b:
        return False, "no losses were recorded (the harness saw no backward call)"
    if not all(math.isfinite(x) for x in b):
        return False, "the patched run produced a non-finite loss"
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    rel = abs(mb - ma) / max(abs(ma), 1e-8)
    # The original run's own step-to-step spread: early training on a high learning rate is noisy,
    # and two runs whose augmentation streams differ (worker processes) wander within it.
    noise = 2 * statistics.stdev(a) / math.sqrt(len(a)) if len(a) > 1 else 0.0
    ok = rel <= tolerance or abs(mb - ma) <= noise
    verdict = "within" if ok else "NOT within"
    return ok, (f"mean loss over the last {len(b)} timed steps {mb:.4f} vs {ma:.4f}: {rel:.1%} apart, "
                f"{verdict} the {tolerance:.0%} tolerance or twice the original's standard error ({noise:.4f})")


def make_copies(script: Path, work: Path, settings: Settings, classes: frozenset[FixClass]):
    from tcaudit.fix.engine import fix_file

    original_dir, patched_dir = work / "original", work / "patched"
    for folder in (original_dir, patched_dir):
        folder.mkdir(parents=True, exist_ok=True)
    original_copy = original_dir / script.name
    shutil.copyfile(script, original_copy)
    result = fix_file(script, settings, classes)
    if result.error:
        raise VerifyError(f"{script}: {result.error}")
    patched_copy = patched_dir / script.name
    patched_copy.write_bytes(result.source.encode(result.fixed))
    (work / "patch.diff").write_text(result.diff())
    return original_copy, patched_copy, result


def _torchrun_ready(path: Path) -> bool:
    """Whether a script sets up torch.distributed itself (a process group or a DDP/FSDP wrap), so that
    torchrun's processes cooperate instead of each training alone on the same GPU."""
    from tcaudit.script.distributed import distributed_facts
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import SourceError, read_source

    try:
        facts = ScriptFacts(read_source(path))
    except SourceError:
        return False
    info = distributed_facts(facts)
    return bool(info.init_process_group_calls) or info.is_ddp_script


def launch_sizes(original: Path, patched: Path, nproc: int) -> tuple[int, int]:
    """Processes for the original and the patched run. ``--nproc K`` applies to a script that is
    distributed (already, or after ``--ddp``); a single-process original runs as one process, and then
    the patched script is also run on one process to measure its scaling."""
    if nproc == 1:
        return 1, 1
    original_ready, patched_ready = _torchrun_ready(original), _torchrun_ready(patched)
    if not patched_ready:
        raise VerifyError(
            f"--nproc {nproc} needs a script that runs under torchrun; this one is single-process: "
            "add --ddp to convert it (tcaudit fix --ddp shows the conversion)"
        )
    return (nproc if original_ready else 1), nproc


def harness_command(copy: Path, out: Path, steps: int, warmup: int, nproc: int, args: list[str]) -> list[str]:
    harness = ["-m", "tcaudit.verify.harness", "--steps", str(steps), "--warmup", str(warmup),
               "--out", str(out), str(copy), *args]
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *harness]
    return [sys.executable, *harness]


def run_one(label: str, command: list[str], cwd: Path, env: dict, out: Path, nproc: int, total: int,
            progress=None, timeout: float | None = None) -> list[dict]:
    log = out.with_suffix(".log")
    task = progress.add_task(f"{label:>8}", total=total) if progress is not None else None
    marker = out.with_suffix(".progress")
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        start = time.monotonic()
        while proc.poll() is None:
            if task is not None and marker.exists():
                try:
                    progress.update(task, completed=int(marker.read_text() or 0))
                except (OSError, ValueError):
                    pass
            if timeout is not None and time.monotonic() - start > timeout:
                proc.kill()
                raise VerifyError(f"{label} run exceeded {timeout:.0f}s; see {log}")
            time.sleep(0.2)
    if task is not None:
        progress.update(task, completed=total)
    files = [out] if nproc == 1 else sorted(out.parent.glob(f"{out.stem}.rank*.json"))
    if proc.returncode != 0 or not files or not all(f.exists() for f in files):
        tail = log.read_text(errors="replace")[-2000:]
        raise VerifyError(f"the {label} run failed (exit {proc.returncode}); last output:\n{tail}")
    return [json.loads(f.read_text()) for f in files]


@dataclass
class VerifyResult:
    original: RunMetrics
    patched: RunMetrics
    speedup: float
    parity: bool
    parity_detail: str
    tolerance: float
    applied: list[str]
    command: str
    out_dir: Path
    # With ``--nproc K`` and a script that becomes distributed (``--ddp``): the patched script on one
    # process too, so that scaling efficiency = samples/s on K / (K x samples/s on 1).
    patched_single: RunMetrics | None = None

    @property
    def scaling_efficiency(self) -> float | None:
        single = self.patched_single
        if single is None or not single.samples_per_s:
            return None
        return self.patched.samples_per_s / (self.patched.world_size * single.samples_per_s)

    @property
    def cpu_timings(self) -> bool:
        return not self.original.cuda

    def to_json(self) -> dict:
        return {
            "gpu": self.original.device if self.original.cuda else None,
            "device": self.original.device,
            "cpu_timings": self.cpu_timings,
            "torch": self.original.torch,
            "command": self.command,
            "speedup": self.speedup,
            "loss_parity": self.parity,
            "loss_parity_detail": self.parity_detail,
            "tolerance": self.tolerance,
            "fixes_applied": self.applied,
            "world_size": self.original.world_size,
            "original": self.original.to_dict(),
            "patched": self.patched.to_dict(),
            "scaling": None if self.patched_single is None else {
                "nproc": self.patched.world_size,
                "samples_per_s": self.patched.samples_per_s,
                "samples_per_s_one_process": self.patched_single.samples_per_s,
                "efficiency": self.scaling_efficiency,
                "patched_one_process": self.patched_single.to_dict(),
            },
        }


def verify(
    script: Path,
    args: list[str],
    settings: Settings,
    *,
    steps: int,
    warmup: int,
    nproc: int,
    out_dir: Path,
    classes: frozenset[FixClass],
    tolerance: float = DEFAULT_TOLERANCE,
    command: str = "",
    progress=None,
    timeout: float | None = None,
) -> VerifyResult:
    if not script.is_file():
        raise VerifyError(f"no such script: {script}")
    out_dir = out_dir.resolve()
    script = script.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "work"
    original_copy, patched_copy, fix = make_copies(script, work, settings, classes)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(script.resolve().parent), env.get("PYTHONPATH")]))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    original_nproc, patched_nproc = launch_sizes(original_copy, patched_copy, nproc)
    runs = [("original", original_copy, original_nproc), ("patched", patched_copy, patched_nproc)]
    if patched_nproc > 1 and original_nproc == 1:
        runs.insert(1, ("patched-1", patched_copy, 1))
    results = {}
    total = warmup + steps
    for label, copy, size in runs:
        out = out_dir / f"{label}.json"
        for stale in [out, *out_dir.glob(f"{label}.rank*.json")]:
            stale.unlink(missing_ok=True)
        cmd = harness_command(copy, out, steps, warmup, size, args)
        ranks = run_one(label, cmd, script.resolve().parent, env, out, size, total, progress, timeout)
        results[label] = summarize(label, ranks)
    original, patched = results["original"], results["patched"]
    speedup = patched.samples_per_s / original.samples_per_s if original.samples_per_s else float("nan")
    parity, detail = loss_parity(original, patched, tolerance)
    result = VerifyResult(original, patched, speedup, parity, detail, tolerance, fix.applied,
                          command or shlex.join(["tcaudit", "verify", str(script), "--", *args]), out_dir,
                          patched_single=results.get("patched-1"))
    (out_dir / "verify.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result
