"""A fix is a list of text edits: every fixable finding that ``scan`` reports carries the edits its
fix makes, and those edits, applied alone to the text scan read, give a file that compiles.

Also: the edits survive the scan cache, and JSON and SARIF carry them (ruff's ``fix.edits`` shape;
SARIF ``fixes`` with ``artifactChanges``/``replacements``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import scan
from tcaudit.findings import TextEdit
from tcaudit.fix.engine import fix_enabled, fix_file
from tcaudit.rewrite.textedits import apply_edits, edits_between, source_lines
from tcaudit.source.parsing import read_source

from test_scan_fix_agreement import CASES, DEFAULT_CLASSES, _case_id

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "resnet50" / "train.py"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_fixable_finding_has_edits_that_compile_alone(case):
    path, settings = case
    settings = dataclasses.replace(settings, fix_edits=True)
    text = read_source(path).text  # the text scan analysed (a BOM is not part of it)
    result = scan([str(path)], settings, model_audit=False)
    assert not result.errors, result.errors
    missing = []
    for finding in result.findings:
        fix = finding.fix
        if fix is None or not fix.available or not fix_enabled(finding, DEFAULT_CLASSES, settings.fix_options):
            continue
        if fix.edits is None:
            missing.append(f"{finding.rule} line {finding.location.line}")
            continue
        assert fix.edits, f"{finding.rule} line {finding.location.line}: an available fix with no edit"
        new = apply_edits(text, fix.edits)
        compile(new, str(path), "exec", dont_inherit=True)
    assert not missing, f"fixable findings without edits: {missing}"


@pytest.mark.parametrize("path", [REPO / "fixtures" / "fix" / "tc503_torchrun.in.py",
                                  REPO / "fixtures" / "scripts" / "tc5_mp_spawn_ddp.py"], ids=lambda p: p.stem)
def test_a_follower_finds_its_node_in_the_leaders_text(path):
    """TC504 waits for TC503's sampler, and TC503's fix rewrites the loader's line: TC504's finding is
    found again on the node its node became (the sampler inside that call), so it carries the leader's
    edits and its own, and they give exactly what ``fix`` writes for the two rules. (Found by the line's
    text it had none in tc503_torchrun, where TC503's fix changes that line.)"""
    settings = Settings(select=("TC503", "TC504"), root=path.parent, fix_edits=True)
    (finding,) = [f for f in scan([str(path)], settings, model_audit=False).findings if f.rule == "TC504"]
    assert finding.fix.edits, "TC504's fix has no edits"
    fixed = fix_file(path, settings, DEFAULT_CLASSES, path.name)
    assert fixed.applied == ["TC503", "TC504"]
    assert apply_edits(read_source(path).text, finding.fix.edits) == fixed.fixed


def test_a_single_fixable_finding_edits_exactly_what_fix_writes(tmp_path):
    """Where one finding is the file's only fix, its edits are fix's whole change."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n",
        encoding="utf-8",
    )
    settings = Settings(select=("TC202",), root=tmp_path, fix_edits=True)
    (finding,) = scan([str(script)], settings, model_audit=False).findings
    fixed = fix_file(script, settings, DEFAULT_CLASSES, script.name)
    assert fixed.changed
    assert apply_edits(script.read_text(), finding.fix.edits) == fixed.fixed
    assert all(edit.line == 3 for edit in finding.fix.edits)  # only the scaler's line changes


def test_edits_survive_the_cache(tmp_path):
    from tcaudit.cache import ScanCache

    script = tmp_path / "train.py"
    script.write_text(FIXTURE.read_text(encoding="utf-8"), encoding="utf-8")
    settings = Settings(root=tmp_path, fix_edits=True)
    cache = ScanCache.open(tmp_path / ".cache", settings, list(settings.enabled_rules()))
    cold = scan([str(script)], settings, model_audit=False, cache=cache)
    warm = scan([str(script)], settings, model_audit=False, cache=cache)
    assert warm.files_cached == 1
    assert [f.fix.edits if f.fix else None for f in cold.findings] == [f.fix.edits if f.fix else None for f in warm.findings]
    assert any(f.fix is not None and f.fix.edits for f in warm.findings)
    without = dataclasses.replace(settings, fix_edits=False)
    other = ScanCache.open(tmp_path / ".cache", without, list(without.enabled_rules()))
    plain = scan([str(script)], without, model_audit=False, cache=other)
    assert plain.files_cached == 0  # a scan without edits is keyed apart: it never reads entries without them
    assert all(f.fix is None or f.fix.edits is None for f in plain.findings)


def _cli_json(*args: str) -> dict:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tcaudit", "scan", *args], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def fixture_json() -> dict:
    return _cli_json(str(FIXTURE.relative_to(REPO)), "--no-exec", "--no-cache", "--format", "json")


def test_json_gives_ruff_shaped_edits(fixture_json):
    fixable = [f for f in fixture_json["findings"] if f["fix"] and f["fix"]["available"]]
    assert fixable
    text = FIXTURE.read_text(encoding="utf-8")
    for finding in fixable:
        fix = finding["fix"]
        assert fix["applicability"] == fix["class"]
        assert fix["edits"], finding
        for edit in fix["edits"]:
            assert set(edit) == {"content", "location", "end_location"}
            assert set(edit["location"]) == {"row", "column"} == set(edit["end_location"])
        compile(apply_edits(text, [TextEdit.from_dict(e) for e in fix["edits"]]), "train.py", "exec")
    declined = [f for f in fixture_json["findings"] if f["fix"] and not f["fix"]["available"]]
    assert all("edits" not in f["fix"] for f in declined)


def test_sarif_results_carry_fixes_that_validate():
    schema_path = REPO.parent / "shared" / "schemas" / "sarif-schema-2.1.0.json"
    if not schema_path.exists():
        pytest.skip(f"the official SARIF schema is not at {schema_path} (../shared/schemas/)")
    jsonschema = pytest.importorskip("jsonschema")
    log = _cli_json(str(FIXTURE.relative_to(REPO)), "--no-exec", "--no-cache", "--format", "sarif")
    jsonschema.validate(log, json.loads(schema_path.read_text(encoding="utf-8")))
    results = log["runs"][0]["results"]
    with_fixes = [r for r in results if r.get("fixes")]
    assert with_fixes
    text = FIXTURE.read_text(encoding="utf-8")
    for result in with_fixes:
        (fix,) = result["fixes"]
        (change,) = fix["artifactChanges"]
        assert change["artifactLocation"] == result["locations"][0]["physicalLocation"]["artifactLocation"]
        edits = []
        for replacement in change["replacements"]:
            region = replacement["deletedRegion"]
            edits.append(TextEdit(region["startLine"], region["startColumn"], region["endLine"], region["endColumn"],
                                  replacement.get("insertedContent", {}).get("text", "")))
        compile(apply_edits(text, edits), "train.py", "exec")


@pytest.mark.parametrize(
    "old,new",
    [
        ("a\nb\nc\n", "a\nB\nc\n"),
        ("a\nb\n", "a\nb\nc\n"),
        ("x = 1\r\ny = 2\r\n", "x = 1\r\nz = 0\r\ny = 2\r\n"),
        ("one\rtwo\r", "one\rtwo\rthree\r"),
        ("é = 1\n", "é = 2\n"),
        ("a\x0cb\n", "a\x0cc\n"),  # a form feed does not end a Python line
        ("", "import torch\n"),
        ("no newline", "no newline at all"),
    ],
)
def test_edits_between_round_trips(old, new):
    edits = edits_between(old, new)
    assert apply_edits(old, edits) == new
    assert "".join(source_lines(old)) == old


def test_apply_edits_refuses_overlaps():
    edits = [TextEdit(1, 1, 1, 3, "x"), TextEdit(1, 2, 1, 4, "y")]
    with pytest.raises(ValueError):
        apply_edits("abcdef\n", edits)
