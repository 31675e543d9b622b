"""Short messages, long explanations (issue 29, item 2): a message says what and where in at most 120
characters, ruff style; why it matters, the measured figures and the fix go to ``Finding.explanation``
(``scan --show-fixes``, JSON ``explanation``, SARIF message markdown)."""

from __future__ import annotations

import io
import json
import re

import pytest

from conftest import FIXTURES, REPO, run_cli
from tcaudit.catalog import load_catalog
from tcaudit.engine import ScanResult
from tcaudit.findings import Finding, Location, Severity
from tcaudit.report import get_reporter
from test_reports import assert_valid_sarif

MESSAGE_LIMIT = 120
CONCISE_LIMIT = 200
# The rules whose messages are short so far; the bound holds for every finding they make on the fixtures.
SHORT = frozenset({
    "TC201", "TC208", "TC301", "TC302", "TC303", "TC305", "TC307", "TC401", "TC402", "TC403", "TC404",
    "TC405", "TC406", "TC408", "TC505", "TC601", "TC204", "TC502", "TC504",
    "TC104", "TC202", "TC203", "TC205", "TC206", "TC207", "TC209", "TC210", "TC212", "TC304", "TC306", "TC308",
    "TC310", "TC314", "TC315", "TC316", "TC317", "TC409", "TC501", "TC503", "TC506", "TC507", "TC602", "TC603", "TC604", "TC605", "TC606",
    "TC318",
    "TC509",
    "TC214",
    "TC410",
    "TC411",
    "TC413",
})
CONCISE = re.compile(r"(?P<path>.+?):\d+:\d+: (?P<rule>TC\d{3}) (?P<message>.*)")


@pytest.fixture(scope="module")
def fixture_lines() -> list[re.Match]:
    code, out, err = run_cli("scan", "--no-cache", "--no-exec", "--format", "concise", "fixtures", cwd=REPO)
    assert code in (0, 1), err
    rows = [CONCISE.fullmatch(line) for line in out.splitlines()]
    assert rows and all(rows)
    return rows  # type: ignore[return-value]


def test_short_rules_fire_on_the_fixtures(fixture_lines):
    assert SHORT <= {row["rule"] for row in fixture_lines}


def test_messages_fit_120_and_concise_lines_200(fixture_lines):
    over = [row.string for row in fixture_lines if row["rule"] in SHORT and (
        len(row["message"]) > MESSAGE_LIMIT or len(row.string) > CONCISE_LIMIT)]
    assert not over, "\n".join(over[:10])


def test_the_figures_move_to_the_explanation():
    path = str((FIXTURES / "resnet50" / "train.py").relative_to(REPO))
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--format", "json", "--gpu", "sm_90", path, cwd=REPO)
    tc201 = next(f for f in json.loads(out)["findings"] if f["rule"] == "TC201")
    assert "H200" not in tc201["message"]
    assert "(H200, torch 2.11: " in tc201["explanation"] and "torch.autocast" in tc201["explanation"]
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--show-fixes", "--select", "TC201", path, cwd=REPO)
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if ": TC201 [warning] " in line)
    assert lines[head + 1].startswith("    Wrap them in torch.autocast (H200, torch 2.11: ")
    code, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--select", "TC201", path, cwd=REPO)
    assert "Wrap them in torch.autocast" not in out  # only with --show-fixes


def finding(message: str, explanation: str = "") -> Finding:
    return Finding(rule="TC201", name="missing-autocast", severity=Severity.WARNING,
                   location=Location("t.py", 1, 1, 1, 2), message=message, explanation=explanation)


def test_sarif_carries_the_explanation_as_markdown_and_validates():
    result = ScanResult(findings=[finding("short", "the long **why**")], files_scanned=1, files_parsed=1)
    out = io.StringIO()
    get_reporter("sarif")(result, out, rules=load_catalog(), color=False)
    log = json.loads(out.getvalue())
    assert_valid_sarif(log)
    [sarif] = log["runs"][0]["results"]
    assert sarif["message"] == {"text": "short", "markdown": "short\n\nthe long **why**"}
    assert sarif["properties"]["explanation"] == "the long **why**"


def test_text_wraps_at_the_terminal_width_between_words():
    words = "every word stays whole when the report wraps at the width of the terminal".split()
    message = " ".join(words * 3)
    result = ScanResult(findings=[finding(message, message)], files_scanned=1, files_parsed=1, show_fixes=True)
    out = io.StringIO()
    get_reporter("text")(result, out, rules=load_catalog(), color=True)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    lines = [line.rstrip() for line in plain.splitlines()]
    from rich.console import Console

    width = Console(file=io.StringIO(), force_terminal=True).width  # the report's console's width
    assert all(len(line) <= width for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("t.py:1:1: TC201"))
    for line in lines[start:start + 4]:
        for token in line.replace("t.py:1:1: TC201 [warning] ", "").split():
            assert token in words, (token, line)
    # Piped, a message stays one line.
    out = io.StringIO()
    get_reporter("text")(result, out, rules=load_catalog(), color=False)
    assert any(line.endswith(message) and len(line) > width for line in out.getvalue().splitlines())


def _bad_examples():
    import tomllib

    for path in sorted((REPO / "rules").glob("TC*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for index, bad in enumerate(data.get("bad", [])):
            if bad.get("code") and not path.stem.startswith("TC1"):  # TC1 needs the model audit
                yield pytest.param(path.stem, bad["code"], id=f"{path.stem}-{index}")


@pytest.mark.parametrize("rule, code", list(_bad_examples()))
def test_every_script_rule_message_on_its_bad_examples_fits_120(rule, code):
    from tcaudit import api

    found = api.scan(text=code if code.endswith("\n") else code + "\n", filename="example.py", isolated=True,
                     exec_models=False, edits=False)
    over = [f"{f.rule}: {f.message}" for f in found if len(f.message) > MESSAGE_LIMIT]
    assert not over, "\n".join(over)
