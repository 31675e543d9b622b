"""fix reaches what scan asks for (issue 27, item 3): the reverse of test_scan_fix_agreement.py.

For each case of that file (and the bundled DCGAN benchmark script): after ``fix`` writes its text,
``scan`` of the fixed file, with the same settings, reports

(a) no finding of a rule whose fix was applied on a line the fix inserted or changed (a fix does
    not write what its own rule, or another applied rule, flags), and
(b) no finding that is still fixable (fix available and enabled by the run's classes and options):
    fix stopped at its fixed point, not short of it.
"""

from __future__ import annotations

import difflib
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import scan
from tcaudit.fix.engine import fix_enabled, fix_file
from test_scan_fix_agreement import CASES as AGREEMENT_CASES
from test_scan_fix_agreement import DEFAULT_CLASSES, REPO, _case_id

DCGAN = REPO / "benchmarks" / "realworld" / "dcgan.py"
CASES = [*AGREEMENT_CASES, (DCGAN, Settings(root=DCGAN.parent))]


def _written_lines(original: str, fixed: str) -> set[int]:
    """1-based lines of ``fixed`` that the fix inserted or changed."""
    matcher = difflib.SequenceMatcher(None, original.splitlines(), fixed.splitlines(), autojunk=False)
    return {
        j + 1
        for tag, _, _, j1, j2 in matcher.get_opcodes()
        if tag in ("replace", "insert")
        for j in range(j1, j2)
    }


def _fixed_copy(path: Path, fixed, tmp_path: Path) -> Path:
    """The fixed text, in the file's own encoding and line endings, under the same name, beside copies
    of the fixture's sibling scripts (some import each other)."""
    for sibling in path.parent.glob("*.py"):
        if sibling != path:
            shutil.copyfile(sibling, tmp_path / sibling.name)
    target = tmp_path / path.name
    target.write_bytes(fixed.source.encode(fixed.fixed))
    return target


def _describe(finding, lines: list[str]) -> str:
    line = finding.location.line
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{finding.rule} line {line}: {finding.message}\n        | {text}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_scan_after_fix_finds_nothing_left_to_fix(case, tmp_path):
    path, settings = case
    fixed = fix_file(path, settings, DEFAULT_CLASSES, path.name)
    assert fixed.error is None, fixed.error
    target = _fixed_copy(path, fixed, tmp_path)
    result = scan([str(target)], replace(settings, root=tmp_path), model_audit=False)
    assert not result.errors, result.errors

    lines = fixed.fixed.splitlines()
    written = _written_lines(fixed.original, fixed.fixed)
    on_written = [f for f in result.findings if f.rule in fixed.applied and f.location.line in written]
    still_fixable = [
        f for f in result.findings
        if f.fix is not None and f.fix.available and fix_enabled(f, DEFAULT_CLASSES, settings.fix_options)
    ]
    problems = []
    if on_written:
        problems.append(
            f"scan flags lines that fix wrote, with rules whose fix was applied ({', '.join(fixed.applied)}):\n"
            + "\n".join("  " + _describe(f, lines) for f in on_written)
        )
    if still_fixable:
        problems.append(
            "scan of the fixed file still marks these fixable (fix stopped short of its fixed point):\n"
            + "\n".join("  " + _describe(f, lines) for f in still_fixable)
        )
    assert not problems, "\n".join(problems) + "\n--- the fix's diff:\n" + fixed.diff()
