"""The speedup interval: a paired t-interval on the log ratios of per-round throughputs.

Each round runs every side once, so round ``r``'s ratio ``patched_r / original_r`` shares whatever the
machine was doing during that round; the log makes ratios symmetric (1.25x and 0.8x are equally far
from 1). The interval ``exp(mean ± t · sd / sqrt(n))`` assumes the round log ratios are roughly
normal, which holds for throughput noise far better than for the raw ratios. The point estimate
reported is the median ratio (robust to one disturbed round); with three or more rounds it lies
inside the interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

METHOD = "t-interval on log ratios of per-round throughputs (paired by round)"


def _two_sided_t_probability(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with an integer ``df`` (Abramowitz & Stegun 26.7.3/26.7.4: a finite
    series in the angle theta = atan(t / sqrt(df)), exact for integer degrees of freedom)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, 1.0
        if df > 1:
            total = term = 1.0
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
            total *= math.sin(theta) * math.cos(theta)
        return 2 / math.pi * (theta + total)
    total = term = 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(confidence: float, df: int) -> float:
    """The t value with P(|T| < t) = confidence, by bisection on the exact probability."""
    if not 0 < confidence < 1 or df < 1:
        raise ValueError("confidence must be in (0, 1) and df at least 1")
    lo, hi = 0.0, 1.0
    while _two_sided_t_probability(hi, df) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _two_sided_t_probability(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class RatioInterval:
    """A ratio (b over a) from paired rounds: the median, and the interval when there are two rounds or more."""

    ratios: tuple[float, ...]
    median: float
    low: float | None
    high: float | None

    @property
    def significant(self) -> bool:
        """The interval excludes 1.0 (never, without an interval)."""
        return self.low is not None and self.high is not None and (self.low > 1.0 or self.high < 1.0)

    @property
    def interval(self) -> list[float] | None:
        return None if self.low is None else [self.low, self.high]

    def contains(self, value: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= value <= self.high


def ratio_interval(numerators: list[float], denominators: list[float], confidence: float = 0.95) -> RatioInterval:
    """Per-round ratios numerators[r] / denominators[r] and their t-interval on the log scale."""
    ratios = tuple(b / a if a > 0 and b > 0 else float("nan") for b, a in zip(numerators, denominators))
    finite = [r for r in ratios if math.isfinite(r) and r > 0]
    if not finite:
        return RatioInterval(ratios, float("nan"), None, None)
    median = statistics.median(finite)
    if len(finite) < 2:
        return RatioInterval(ratios, median, None, None)
    logs = [math.log(r) for r in finite]
    mean = statistics.fmean(logs)
    half = t_quantile(confidence, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return RatioInterval(ratios, median, math.exp(mean - half), math.exp(mean + half))


def mean_log(interval: RatioInterval) -> float:
    """The geometric mean of the finite ratios, on the log scale (products of contributions add these)."""
    logs = [math.log(r) for r in interval.ratios if math.isfinite(r) and r > 0]
    return statistics.fmean(logs) if logs else float("nan")
