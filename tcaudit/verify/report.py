"""The verify report: a rich table, and ``verify.png`` with throughput and loss curves."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from tcaudit.verify.runner import RunMetrics, VerifyResult


def _fmt(value: float | None, spec: str) -> str:
    if value is None or value != value:
        return "-"
    return format(value, spec)


def render_table(result: VerifyResult, console: Console) -> None:
    kind = "CPU timings" if result.cpu_timings else f"GPU: {result.original.device}"
    unit = "peak RSS GiB" if result.cpu_timings else "peak GiB"
    table = Table(title=f"tcaudit verify ({kind}, torch {result.original.torch})")
    for column in ("run", "processes", "samples/s", "step p50 ms", "step p90 ms", unit, "final loss", "mean loss"):
        table.add_column(column, justify="right" if column != "run" else "left")
    runs = [result.original, *([result.patched_single] if result.patched_single else []), result.patched]
    for run in runs:
        table.add_row(run.label, str(run.world_size), _fmt(run.samples_per_s, ".1f"), _fmt(run.step_ms_p50, ".1f"),
                      _fmt(run.step_ms_p90, ".1f"), _fmt(run.peak_memory_gib, ".2f"),
                      _fmt(run.final_loss, ".4f"), _fmt(run.mean_loss, ".4f"))
    console.print(table)
    console.print(f"speedup: [bold]{result.speedup:.2f}x[/bold] samples/s"
                  + (" (CPU timings: not a GPU claim)" if result.cpu_timings else ""))
    if result.scaling_efficiency is not None:
        single = result.patched_single
        console.print(f"scaling: {result.patched.world_size} processes {result.patched.samples_per_s:.1f} vs one process "
                      f"{single.samples_per_s:.1f} samples/s: [bold]{result.scaling_efficiency:.0%}[/bold] efficiency"
                      + (" (CPU timings)" if result.cpu_timings else ""))
    console.print(f"loss parity: {'[green]yes[/green]' if result.parity else '[red]no[/red]'} — {result.parity_detail}")
    console.print(f"fixes applied: {', '.join(result.applied) or 'none'}; results in {result.out_dir}")


def _throughput(run: RunMetrics) -> list[float]:
    return [s / t if t > 0 else float("nan") for s, t in zip(run.samples, run.step_times)]


def write_plot(result: VerifyResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    pairs = [(result.original, "tab:gray"), (result.patched, "tab:green")]
    if result.patched_single is not None:
        pairs.insert(1, (result.patched_single, "tab:olive"))
    for run, color in pairs:
        steps = range(1, len(run.step_times) + 1)
        label = f"{run.label} ({run.world_size} proc)" if run.world_size > 1 else run.label
        left.plot(list(steps), _throughput(run), label=label, color=color)
        losses = [l if l is not None else float("nan") for l in run.losses]
        right.plot(list(steps), losses, label=label, color=color)
    for ax in (left, right):
        ax.axvline(result.original.warmup + 0.5, color="k", linestyle=":", linewidth=1)
        ax.set_xlabel("step")
        ax.legend()
    left.set_ylabel("samples/s (per process)")
    left.set_title(f"throughput: {result.speedup:.2f}x" + (" (CPU)" if result.cpu_timings else ""))
    right.set_ylabel("loss")
    right.set_title("loss parity: " + ("yes" if result.parity else "no"))
    fig.suptitle(result.original.device)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
