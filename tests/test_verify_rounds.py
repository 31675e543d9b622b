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
    assert "no significant difference" in stdout and "A/A self-check" in stdout and "noise band" in stdout
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
