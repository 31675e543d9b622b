"""verify's interval: the statistics on fixed numbers, and an A/A self-check on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.verify.stats import ratio_interval, t_quantile

TINY = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "tiny_train.py"


@pytest.mark.parametrize(("df", "confidence", "expected"), [
    (1, 0.95, 12.706), (2, 0.95, 4.303), (4, 0.95, 2.776), (9, 0.95, 2.262), (30, 0.95, 2.042),
    (2, 0.999, 31.599), (5, 0.99, 4.032),
])
def test_t_quantile_matches_the_tables(df, confidence, expected):
    assert t_quantile(confidence, df) == pytest.approx(expected, abs=1e-3)


def test_ratio_interval_on_fixed_rounds():
    original, patched = [100.0, 110.0, 90.0], [200.0, 231.0, 171.0]  # ratios 2.0, 2.1, 1.9
    interval = ratio_interval(patched, original)
    assert interval.median == pytest.approx(2.0)
    logs = [math.log(r) for r in (2.0, 2.1, 1.9)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.3027 * sd / math.sqrt(3)
    assert interval.low == pytest.approx(math.exp(mean - half), rel=1e-4)
    assert interval.high == pytest.approx(math.exp(mean + half), rel=1e-4)
    assert interval.significant and not interval.contains(1.0)


def test_ratio_interval_that_straddles_one_is_not_significant():
    interval = ratio_interval([105.0, 95.0, 101.0], [100.0, 100.0, 100.0])
    assert interval.contains(1.0) and not interval.significant


def test_one_round_has_no_interval():
    interval = ratio_interval([150.0], [100.0])
    assert interval.median == pytest.approx(1.5) and interval.interval is None and not interval.significant


@pytest.mark.parametrize("options", [
    ["--rounds", "1", "--fail-under", "1.0"],
    ["--aa", "--attribute"],
    ["--attribute-budget", "2"],
    ["--confidence", "95"],
])
def test_verify_option_combinations_that_make_no_sense_exit_2(tmp_path, options):
    pytest.importorskip("torch")
    code, _, stderr = run_cli("verify", str(TINY), *options, "--out", str(tmp_path / "o"))
    assert code == 2 and "tcaudit: error:" in stderr


@pytest.fixture(scope="module")
def aa_run(tmp_path_factory):
    """A/A on the tiny script. At 99.9% confidence with three rounds (t = 31.6), an interval that
    excludes 1.0 needs three same-sign round ratios tighter than any loaded machine produces by chance
    (one in a thousand if the rounds were independent and normal; the alternating order turns a drift
    into spread, which widens the interval)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("aa")
    code, stdout, stderr = run_cli("verify", str(TINY), "--aa", "--rounds", "3", "--confidence", "0.999",
                                   "--fail-under", "50", "--steps", "6", "--warmup", "2", "--out", str(out),
                                   "--", "--steps", "50", "--batch-size", "12")
    return code, stdout, stderr, out


def test_aa_run_is_not_significant_and_its_interval_contains_one(aa_run):
    code, stdout, stderr, out = aa_run
    data = json.loads((out / "verify.json").read_text())
    assert data["aa"] is True and data["fixes_applied"] == [] and data["rounds"] == 3
    low, high = data["speedup_ci"]
    assert low <= 1.0 <= high and data["significant"] is False
    text = " ".join(stdout.split())  # the console wraps long intervals at its width
    assert "no significant difference" in text and "A/A self-check" in text and "noise band" in text
    assert "99.9% interval" in text
    assert (out / "work" / "patch.diff").read_text() == ""


def test_aa_rounds_alternate_the_order(aa_run):
    _, _, _, out = aa_run
    runs = out / "runs"
    # Each round's files are written when its run ends: round 1 runs original first, round 2 patched first.
    first = {r: min(runs.glob(f"*.r{r}.json"), key=lambda p: p.stat().st_mtime_ns).name for r in (1, 2, 3)}
    assert first == {1: "original.r1.json", 2: "patched.r2.json", 3: "original.r3.json"}


def test_fail_under_gates_on_the_lower_bound(aa_run):
    code, stdout, _, out = aa_run
    data = json.loads((out / "verify.json").read_text())
    assert data["speedup_ci"][0] < 50
    assert code == 1 and "--fail-under 50" in stdout


def test_health_is_off_unless_asked(aa_run):
    _, _, _, out = aa_run
    data = json.loads((out / "verify.json").read_text())
    assert data["health"] is None and data["health_regressions"] == []
    run = json.loads((out / "runs" / "original.r1.json").read_text())
    assert "health" not in run and len(run["input_waits"]) == 8


def _run(losses: list[float], round_index: int = 1):
    from tcaudit.verify.runner import RunMetrics
    return RunMetrics(label="x", status="ok", device="cpu", cuda=False, torch="t", world_size=1,
                      samples_per_s=100.0 + round_index, step_ms_p50=1.0, step_ms_p90=1.0,
                      peak_memory_gib=0.0, final_loss=losses[-1], mean_loss=sum(losses) / len(losses),
                      losses=losses, warmup=0, round=round_index)


SETTLED = [2.44, 2.45, 2.43, 2.44, 2.45, 2.44, 2.43, 2.45]
WANDERING = [2.44, 2.45, 3.9, 3.7, 3.6, 3.8, 3.7, 3.6]


def test_parity_one_round_in_three_outside_is_spread_two_in_three_is_not():
    from tcaudit.verify.runner import rounds_parity
    originals = [_run(SETTLED, i) for i in (1, 2, 3)]
    ok, detail = rounds_parity(originals, [_run(SETTLED, 1), _run(WANDERING, 2), _run(SETTLED, 3)], 0.1)
    assert ok and detail.startswith("2 of 3 rounds within; round 2 outside")
    ok, detail = rounds_parity(originals, [_run(WANDERING, 1), _run(WANDERING, 2), _run(SETTLED, 3)], 0.1)
    assert not ok and detail.startswith("2 of 3 rounds outside")


def test_parity_with_two_rounds_needs_both_and_a_non_finite_loss_always_fails():
    from tcaudit.verify.runner import rounds_parity
    originals = [_run(SETTLED, i) for i in (1, 2)]
    ok, detail = rounds_parity(originals, [_run(SETTLED, 1), _run(WANDERING, 2)], 0.1)
    assert not ok and detail.startswith("1 of 2 rounds outside")
    originals = [_run(SETTLED, i) for i in (1, 2, 3)]
    nan_round = _run([*SETTLED[:-1], float("nan")], 2)
    ok, detail = rounds_parity(originals, [_run(SETTLED, 1), nan_round, _run(SETTLED, 3)], 0.1)
    assert not ok and detail == "round 2: the patched run produced a non-finite loss"
    ok, _ = rounds_parity(originals, [_run(SETTLED, i) for i in (1, 2, 3)], 0.1)
    assert ok
