"""Impact order (tcaudit/report/order.py): the finding that matters most comes first, a finding that
presumes another rule's fix comes right after that rule's finding and is never an error, and
``--sort line`` gives path/line order back."""

from __future__ import annotations

import io
import json
import re

import pytest

from conftest import FIXTURES, REPO, run_cli
from tcaudit.catalog import load_catalog
from tcaudit.engine import ScanResult
from tcaudit.findings import Finding, Fix, FixClass, FollowsFix, Location, Severity
from tcaudit.report import get_reporter
from tcaudit.report.order import estimated_gain, impact_key, ordered

RESNET = FIXTURES / "resnet50" / "train.py"
DCGAN = FIXTURES / "scripts" / "tc2_dcgan_examples.py"
CONCISE = re.compile(r"(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<rule>TC\d{3}) ")


def concise(*args: str) -> list[tuple[str, int, int, str]]:
    code, out, err = run_cli("scan", "--no-cache", "--format", "concise", *args, cwd=REPO)
    assert code in (0, 1), err
    rows = []
    for line in out.splitlines():
        m = CONCISE.match(line)
        assert m, line
        rows.append((m["path"], int(m["line"]), int(m["col"]), m["rule"]))
    return rows


def finding(rule: str, line: int, severity: Severity = Severity.WARNING, path: str = "t.py", **kw) -> Finding:
    return Finding(rule=rule, name="x", severity=severity, location=Location(path, line, 1, line, 2),
                   message=f"{rule} at {line}", **kw)


def test_resnet50_fixture_lists_tc201_first():
    rows = concise(str(RESNET.relative_to(REPO)))
    assert rows[0][3] == "TC201"
    # TC303's channels_last presumes TC201's autocast: right after it.
    assert rows[1][3] == "TC303"
    code, out, _ = run_cli("scan", "--no-cache", str(RESNET.relative_to(REPO)), cwd=REPO)
    heads = [line for line in out.splitlines() if re.match(r"\S+:\d+:\d+: TC\d{3} ", line)]
    assert heads[0].split()[1] == "TC201"
    summary = out.splitlines()[-1]
    # The figure was measured on an H200: quoted only for that target (tests/test_issue51_edges.py).
    assert "Top: TC201 missing-autocast (fixtures/resnet50/train.py:90)." in summary


def test_dcgan_no_tc208_before_the_tc201_it_waits_for():
    rows = concise(str(DCGAN.relative_to(REPO)), "--no-exec")
    rules = [row[3] for row in rows]
    assert "TC208" in rules and "TC201" in rules
    assert rules[0] == "TC201"
    first_208 = rules.index("TC208")
    # Every finding between TC201 and the TC208s presumes TC201's fix too (TC303).
    assert all(rule in ("TC303", "TC208") for rule in rules[1:first_208])
    data = json.loads(run_cli("scan", "--no-cache", "--format", "json", "--no-exec",
                              str(DCGAN.relative_to(REPO)), cwd=REPO)[1])
    waiting = [f for f in data["findings"] if f["rule"] == "TC208"]
    assert waiting and all(f["severity"] == "warning" and f["follows"] == "TC201" for f in waiting)


def test_a_finding_that_presumes_another_fix_is_never_an_error():
    waiting = Finding(rule="TC208", name="x", severity=Severity.ERROR, location=Location("t.py", 5, 1, 5, 2),
                      message="m", fix=Fix(FixClass.NUMERICS, "d", plan=FollowsFix("TC201")))
    assert waiting.follows == "TC201"
    assert waiting.severity is Severity.WARNING
    assert finding("TC208", 5, Severity.ERROR, follows="TC201").severity is Severity.WARNING
    assert finding("TC208", 5, Severity.ERROR).severity is Severity.ERROR
    # --fail-on error passes a script whose only error waits for TC201's autocast.
    code, _, _ = run_cli("scan", "--no-cache", "--no-exec", "--fail-on", "error", "--select", "TC201,TC208",
                         str(DCGAN.relative_to(REPO)), cwd=REPO)
    assert code == 0


def test_sort_line_gives_path_line_column_order(tmp_path):
    rows = concise(str(RESNET.relative_to(REPO)), "--no-exec", "--sort", "line")
    assert rows == sorted(rows, key=lambda r: (r[0], r[1], r[2]))
    assert rows[0][3] != "TC201"
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nsort = "line"\n', encoding="utf-8")
    (tmp_path / "train.py").write_text(RESNET.read_text(encoding="utf-8"), encoding="utf-8")
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--format", "concise", "train.py", cwd=tmp_path)
    lines = [int(line.split(":")[1]) for line in out.splitlines()]
    assert lines == sorted(lines)
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--format", "concise", "--sort", "impact", "train.py",
                           cwd=tmp_path)
    assert out.splitlines()[0].split()[1] == "TC201"  # the command line wins


def test_config_rejects_an_unknown_sort(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nsort = "severity"\n', encoding="utf-8")
    (tmp_path / "x.py").write_text("x = 1\n", encoding="utf-8")
    code, _, err = run_cli("scan", "x.py", cwd=tmp_path)
    assert code == 2 and "sort" in err


def test_machine_formats_keep_line_order():
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--format", "json", str(RESNET.relative_to(REPO)), cwd=REPO)
    found = json.loads(out)["findings"]
    keys = [(f["path"], f["line"], f["column"]) for f in found]
    assert keys == sorted(keys)


def test_impact_key_tiers():
    rules = load_catalog()
    error = finding("TC501", 9, Severity.ERROR)
    measured = finding("TC201", 8)  # [impact] speedup 2.57
    smaller = finding("TC601", 1)  # 1.03
    model = finding("TC101", 7, details={"est_time_lost": 0.2})
    warning = finding("TC402", 2)
    info = finding("TC505", 3, Severity.INFO)
    assert estimated_gain(measured, rules) == pytest.approx(1 - 1 / 2.57)
    assert estimated_gain(model, rules) == 0.2
    assert estimated_gain(warning, rules) is None
    ranked = sorted([info, warning, smaller, model, measured, error], key=lambda f: impact_key(f, rules))
    assert [f.rule for f in ranked] == ["TC501", "TC201", "TC101", "TC601", "TC402", "TC505"]


def test_followers_come_after_their_nearest_leader_and_files_by_their_top_finding():
    rules = load_catalog()
    leader_a = finding("TC401", 10)
    leader_b = finding("TC401", 50)
    follower = finding("TC404", 48, Severity.INFO, follows="TC401")
    orphan = finding("TC208", 30, Severity.ERROR, follows="TC201")  # no TC201 here: its own place
    other = finding("TC201", 5, path="a.py")
    out = ordered([leader_a, leader_b, follower, orphan, other], rules)
    assert out[0] is other  # a.py's top finding outranks t.py's
    rest = out[1:]
    assert rest.index(follower) == rest.index(leader_b) + 1
    assert ordered([leader_a, follower, orphan], rules, "line") == [leader_a, orphan, follower]


def test_text_report_direct_render_uses_the_result_sort():
    rules = load_catalog()
    result = ScanResult(findings=[finding("TC402", 1), finding("TC201", 2)], files_scanned=1, files_parsed=1)
    out = io.StringIO()
    get_reporter("text")(result, out, rules=rules, color=False)
    heads = [line for line in out.getvalue().splitlines() if line.startswith("t.py:")]
    assert [h.split()[1] for h in heads] == ["TC201", "TC402"]
    result.sort = "line"
    out = io.StringIO()
    get_reporter("text")(result, out, rules=rules, color=False)
    heads = [line for line in out.getvalue().splitlines() if line.startswith("t.py:")]
    assert [h.split()[1] for h in heads] == ["TC402", "TC201"]
