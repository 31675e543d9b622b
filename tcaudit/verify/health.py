"""Training health of a verify run, and the comparison that flags a patch that trains worse.

The harness (``--health``) records per step the global gradient norm, GradScaler skipped steps, the
peak memory, and at the end the parameters that never had a gradient; the losses it always records.
Here those facts are summarised per side (over all rounds) and the patched side is compared with the
original: a new non-finite loss or gradient, new skipped steps, new parameters without a gradient, or
a median gradient norm ``GRAD_NORM_FACTOR`` times the original's is a regression, and verify exits 1.

What a run recorded is read back by ``tcaudit.runtime_facts`` (``unused_parameters``,
``measured_run``), which TC508 uses to decide whether ``find_unused_parameters=True`` is needless.
"""

from __future__ import annotations

import math
import statistics

GRAD_NORM_FACTOR = 10.0


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def run_health(losses: list, warmup: int, health: dict) -> dict:
    """One run's health summary from the harness's raw facts."""
    norms = health.get("grad_norms", [])
    timed_norms = [n for n in norms[warmup:] if _finite(n)]
    peaks = health.get("peak_memory_gib_per_step", [])
    return {
        # A non-finite value during warmup is as bad as one later: every recorded step counts.
        "nonfinite_loss_steps": sum(1 for l in losses if l is not None and not math.isfinite(l)),
        "nonfinite_grad_steps": sum(1 for n in norms if n is not None and not math.isfinite(n)),
        # A new GradScaler lowers its scale in its first steps by design; only timed steps count.
        "skipped_steps": sum(1 for s in health.get("skipped_steps", []) if s >= warmup),
        "grad_norm_median": statistics.median(timed_norms) if timed_norms else None,
        "grad_norm_max": max(timed_norms) if timed_norms else None,
        "grad_norms": norms,
        "unused_parameters": list(health.get("unused_parameters", [])),
        "ddp_find_unused_parameters": health.get("ddp_find_unused_parameters"),
        "peak_memory_gib_per_step": peaks,
    }


def side_health(runs: list[dict]) -> dict:
    """A side's health over its rounds: the worst count of any round, the median of the rounds' median
    gradient norms, and the parameters that had no gradient in every round."""
    unused = set(runs[0]["unused_parameters"])
    for run in runs[1:]:
        unused &= set(run["unused_parameters"])
    medians = [r["grad_norm_median"] for r in runs if r["grad_norm_median"] is not None]
    maxima = [r["grad_norm_max"] for r in runs if r["grad_norm_max"] is not None]
    return {
        "nonfinite_loss_steps": max(r["nonfinite_loss_steps"] for r in runs),
        "nonfinite_grad_steps": max(r["nonfinite_grad_steps"] for r in runs),
        "skipped_steps": max(r["skipped_steps"] for r in runs),
        "grad_norm_median": statistics.median(medians) if medians else None,
        "grad_norm_max": max(maxima) if maxima else None,
        "unused_parameters": sorted(unused),
        "ddp_find_unused_parameters": runs[0]["ddp_find_unused_parameters"],
        "rounds": runs,
    }


def regressions(original: dict, patched: dict) -> list[str]:
    """What is worse in the patched side's health than in the original's, in words."""
    found = []
    for key, what in (("nonfinite_loss_steps", "steps with a non-finite loss"),
                      ("nonfinite_grad_steps", "steps with a non-finite gradient"),
                      ("skipped_steps", "GradScaler skipped steps in the timed steps")):
        if patched[key] > original[key]:
            found.append(f"{what}: {patched[key]} (original {original[key]})")
    new_unused = sorted(set(patched["unused_parameters"]) - set(original["unused_parameters"]))
    if new_unused:
        shown = ", ".join(new_unused[:5]) + (f" and {len(new_unused) - 5} more" if len(new_unused) > 5 else "")
        found.append(f"parameters that never got a gradient: {shown}")
    a, b = original["grad_norm_median"], patched["grad_norm_median"]
    if a is not None and b is not None and a > 0 and b > GRAD_NORM_FACTOR * a:
        found.append(f"median gradient norm {b:.3g}, {b / a:.0f}x the original's {a:.3g}")
    return found
