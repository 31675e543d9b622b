"""fix reaches what scan asks for (issue 27, item 3): the reverse of test_scan_fix_agreement.py.

For each case of that file (and the bundled DCGAN benchmark script): after ``fix`` writes its text,
``scan`` of the fixed file, with the same settings, reports

(a) no finding of a rule whose fix was applied on a line the fix inserted or changed (a fix does
    not write what its own rule, or another applied rule, flags); a finding that scan of the original
    already had, by rule, on the original line a changed (not inserted) line stands for (``FileFix.original_line``),
    is not the fix's doing (one fix adding ``pin_memory=True`` to a loader whose TC401 stays declined),
    unless it is still fixable, which (b) reports; and
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


def _written_lines(original: str, fixed: str) -> dict[int, str]:
    """1-based lines of ``fixed`` that the fix changed ('replace') or inserted ('insert')."""
    matcher = difflib.SequenceMatcher(None, original.splitlines(), fixed.splitlines(), autojunk=False)
    return {
        j + 1: tag
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


def _describe(finding, lines: list[str], writers: dict[str, set[str]] | None = None) -> str:
    line = finding.location.line
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    out = f"{finding.rule} line {line}: {finding.message}\n        | {text}"
    if writers is not None:
        rules = sorted(rule for rule, kept in writers.items() if text not in kept)
        out += f"\n        written by the fix of {', '.join(rules) if rules else '(no single applied rule)'}"
    return out


def _writers(path: Path, settings: Settings, applied: list[str]) -> dict[str, set[str]]:
    """For each applied rule, the stripped lines of the fix made with that rule ignored: a line missing
    there was written by that rule's fix (or by a fix that follows it)."""
    return {
        rule: {line.strip() for line in fix_file(path, replace(settings, ignore=(*settings.ignore, rule)),
                                                 DEFAULT_CLASSES, path.name).fixed.splitlines()}
        for rule in applied
    }


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_scan_after_fix_finds_nothing_left_to_fix(case, tmp_path):
    path, settings = case
    fixed = fix_file(path, settings, DEFAULT_CLASSES, path.name)
    if fixed.error is not None and fixed.error.startswith("not fixed: cannot parse"):  # (a Python 2 fixture)
        assert fixed.fixed == fixed.original
        return
    assert fixed.error is None, fixed.error
    target = _fixed_copy(path, fixed, tmp_path)
    result = scan([str(target)], replace(settings, root=tmp_path), model_audit=False)
    assert not result.errors, result.errors

    lines = fixed.fixed.splitlines()
    written = _written_lines(fixed.original, fixed.fixed)
    on_written = [f for f in result.findings if f.rule in fixed.applied and f.location.line in written]
    if on_written:  # (the original's findings are needed only then: a scan of every fixture saved)
        before = scan([str(path)], settings, model_audit=False)
        assert not before.errors, before.errors
        had = {(f.rule, f.location.line) for f in before.findings}
        on_written = [
            f for f in on_written
            if not (written[f.location.line] == "replace" and (f.rule, fixed.original_line(f.location.line)) in had)
        ]
    still_fixable = [
        f for f in result.findings
        if f.fix is not None and f.fix.available and fix_enabled(f, DEFAULT_CLASSES, settings.fix_options)
    ]
    problems = []
    if on_written:
        writers = _writers(path, settings, fixed.applied)
        problems.append(
            f"scan flags lines that fix wrote, with rules whose fix was applied ({', '.join(fixed.applied)}):\n"
            + "\n".join("  " + _describe(f, lines, writers) for f in on_written)
        )
    if still_fixable:
        problems.append(
            "scan of the fixed file still marks these fixable (fix stopped short of its fixed point):\n"
            + "\n".join("  " + _describe(f, lines) for f in still_fixable)
        )
    assert not problems, "\n".join(problems) + "\n--- the fix's diff:\n" + fixed.diff()
