"""The verify report: rich tables, and ``verify.png`` with every round's throughput and loss curves
(thin), the medians over rounds (bold), and the attribution."""

from __future__ import annotations

import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tcaudit.verify.runner import RunMetrics, VerifyResult, median_run


def confidence_label(confidence: float) -> str:
    """95% as "95%", 99.9% as "99.9%" (not rounded up to a "100%" interval)."""
    return f"{confidence * 100:.10g}%"


def _fmt(value: float | None, spec: str) -> str:
    if value is None or value != value:
        return "-"
    return format(value, spec)


def _percent(value: float) -> str:
    return "-" if value != value else f"{value:.0%}"


def _bound(value: float) -> str:
    """An interval bound: two decimals, or three significant digits where it is huge (two noisy CPU
    rounds can give a bound of 7e+15, which would otherwise fill the line)."""
    return f"{value:.2f}" if abs(value) < 1000 else f"{value:.3g}"


def speedup_line(result: VerifyResult) -> str:
    interval = result.interval
    if interval.interval is None:
        return (f"speedup: [bold]{result.speedup:.2f}x[/bold] samples/s (one round: no interval; "
                "--rounds 2 or more gives one)")
    span = f"[{_bound(interval.low)}, {_bound(interval.high)}]"
    verdict = "significant" if interval.significant else "[yellow]no significant difference[/yellow]"
    return (f"speedup: [bold]{result.speedup:.2f}x[/bold] samples/s (median of {result.rounds} rounds), "
            f"{confidence_label(result.confidence)} interval {span}: {verdict}")


def render_table(result: VerifyResult, console: Console) -> None:
    kind = "CPU timings" if result.cpu_timings else f"GPU: {result.original.device}"
    unit = "peak RSS GiB" if result.cpu_timings else "peak GiB"
    title = "tcaudit verify A/A self-check" if result.aa else "tcaudit verify"
    table = Table(title=f"{title} ({kind}, torch {result.original.torch}, {result.rounds} round(s))")
    multi = any(run.world_size > 1 for runs in result.runs.values() for run in runs)
    table.add_column("run", no_wrap=True)
    graphs = any(run.graph_replays or run.cudagraph_skips for runs in result.runs.values() for run in runs)
    flops = any(run.tflops is not None for runs in result.runs.values() for run in runs)
    for column in (*(["processes"] if multi else []), "samples/s", "per round", *(["TFLOP/s", "MFU"] if flops else []),
                   "p50 ms", "p90 ms", "input wait", unit, "final loss", "mean loss",
                   *(["graph replays"] if graphs else [])):
        table.add_column(column, justify="right")
    for label, runs in result.runs.items():
        run = median_run(runs)
        name = "original (again)" if result.aa and label == "patched" else label
        table.add_row(name, *([str(run.world_size)] if multi else []), _fmt(run.samples_per_s, ".1f"),
                      " ".join(_fmt(r.samples_per_s, ".0f") for r in runs),
                      *([_fmt(run.tflops, ".3g"), mfu_cell(run)] if flops else []),
                      _fmt(run.step_ms_p50, ".1f"), _fmt(run.step_ms_p90, ".1f"), _percent(result.input_wait(label)),
                      _fmt(run.peak_memory_gib, ".2f"), _fmt(run.final_loss, ".4f"), _fmt(run.mean_loss, ".4f"),
                      *([graph_cell(run)] if graphs else []))
    console.print(table)
    console.print(speedup_line(result) + (" (CPU timings: not a GPU claim)" if result.cpu_timings else ""))
    console.print(utilisation_line(result))
    if result.aa and result.interval.interval is not None:
        band = max(result.interval.high - 1, 1 - result.interval.low)
        console.print(f"A/A self-check: both sides run the original; noise band on this machine ±{band:.1%} "
                      f"(a speedup inside [{result.interval.low:.2f}, {result.interval.high:.2f}] is not "
                      f"distinguishable from noise at {result.rounds} rounds)")
    wait = result.input_wait("patched")
    if result.patched_input_bound:
        console.print(f"[yellow]input-bound[/yellow]: the loop waits for data {wait:.0%} of the time (patched run); "
                      "the step is bound by its input, so look at the input rules: TC401 (DataLoader workers), "
                      "TC405 (image decode on the GPU: tcaudit fix --dali)")
    else:
        console.print(f"input wait: the loop waits for data {_percent(wait)} of the time in the patched run "
                      f"({_percent(result.input_wait('original'))} in the original)")
    if result.scaling_efficiency is not None:
        single = result.patched_single
        console.print(f"scaling: {result.patched.world_size} processes {result.patched.samples_per_s:.1f} vs one process "
                      f"{single.samples_per_s:.1f} samples/s: [bold]{result.scaling_efficiency:.0%}[/bold] efficiency"
                      + (" (CPU timings)" if result.cpu_timings else ""))
    console.print(f"loss parity: {'[green]yes[/green]' if result.parity else '[red]no[/red]'} — {result.parity_detail}")
    if result.health is not None:
        render_health(result, console)
    if result.attribution is not None:
        render_attribution(result, console)
    console.print(f"fixes applied: {', '.join(result.applied) or 'none'}; results in {result.out_dir}")


def mfu_cell(run: RunMetrics) -> str:
    """``41% bf16``: the model FLOP utilisation and the precision whose peak it is measured against."""
    if run.mfu is None:
        return "-"
    return f"{run.mfu:.1%} {run.precision}"


def utilisation_line(result: VerifyResult) -> str:
    """How the TFLOP/s and MFU columns were computed, or why the table has none."""
    original, patched = result.original, result.patched
    if original.tflops is None and patched.tflops is None:
        return ("MFU: not reported: the model audit measured no FLOPs for this script's model "
                "(--no-exec, or a model it could not build)")
    if result.cpu_timings:
        return "MFU: not reported on a CPU (TFLOP/s from the model audit's FLOPs per sample, CPU timings)"
    peaks = []
    for run in (original, patched):
        if run.peak_tflops is not None:
            peaks.append(f"{run.label} {run.precision} {run.peak_tflops:g}")
        else:
            peaks.append(f"{run.label} {run.precision or 'unknown precision'}: no published peak for "
                         f"{run.device} ({run.sm}) in tcaudit/data/gpus.toml")
    return ("MFU: the model audit's training FLOPs per sample (3x the forward, of the model as the script builds "
            "it by default) x samples/s, over the GPU's published dense peak TFLOPS for the precision each run's "
            f"GEMMs used ({'; '.join(peaks)})")


def graph_cell(run: RunMetrics) -> str:
    """CUDA graph replays in the timed steps, per step where there were any; the captures Inductor
    skipped (``cudagraph_skips``) after them: a compiled step that meant to replay but did not."""
    steps = max(0, len(run.step_times) - run.warmup)
    cell = str(run.graph_replays)
    if run.graph_replays and steps:
        cell += f" ({run.graph_replays / steps:.1f}/step)"
    return cell + (f", {run.cudagraph_skips} skipped" if run.cudagraph_skips else "")


def render_health(result: VerifyResult, console: Console) -> None:
    table = Table(title="training health (worst round)")
    table.add_column("run", no_wrap=True)
    for column in ("NaN/Inf loss steps", "NaN/Inf grad steps", "skipped steps", "grad norm median",
                   "grad norm max", "params without grad", "DDP find_unused"):
        table.add_column(column, justify="right")
    for label, side in result.health.items():
        flag = side["ddp_find_unused_parameters"]
        table.add_row(label, str(side["nonfinite_loss_steps"]), str(side["nonfinite_grad_steps"]),
                      str(side["skipped_steps"]), _fmt(side["grad_norm_median"], ".3g"),
                      _fmt(side["grad_norm_max"], ".3g"), str(len(side["unused_parameters"])),
                      "not DDP" if flag is None else str(flag))
    console.print(table)
    if result.health_regressions:
        console.print("[red]health: the patched run trains worse than the original[/red]:")
        for line in result.health_regressions:
            console.print(f"  - {line}")
    else:
        console.print("health: [green]no regression[/green] (no new non-finite steps, skipped steps or parameters "
                      "without a gradient; gradient norm within 10x)")


def render_attribution(result: VerifyResult, console: Console) -> None:
    table = Table(title="attribution: full patch over the patch without these rules")
    for column in ("rules", "contribution", "interval", "note"):
        table.add_column(column, justify="left" if column in ("rules", "note") else "right")
    for entry in result.attribution:
        c = entry.contribution
        span = "-" if c is None or c.interval is None else f"[{c.low:.2f}, {c.high:.2f}]"
        table.add_row("+".join(entry.rules), "-" if c is None else f"{c.median:.2f}x", span, entry.note)
    console.print(table)
    if result.attribution_summary:
        console.print(f"attribution: {result.attribution_summary}")


def _throughput(run: RunMetrics) -> list[float]:
    return [s / t if t > 0 else float("nan") for s, t in zip(run.samples, run.step_times)]


def _per_step_median(runs: list[RunMetrics]) -> list[float]:
    curves = [_throughput(run) for run in runs]
    length = min(len(c) for c in curves)
    return [statistics.median(c[i] for c in curves) for i in range(length)]


def write_plot(result: VerifyResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = 3 if result.attribution else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    left, right = axes[0], axes[1]
    colors = {"original": "tab:gray", "patched": "tab:green", "patched-1": "tab:olive"}
    for index, (label, runs) in enumerate(result.runs.items()):
        color = colors.get(label, f"C{index % 10}")
        name = "original (again)" if result.aa and label == "patched" else label
        for run in runs:  # every round, thin
            steps = list(range(1, len(run.step_times) + 1))
            left.plot(steps, _throughput(run), color=color, linewidth=0.6, alpha=0.45)
            right.plot(steps, [l if l is not None else float("nan") for l in run.losses], color=color,
                       linewidth=0.6, alpha=0.45)
        median = _per_step_median(runs)  # the median over rounds, bold
        left.plot(list(range(1, len(median) + 1)), median, color=color, linewidth=2.2, label=f"{name} (median)")
    right.plot([], [], color="k", linewidth=0.6, label="one line per round")
    for ax in (left, right):
        ax.axvline(result.original.warmup + 0.5, color="k", linestyle=":", linewidth=1)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    left.set_ylabel("samples/s (per process)")
    span = "" if result.interval.interval is None else f" [{result.interval.low:.2f}, {result.interval.high:.2f}]"
    left.set_title(f"throughput: {result.speedup:.2f}x{span}" + (" (CPU)" if result.cpu_timings else ""), fontsize=10)
    right.set_ylabel("loss")
    right.set_title("loss parity: " + ("yes" if result.parity else "no"), fontsize=10)
    if result.attribution:
        ax = axes[2]
        entries = result.attribution
        for y, entry in enumerate(entries):
            c = entry.contribution
            if c is None:
                continue
            ax.plot([c.median], [y], "o", color="tab:green")
            if c.interval is not None:
                ax.plot([c.low, c.high], [y, y], color="tab:green", linewidth=2)
        ax.axvline(1.0, color="k", linestyle=":", linewidth=1)
        ax.set_yticks(range(len(entries)), ["+".join(e.rules) for e in entries], fontsize=8)
        ax.set_xlabel("contribution (full / without)")
        ax.set_title("attribution", fontsize=10)
    fig.suptitle(result.original.device + (" — A/A self-check" if result.aa else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
