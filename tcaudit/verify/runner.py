"""Orchestrate ``tcaudit verify``: make the patched copy, train both under the harness, compare."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
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
from tcaudit.progress import current as current_progress
from tcaudit.runtime_facts import text_digest
from tcaudit.verify.copies import audited_models, copy_bytes, copy_name
from tcaudit.verify.stats import METHOD, RatioInterval, mean_log, ratio_interval

DEFAULT_TOLERANCE = 0.10
# A patched run that waits for its next batch this share of the time or more is reported input-bound:
# past it, a faster step mostly lengthens the wait, and the input rules (TC401, TC405) matter most.
INPUT_BOUND_FRACTION = 0.20


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
    round: int = 0
    input_waits: list[float] = field(default_factory=list)
    # Share of the timed steps' wall time spent waiting for the next batch (see the harness).
    input_wait_fraction: float = float("nan")
    health: dict | None = None
    # CUDA graph replays in the timed steps (``mode="reduce-overhead"``); 0 without graphs and on a CPU.
    graph_replays: int = 0
    # Graphs Inductor declined to capture as CUDA graphs over the whole run (torch's counter).
    cudagraph_skips: int = 0
    # What the model's GEMMs ran in (fp8, bf16, fp16, tf32, fp32; the harness reads it at the first
    # forward) and the device's architecture (``sm_90``; None on a CPU).
    precision: str | None = None
    sm: str | None = None
    # Achieved model TFLOP/s (the model audit's training FLOPs per sample x samples/s) and its share of
    # the GPU's published dense peak for ``precision`` (MFU); None where either is unknown.
    tflops: float | None = None
    mfu: float | None = None
    peak_tflops: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def summarize(label: str, ranks: list[dict], round_index: int = 0) -> RunMetrics:
    from tcaudit.verify.health import run_health

    first = ranks[0]
    warmup = first["warmup"]
    timed_per_rank = [(r["step_times"][warmup:], r["samples"][warmup:]) for r in ranks]
    throughput = 0.0
    for times, samples in timed_per_rank:
        if times and sum(times) > 0:
            throughput += sum(samples) / sum(times)
    times0 = first["step_times"][warmup:]
    losses = [l for l in first["losses"][warmup:] if l is not None]
    waits = first.get("input_waits", [])
    timed_wait = sum(waits[warmup:])
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
        round=round_index,
        input_waits=waits,
        input_wait_fraction=timed_wait / sum(times0) if times0 and sum(times0) > 0 else float("nan"),
        health=run_health(first["losses"], warmup, first["health"]) if "health" in first else None,
        graph_replays=sum(first.get("graph_replays", [])[warmup:]),
        cudagraph_skips=int(first.get("cudagraph_skips", 0)),
        precision=first.get("precision"),
        sm=first.get("sm"),
    )


# A training step's FLOPs are about three forwards (the backward computes the gradients of both the
# inputs and the weights of every GEMM and convolution): the convention MFU is quoted in (PaLM, torchtitan).
TRAINING_FLOPS_PER_FORWARD = 3.0


def training_flops_per_sample(models) -> float | None:
    """The model audit's training FLOPs per sample of the script's audited models (3x their forwards,
    summed: a GAN's two networks both train), or None where the audit measured none."""
    forward = sum(profile.flops_per_sample for profile in models.profiles) if models is not None else 0.0
    return TRAINING_FLOPS_PER_FORWARD * forward if forward > 0 else None


def with_utilisation(run: RunMetrics, flops_per_sample: float | None) -> RunMetrics:
    """``run`` with its achieved TFLOP/s and MFU: the FLOPs per sample x samples/s, over the published
    dense peak (tcaudit/data/gpus.toml) of the GPU it ran on for the precision it ran in. No MFU on a
    CPU, on a GPU gpus.toml does not list, or for a precision it keeps no peak for."""
    from tcaudit import gpus

    if flops_per_sample is None or not run.samples_per_s:
        return run
    run.tflops = flops_per_sample * run.samples_per_s / 1e12
    gpu = gpus.device_gpu(run.device, run.sm) if run.cuda and run.sm else None
    peak = gpu.peak(run.precision) if gpu is not None and run.precision else None
    if peak:
        run.peak_tflops = peak
        run.mfu = run.tflops / run.world_size / peak
    return run


def _tail(run: RunMetrics) -> list[float]:
    """The recorded losses of the second half of the timed steps."""
    values = [l for l in run.losses[run.warmup:] if l is not None]
    return values[len(values) // 2:] or values


def unusable(original: RunMetrics, patched: RunMetrics) -> str | None:
    """Why a round's losses cannot be compared at all (nothing recorded, a non-finite patched loss)."""
    if not _tail(original) or not _tail(patched):
        return "no losses were recorded (the harness saw no backward call)"
    if not all(math.isfinite(x) for x in _tail(patched)):
        return "the patched run produced a non-finite loss"
    return None


def loss_parity(original: RunMetrics, patched: RunMetrics, tolerance: float) -> tuple[bool, str]:
    """Same seed and data: the patched run's mean loss over the second half of the timed steps must be
    within ``tolerance`` (relative) of the original's, and every patched loss finite."""
    reason = unusable(original, patched)
    if reason is not None:
        return False, reason
    a, b = _tail(original), _tail(patched)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    rel = abs(mb - ma) / max(abs(ma), 1e-8)
    # The original run's own step-to-step spread: early training on a high learning rate is noisy,
    # and two runs whose augmentation streams differ (worker processes) wander within it.
    noise = 2 * statistics.stdev(a) / math.sqrt(len(a)) if len(a) > 1 else 0.0
    ok = rel <= tolerance or abs(mb - ma) <= noise
    verdict = "within" if ok else "NOT within"
    return ok, (f"mean loss over the last {len(b)} timed steps {mb:.4f} vs {ma:.4f}: {rel:.1%} apart, "
                f"{verdict} the {tolerance:.0%} tolerance or twice the original's standard error ({noise:.4f})")


def rounds_parity(originals: list[RunMetrics], patcheds: list[RunMetrics], tolerance: float) -> tuple[bool, str]:
    """Loss parity over interleaved rounds, one check per (original, patched) pair of a round.

    Every patched loss of every round must be finite; beyond that, more than half of the rounds must be
    within tolerance. The first steps of training from scratch on a high learning rate are chaotic
    (a ResNet50 on random labels starts at 20-40 nats and wanders), and a patched run whose kernels
    differ (cudnn.benchmark, fp16) follows another path through them: one round in three outside the
    band is run-to-run spread, while a patch that mis-trains is outside in most rounds. With one or
    two rounds that cannot be told apart, so every round must pass there."""
    checks = [loss_parity(a, b, tolerance) for a, b in zip(originals, patcheds)]
    if len(checks) == 1:
        return checks[0]
    for index, (a, b) in enumerate(zip(originals, patcheds), 1):
        reason = unusable(a, b)
        if reason is not None:
            return False, f"round {index}: {reason}"
    failed = [(index, c) for index, c in enumerate(checks, 1) if not c[0]]
    if not failed:
        return loss_parity(median_run(originals), median_run(patcheds), tolerance)
    passed = len(checks) - len(failed)
    index, (_, first) = failed[0]
    if len(checks) >= 3 and passed * 2 > len(checks):
        return True, (f"{passed} of {len(checks)} rounds within; round {index} outside (run-to-run spread "
                      f"of early training; a patch that mis-trains is outside in most rounds): {first}")
    return False, f"{len(failed)} of {len(checks)} rounds outside: {first}"


def _write_copy(script: Path, copy: Path) -> None:
    from tcaudit.fix.textio import read_text

    source = read_text(script)
    copy.write_bytes(copy_bytes(source, source.text))


def make_copies(script: Path, work: Path, settings: Settings, classes: frozenset[FixClass],
                patched_file: Path | None = None, aa: bool = False, models=None):
    """The original's copy and the patched copy: ``tcaudit fix``'s patch, or ``patched_file`` as given,
    or (``aa``) the original again. Returns (original copy, patched copy, rules applied, patched text).
    A notebook's copies are the scripts its code cells make (:func:`copy_bytes`)."""
    from tcaudit.fix.engine import fix_file
    from tcaudit.source.notebook import is_notebook
    from tcaudit.source.parsing import SourceError

    original_dir, patched_dir = work / "original", work / "patched"
    for folder in (original_dir, patched_dir):
        folder.mkdir(parents=True, exist_ok=True)
    original_copy = original_dir / copy_name(script)
    patched_copy = patched_dir / copy_name(script)
    try:
        if is_notebook(script):
            _write_copy(script, original_copy)
        else:
            shutil.copyfile(script, original_copy)
        if aa or patched_file is not None:
            source = patched_file if patched_file is not None else script
            if is_notebook(source):
                _write_copy(source, patched_copy)
            else:
                shutil.copyfile(source, patched_copy)
    except SourceError as exc:
        raise VerifyError(f"{script}: {exc.message}") from None
    if aa or patched_file is not None:
        original_text = original_copy.read_text(errors="replace")
        patched_text = patched_copy.read_text(errors="replace")
        diff = difflib.unified_diff(original_text.splitlines(keepends=True), patched_text.splitlines(keepends=True),
                                    fromfile=f"a/{script.name}", tofile=f"b/{script.name}")
        (work / "patch.diff").write_text("".join(diff))
        return original_copy, patched_copy, [], patched_text
    if models is None:
        models = audited_models(script, settings)
    result = fix_file(script, settings, classes, models=models)
    if result.error:
        raise VerifyError(f"{script}: {result.error}")
    patched_copy.write_bytes(copy_bytes(result.source, result.fixed))
    (work / "patch.diff").write_text(result.diff())
    return original_copy, patched_copy, result.applied, result.fixed


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


def harness_command(copy: Path, out: Path, steps: int, warmup: int, nproc: int, args: list[str],
                    health: bool = False) -> list[str]:
    harness = ["-m", "tcaudit.verify.harness", "--steps", str(steps), "--warmup", str(warmup),
               "--out", str(out), *(["--health"] if health else []), str(copy), *args]
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *harness]
    return [sys.executable, *harness]


def without_network(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own: no network but its own loopback (torchrun's
    rendezvous still works under bubblewrap; under ``unshare`` the loopback is down). The script still
    runs with the caller's user, files, GPUs and environment: this keeps it from the network, nothing more."""
    import shutil

    bwrap = shutil.which("bwrap")
    if bwrap:
        return [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--", *command]
    unshare = shutil.which("unshare")
    if unshare:
        return [unshare, "--user", "--map-root-user", "--net", "--", *command]
    raise VerifyError("--no-network needs bubblewrap (bwrap) or util-linux's unshare, and neither is installed")


def run_one(label: str, command: list[str], cwd: Path, env: dict, out: Path, nproc: int, total: int,
            progress=None, timeout: float | None = None, round_index: int | None = None) -> list[dict]:
    log = out.with_suffix(".log")
    shown = label if round_index is None else f"{label} r{round_index}"
    where = "" if round_index is None else f" in round {round_index}"
    task = progress.add_task(f"{shown:>8}", total=total, unit="steps", detail="") if progress is not None else None
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
                raise VerifyError(f"{label} run exceeded {timeout:.0f}s{where}; see {log}")
            time.sleep(0.2)
    if task is not None:
        progress.update(task, completed=total)
    files = [out] if nproc == 1 else sorted(out.parent.glob(f"{out.stem}.rank*.json"))
    if proc.returncode != 0 or not files or not all(f.exists() for f in files):
        raise VerifyError(run_failure(label, where, proc.returncode, log.read_text(errors="replace"), log))
    return [json.loads(f.read_text()) for f in files]


# How much of a failed run's output the error shows: whole lines, the last ones, within both bounds.
FAILURE_LINES, FAILURE_CHARS = 30, 3000
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")
# What says a run needed the network or its data (the verify machine may have neither).
_NO_NETWORK = re.compile(r"urlopen error|Temporary failure in name resolution|Name or service not known|"
                         r"Network is unreachable|Max retries exceeded|Failed to establish a new connection|"
                         r"ConnectionError|HTTPError|Failed to download|nodename nor servname", re.I)
_NO_DATA = re.compile(r"Dataset not found|download=True|No such file or directory", re.I)


def last_lines(text: str, lines: int = FAILURE_LINES, chars: int = FAILURE_CHARS) -> str:
    """The last whole lines of ``text`` (at most ``lines`` of them and ``chars`` characters; one longer line
    alone is shown by its end, marked with "…")."""
    kept: list[str] = []
    size = 0
    for line in reversed(text.rstrip("\n").splitlines()):
        if kept and (len(kept) >= lines or size + len(line) + 1 > chars):
            break
        kept.append(line if len(line) <= chars else "…" + line[-(chars - 1):])
        size += len(line) + 1
    return "\n".join(reversed(kept))


def run_failure(label: str, where: str, code: int | None, output: str, log: Path) -> str:
    """Why verify stops when a run fails: which side (the original: the script itself does not run here,
    tcaudit's patch is not the cause; the patched copy: the patch is), the exception that ended it, what
    that suggests (a download the machine cannot make), and the run's last lines, whole."""
    exception = None
    for line in reversed(output.splitlines()):
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            exception = line.strip().rstrip(":.")
            break
    if label == "original":
        side = ("the script itself does not run here, before any change of tcaudit's matters (the patched copy "
                "was not run): make it run on its own first")
    else:
        side = "the original ran, so tcaudit's patch is what breaks it (the change is work/patch.diff)"
    if _NO_NETWORK.search(output):
        cause = "; it needs a download and the network cannot be reached (get the data, or point the script at a copy)"
    elif _NO_DATA.search(output):
        cause = "; its data is not where it looks (get the data, or point the script at a copy)"
    else:
        cause = ""
    ended = f": {exception}" if exception else ""
    return (f"the {label} run failed{where} (exit {code}){ended}. {side[0].upper()}{side[1:]}{cause}.\n"
            f"The run's last lines (all of it: {log}):\n{last_lines(output)}")


def median_run(runs: list[RunMetrics]) -> RunMetrics:
    """The round with the median throughput (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run.samples_per_s)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class Attribution:
    rules: tuple[str, ...]
    # Full-patch throughput over this leave-out's, per round; None when not measured.
    contribution: RatioInterval | None
    note: str = ""

    def to_json(self) -> dict:
        c = self.contribution
        return {"rules": list(self.rules), "speedup": None if c is None else c.median,
                "speedup_ci": None if c is None else c.interval,
                "round_ratios": None if c is None else list(c.ratios), "note": self.note}


@dataclass
class VerifyResult:
    original: RunMetrics
    patched: RunMetrics
    interval: RatioInterval
    parity: bool
    parity_detail: str
    tolerance: float
    applied: list[str]
    command: str
    out_dir: Path
    runs: dict[str, list[RunMetrics]] = field(default_factory=dict)
    confidence: float = 0.95
    aa: bool = False
    # With ``--nproc K`` and a script that becomes distributed (``--ddp``): the patched script on one
    # process too, so that scaling efficiency = samples/s on K / (K x samples/s on 1).
    patched_single: RunMetrics | None = None
    health: dict | None = None  # side label -> side_health(), with --health
    health_regressions: list[str] = field(default_factory=list)
    attribution: list[Attribution] | None = None
    attribution_summary: str = ""
    # The original script's text digest: rules that read this run's facts later (TC508, through
    # tcaudit/runtime_facts.py) use them only for the very same text.
    script_sha256: str = ""

    @property
    def speedup(self) -> float:
        return self.interval.median

    @property
    def rounds(self) -> int:
        return len(self.runs.get("original", [])) or 1

    @property
    def scaling_efficiency(self) -> float | None:
        single = self.patched_single
        if single is None or not single.samples_per_s:
            return None
        return self.patched.samples_per_s / (self.patched.world_size * single.samples_per_s)

    @property
    def cpu_timings(self) -> bool:
        return not self.original.cuda

    def input_wait(self, label: str) -> float:
        values = [r.input_wait_fraction for r in self.runs.get(label, []) if math.isfinite(r.input_wait_fraction)]
        return statistics.median(values) if values else float("nan")

    @property
    def patched_input_bound(self) -> bool:
        return self.input_wait("patched") >= INPUT_BOUND_FRACTION

    def to_json(self) -> dict:
        return {
            "gpu": self.original.device if self.original.cuda else None,
            "device": self.original.device,
            "cpu_timings": self.cpu_timings,
            "torch": self.original.torch,
            "command": self.command,
            "script_sha256": self.script_sha256,
            "steps": max(0, len(self.original.step_times) - self.original.warmup),
            "speedup": self.speedup,
            "speedup_ci": self.interval.interval,
            "significant": self.interval.significant,
            "rounds": self.rounds,
            "round_speedups": list(self.interval.ratios),
            "speedup_method": METHOD,
            "utilisation": {label: {"precision": run.precision, "tflops": run.tflops, "mfu": run.mfu,
                                    "peak_tflops": run.peak_tflops}
                            for label, run in (("original", self.original), ("patched", self.patched))},
            "confidence": self.confidence,
            "aa": self.aa,
            "input_wait": {label: self.input_wait(label) for label in self.runs},
            "input_bound_threshold": INPUT_BOUND_FRACTION,
            "patched_input_bound": self.patched_input_bound,
            "loss_parity": self.parity,
            "loss_parity_detail": self.parity_detail,
            "tolerance": self.tolerance,
            "fixes_applied": self.applied,
            "world_size": self.original.world_size,
            "health": self.health,
            "health_regressions": self.health_regressions,
            "attribution": None if self.attribution is None else [a.to_json() for a in self.attribution],
            "attribution_summary": self.attribution_summary or None,
            "original": self.original.to_dict(),
            "patched": self.patched.to_dict(),
            "runs": {label: [run.to_dict() for run in runs] for label, runs in self.runs.items()},
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
    rounds: int = 3,
    confidence: float = 0.95,
    aa: bool = False,
    patched_file: Path | None = None,
    health: bool = False,
    attribute: bool = False,
    attribute_budget: int | None = None,
    announce=None,
    no_network: bool = False,
) -> VerifyResult:
    from tcaudit.verify import attribution as attribution_plan
    from tcaudit.verify.health import regressions, side_health

    if not script.is_file():
        raise VerifyError(f"no such script: {script}")
    if patched_file is not None and not patched_file.is_file():
        raise VerifyError(f"no such patched file: {patched_file}")
    out_dir = out_dir.resolve()
    script = script.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "work"
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(exist_ok=True)
    models = audited_models(script, settings)
    original_copy, patched_copy, applied, patched_text = make_copies(
        script, work, settings, classes, patched_file=patched_file.resolve() if patched_file else None, aa=aa,
        models=models)
    flops_per_sample = training_flops_per_sample(models)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(script.resolve().parent), env.get("PYTHONPATH")]))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    original_nproc, patched_nproc = launch_sizes(original_copy, patched_copy, nproc)
    sides = [("original", original_copy, original_nproc), ("patched", patched_copy, patched_nproc)]
    if patched_nproc > 1 and original_nproc == 1:
        sides.insert(1, ("patched-1", patched_copy, 1))

    plans = []
    if attribute:
        plans = attribution_plan.plan(script, work, settings, classes, applied, patched_text,
                                      original_copy.read_text(errors="replace"))
        measurable = [entry for entry in plans if entry.copy is not None]
        affordable = measurable if attribute_budget is None else measurable[:max(0, attribute_budget // rounds)]
        for entry in measurable[len(affordable):]:
            entry.side = "over budget"
            entry.copy = None
        line = (f"attribution: {len(plans)} rule group(s) ({', '.join('+'.join(e.rules) for e in plans) or 'none'}); "
                f"{len(measurable)} need their own runs: {len(measurable) * rounds} extra runs "
                f"({len(measurable)} x {rounds} rounds)")
        if len(affordable) < len(measurable):
            line += (f"; --attribute-budget {attribute_budget} allows {len(affordable) * rounds}: "
                     f"left out {', '.join('+'.join(e.rules) for e in measurable[len(affordable):])}")
        if announce is not None:
            announce(line)
        sides += [(entry.side, entry.copy, patched_nproc) for entry in affordable]

    results: dict[str, list[RunMetrics]] = {label: [] for label, _, _ in sides}
    total = warmup + steps
    round_line = current_progress().stage("rounds", total=rounds, unit="rounds") if rounds > 1 else None
    for round_index in range(rounds):
        if round_line is not None:
            round_line.show(f"round {round_index + 1} of {rounds}")
        # Alternate the order too (A B, B A, ...), so that a drift in the machine's speed (thermals,
        # other load, caches) does not favour whichever side always runs first.
        order = sides if round_index % 2 == 0 else sides[::-1]
        for label, copy, size in order:
            out = runs_dir / f"{label}.r{round_index + 1}.json"
            for stale in [out, *runs_dir.glob(f"{out.stem}.rank*.json")]:
                stale.unlink(missing_ok=True)
            cmd = harness_command(copy, out, steps, warmup, size, args, health=health)
            if no_network:
                cmd = without_network(cmd)
            ranks = run_one(label, cmd, script.resolve().parent, env, out, size, total, progress, timeout,
                            round_index=None if rounds == 1 else round_index + 1)
            results[label].append(with_utilisation(summarize(label, ranks, round_index + 1), flops_per_sample))
        if round_line is not None:
            round_line.advance()
    if round_line is not None:
        round_line.done()

    def throughputs(label: str) -> list[float]:
        return [run.samples_per_s for run in results[label]]

    interval = ratio_interval(throughputs("patched"), throughputs("original"), confidence)
    original, patched = median_run(results["original"]), median_run(results["patched"])
    parity, detail = rounds_parity(results["original"], results["patched"], tolerance)

    health_by_side, health_regressions = None, []
    if health:
        health_by_side = {label: side_health([run.health for run in runs if run.health is not None])
                          for label, runs in results.items() if all(run.health is not None for run in runs)}
        if "original" in health_by_side and "patched" in health_by_side:
            health_regressions = regressions(health_by_side["original"], health_by_side["patched"])

    attributions, summary = None, ""
    if attribute:
        attributions = []
        for entry in plans:
            if entry.side == "patched":
                attributions.append(Attribution(entry.rules, ratio_interval([1.0] * rounds, [1.0] * rounds),
                                                "leaving these rules out gives the same patch"))
            elif entry.side in results:
                attributions.append(Attribution(entry.rules, ratio_interval(
                    throughputs("patched"), throughputs(entry.side), confidence),
                    "" if entry.side != "original" else "the patch without these rules is the original"))
            else:
                attributions.append(Attribution(entry.rules, None, {
                    "over budget": "not measured: over --attribute-budget",
                    "unavailable": "not measured: the fix engine could not make the patch without these rules",
                }.get(entry.side, "not measured")))
        measured = [a for a in attributions if a.contribution is not None]
        if attributions and len(measured) == len(attributions):
            product = math.exp(sum(mean_log(a.contribution) for a in measured))
            if interval.interval is None:
                summary = f"contributions multiply to {product:.2f}x; one round gives no interval to compare with"
            elif interval.contains(product):
                summary = (f"contributions multiply to {product:.2f}x, within the full speedup's interval "
                           f"[{interval.low:.2f}, {interval.high:.2f}]: the rules add up")
            else:
                summary = (f"rules interact: contributions multiply to {product:.2f}x, outside the full speedup's "
                           f"interval [{interval.low:.2f}, {interval.high:.2f}]")
        elif attributions:
            summary = "partial attribution (some groups not measured): the product is not compared"

    single = results.get("patched-1")
    result = VerifyResult(original, patched, interval, parity, detail, tolerance, applied,
                          command or shlex.join(["tcaudit", "verify", str(script), "--", *args]), out_dir,
                          runs=results, confidence=confidence, aa=aa,
                          patched_single=median_run(single) if single else None,
                          health=health_by_side, health_regressions=health_regressions,
                          attribution=attributions, attribution_summary=summary,
                          script_sha256=text_digest(original_copy.read_text(encoding="utf-8", errors="replace")))
    (out_dir / "verify.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result
