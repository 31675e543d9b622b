"""Every output format, on a real scan: SARIF validates against the official schema, GitHub
annotations are escaped, JUnit parses, JSON keys are stable, concise and text have their shapes."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO, SHARED, run_cli
from tcaudit.catalog import load_catalog
from tcaudit.engine import ScanResult
from tcaudit.findings import Finding, Location, Severity
from tcaudit.report import FORMATS, get_reporter
from tcaudit.report.github_report import escape_data, escape_property

SARIF_SCHEMA = SHARED / "schemas" / "sarif-schema-2.1.0.json"
BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
SELECT = ("--select", "TC000,TC202")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with one TC202 finding in a subfolder, one parse error and one clean file."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bad.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "broken.py").write_text("x = (1,\n", encoding="utf-8")
    (tmp_path / "clean.py").write_text("x = 1\n", encoding="utf-8")
    return tmp_path


def scan_format(project: Path, fmt: str, *paths: str) -> tuple[int, str, str]:
    return run_cli("scan", *(paths or (".",)), "--format", fmt, *SELECT, cwd=project)


def render(fmt: str, result: ScanResult) -> str:
    out = io.StringIO()
    get_reporter(fmt)(result, out, rules=load_catalog(), color=False)
    return out.getvalue()


def info_finding(message: str = "note this") -> Finding:
    return Finding(
        rule="TC202",
        name="deprecated-amp-api",
        severity=Severity.INFO,
        location=Location("a b/x.py", 3, 5, 3, 9),
        message=message,
        fingerprint="0123456789abcdef0123",
    )


# -- SARIF -------------------------------------------------------------------------------------------


def sarif_validator():
    if not SARIF_SCHEMA.is_file():
        pytest.skip(f"the SARIF 2.1.0 schema is not at {SARIF_SCHEMA} (the shared/ folder beside the repo)")
    import jsonschema

    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def assert_valid_sarif(log: dict) -> None:
    errors = sorted(sarif_validator().iter_errors(log), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def test_sarif_validates_and_carries_the_findings(project):
    code, out, err = scan_format(project, "sarif")
    assert code == 1, err
    log = json.loads(out)
    assert_valid_sarif(log)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "tcaudit"
    assert driver["version"]
    assert "informationUri" not in driver  # tcaudit has no public address yet: no placeholder
    rules = driver["rules"]
    assert [r["id"] for r in rules] == ["TC000", "TC202"]  # the rules that fired, not the catalog
    tc202 = next(r for r in rules if r["id"] == "TC202")
    spec = load_catalog()["TC202"]
    assert tc202["name"] == "deprecated-amp-api"
    assert tc202["shortDescription"]["text"] == spec.summary
    assert tc202["fullDescription"]["text"] == spec.why
    page = (REPO / "docs" / "rules" / "TC202.md").read_text(encoding="utf-8")
    assert tc202["help"]["markdown"] == page
    assert tc202["help"]["text"].startswith(spec.summary) and "docs/rules/TC202.md" in tc202["help"]["text"]
    assert tc202["properties"]["docs"] == "docs/rules/TC202.md"
    assert "helpUri" not in tc202
    assert tc202["defaultConfiguration"]["level"] == "warning"
    assert next(r for r in rules if r["id"] == "TC000")["defaultConfiguration"]["level"] == "error"

    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert set(by_rule) == {"TC000", "TC202"}
    amp = by_rule["TC202"]
    assert rules[amp["ruleIndex"]]["id"] == "TC202"
    assert amp["level"] == "warning"
    assert "torch.cuda.amp.GradScaler" in amp["message"]["text"]
    location = amp["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "pkg/bad.py"
    assert location["region"] == {"startLine": 2, "startColumn": 10, "endLine": 2, "endColumn": 35}
    assert re.fullmatch(r"[0-9a-f]{20}", amp["partialFingerprints"]["tcaudit/v1"])
    assert amp["properties"]["fix"]["class"] == "safe"
    (fix,) = amp["fixes"]  # the fix's own edits, as SARIF replacements of this file
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"] == "pkg/bad.py"
    assert change["replacements"] and all(r["deletedRegion"]["startLine"] == 2 for r in change["replacements"])
    assert by_rule["TC000"]["level"] == "error"
    assert by_rule["TC000"]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken.py"


def test_sarif_help_uri_and_information_uri_once_published(project, monkeypatch):
    import tcaudit

    monkeypatch.setattr(tcaudit, "REPOSITORY_URL", "https://code.example/tcaudit")
    monkeypatch.setattr(tcaudit, "RULE_DOCS_URL", "https://code.example/tcaudit/docs/rules/")
    log = json.loads(scan_format(project, "sarif")[1])
    assert_valid_sarif(log)
    driver = log["runs"][0]["tool"]["driver"]
    assert driver["informationUri"] == "https://code.example/tcaudit"
    assert {r["id"]: r["helpUri"] for r in driver["rules"]} == {
        "TC000": "https://code.example/tcaudit/docs/rules/TC000.md",
        "TC202": "https://code.example/tcaudit/docs/rules/TC202.md",
    }


def test_sarif_stays_small(project):
    """Rule pages only for the rules that fired: two results, two pages (the catalog's 60 were 384 KB)."""
    out = scan_format(project, "sarif")[1]
    pages = sum(len(json.dumps(render_page(rule))) for rule in ("TC000", "TC202"))
    assert len(out) < pages + 12_000, len(out)


def render_page(rule_id: str) -> str:
    from tcaudit.explain import render_explanation

    return render_explanation(load_catalog()[rule_id])


def test_sarif_rule_unknown_to_the_catalog_gets_a_descriptor():
    finding = info_finding()
    finding.rule, finding.name = "TC999", "plugin-rule"
    log = json.loads(render("sarif", ScanResult(findings=[finding], files_scanned=1, files_parsed=1)))
    assert_valid_sarif(log)
    run = log["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["TC999"]
    assert run["results"][0]["ruleIndex"] == 0


def test_sarif_fingerprints_match_the_json_report(project):
    sarif = json.loads(scan_format(project, "sarif")[1])
    data = json.loads(scan_format(project, "json")[1])
    assert {r["partialFingerprints"]["tcaudit/v1"] for r in sarif["runs"][0]["results"]} == {
        f["fingerprint"] for f in data["findings"]
    }


def test_sarif_clean_run_is_valid(project):
    code, out, _ = scan_format(project, "sarif", "clean.py")
    assert code == 0
    log = json.loads(out)
    assert_valid_sarif(log)
    assert log["runs"][0]["results"] == []
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_sarif_maps_info_to_note_and_keeps_notes():
    result = ScanResult(findings=[info_finding()], files_scanned=1, files_parsed=1, notes=["model checks skipped"])
    log = json.loads(render("sarif", result))
    assert_valid_sarif(log)
    run = log["runs"][0]
    assert run["results"][0]["level"] == "note"
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "a%20b/x.py"
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert notes == [{"level": "note", "message": {"text": "model checks skipped"}}]


# -- GitHub -------------------------------------------------------------------------------------------


def test_github_escaping():
    assert escape_data("100% done\r\nnext") == "100%25 done%0D%0Anext"
    assert escape_data("a:b,c") == "a:b,c"  # only properties escape : and ,
    assert escape_property("dir:x,y/f.py %\n") == "dir%3Ax%2Cy/f.py %25%0A"


def test_github_annotations(project):
    code, out, _ = scan_format(project, "github")
    assert code == 1
    lines = out.splitlines()
    assert (
        "::warning file=pkg/bad.py,line=2,col=10,endLine=2,endColumn=35,title=TC202 deprecated-amp-api::"
        "`torch.cuda.amp.GradScaler` is deprecated" in lines[1]
    )
    assert lines[0].startswith("::error file=broken.py,line=1,col=5,title=TC000 parse-error::cannot parse")
    assert len(lines) == 2


def test_github_info_is_a_notice_and_messages_are_escaped():
    finding = info_finding("50% of steps\nsync: here, there")
    finding.location = Location("odd,dir/x:1.py", 3, 5, 3, 9)
    out = render("github", ScanResult(findings=[finding], files_scanned=1, files_parsed=1))
    assert out == (
        "::notice file=odd%2Cdir/x%3A1.py,line=3,col=5,endLine=3,endColumn=9,title=TC202 deprecated-amp-api"
        "::50%25 of steps%0Async: here, there\n"
    )


def test_github_and_junit_carry_the_explanation_below_the_message():
    finding = info_finding("short message")
    finding.explanation = "why it matters: 2.6x on the H200"
    out = render("github", ScanResult(findings=[finding], files_scanned=1, files_parsed=1))
    assert out.endswith("::short message%0A%0Awhy it matters: 2.6x on the H200\n")
    root = ET.fromstring(render("junit", ScanResult(findings=[finding], files_scanned=1, files_parsed=1)))
    failure = root.find(".//failure")
    assert failure.get("message") == "short message"
    assert failure.text.splitlines()[1] == "why it matters: 2.6x on the H200"


def test_github_multiline_span_has_no_columns():
    finding = info_finding()
    finding.location = Location("x.py", 3, 5, 6, 2)
    out = render("github", ScanResult(findings=[finding], files_scanned=1, files_parsed=1))
    assert out.startswith("::notice file=x.py,line=3,endLine=6,title=")


# -- JUnit --------------------------------------------------------------------------------------------


def test_junit_parses_and_counts(project):
    code, out, _ = scan_format(project, "junit")
    assert code == 1
    root = ET.fromstring(out)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("2", "2", "0")
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert set(suites) == {"broken.py", "pkg/bad.py"}
    case = suites["pkg/bad.py"].find("testcase")
    assert case.get("line") == "2" and case.get("file") == "pkg/bad.py"
    failure = case.find("failure")
    assert "torch.cuda.amp.GradScaler" in failure.get("message")
    assert failure.text.startswith("pkg/bad.py:2:10: TC202 ")
    assert len(root.findall(".//failure")) == 2


def test_junit_clean_run_is_a_valid_empty_report(project):
    code, out, _ = scan_format(project, "junit", "clean.py")
    assert code == 0
    root = ET.fromstring(out)
    assert root.get("tests") == "0" and root.get("failures") == "0"
    assert [suite.get("tests") for suite in root.findall("testsuite")] == ["0"]
    assert root.findall(".//testcase") == []


def test_junit_strips_characters_xml_cannot_carry():
    out = render("junit", ScanResult(findings=[info_finding("bad \x01 byte")], files_scanned=1, files_parsed=1))
    failure = ET.fromstring(out).find(".//failure")
    assert failure.get("message") == "bad \ufffd byte"


# -- JSON, concise, text --------------------------------------------------------------------------------


def test_json_keys(project):
    code, out, _ = scan_format(project, "json")
    assert code == 1
    data = json.loads(out)
    assert data["summary"]["findings"] == len(data["findings"]) == 2
    assert data["summary"]["files"] == 3
    required = {"rule", "severity", "path", "line", "column", "end_line", "end_column", "message", "fix"}
    for finding in data["findings"]:
        assert required <= set(finding), required - set(finding)
    amp = next(f for f in data["findings"] if f["rule"] == "TC202")
    assert (amp["path"], amp["line"], amp["column"], amp["end_line"], amp["end_column"]) == ("pkg/bad.py", 2, 10, 2, 35)
    assert amp["severity"] == "warning"
    assert amp["fix"]["class"] == "safe"


def test_concise_line_shape(project):
    code, out, _ = scan_format(project, "concise")
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(r"[^:\s]+:\d+:\d+: TC\d{3} \S.*", line), line
    assert lines[1].startswith("pkg/bad.py:2:10: TC202 `torch.cuda.amp.GradScaler` is deprecated")


def test_text_has_a_code_frame_and_a_summary(project):
    code, out, _ = scan_format(project, "text")
    assert code == 1
    lines = out.splitlines()
    assert "pkg/bad.py" in lines
    flagged_line = re.compile(r"\s*> 2 \| scaler = torch\.cuda\.amp\.GradScaler\(\)")
    frame = next(i for i, line in enumerate(lines) if flagged_line.fullmatch(line))
    assert re.fullmatch(r"\s*1 \| import torch", lines[frame - 1])
    caret = lines[frame + 1]
    assert caret.strip() == "^" * len("torch.cuda.amp.GradScaler")
    assert caret.index("^") == lines[frame].index("torch.cuda")
    assert lines[-1] == (
        "Found 2 findings (1 error, 1 warning) in 2 files (3 scanned). 1 fixable with `tcaudit fix`. "
        "Top: TC000 parse-error (broken.py:1)."
    )


def test_text_clean_summary(project):
    code, out, _ = scan_format(project, "text", "clean.py")
    assert code == 0
    assert out.strip() == "All clear: no findings in 1 file."


def test_text_binary_file_has_no_garbage_frame(tmp_path):
    (tmp_path / "blob.py").write_bytes(b"\x00\x01\xff\xfe")
    code, out, _ = run_cli("scan", "blob.py", *SELECT, cwd=tmp_path)
    assert code == 1
    assert "binary file" in out
    assert "|" not in out and "\ufffd" not in out


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_writes_to_an_output_file(project, fmt):
    code, out, err = run_cli("scan", ".", "--format", fmt, *SELECT, "-o", "report.out", cwd=project)
    assert code == 1, err
    assert out == ""
    written = (project / "report.out").read_text(encoding="utf-8")
    assert "TC202" in written


def test_text_orders_a_file_by_impact_then_severity_then_line():
    def finding(line: int, severity: Severity, rule: str) -> Finding:
        return Finding(rule=rule, name="x", severity=severity, location=Location("t.py", line, 1, line, 2), message=f"m{line}")

    result = ScanResult(
        findings=[
            finding(1, Severity.INFO, "TC305"),
            finding(2, Severity.WARNING, "TC601"),
            finding(3, Severity.ERROR, "TC501"),
            finding(4, Severity.WARNING, "TC402"),
            finding(5, Severity.ERROR, "TC208"),
        ],
        files_scanned=1,
        files_parsed=1,
    )
    heads = [line for line in render("text", result).splitlines() if line.startswith("t.py:")]
    # Errors first; then TC305 (info, with a measured speedup) and TC601 (warning, with a smaller one);
    # then the rest, warnings before info (tcaudit/report/order.py).
    assert [h.split(":")[1] for h in heads] == ["3", "5", "1", "2", "4"]
