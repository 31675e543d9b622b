"""scan promises exactly what fix does, on every fixture.

For each script: every finding that ``scan`` marks fixable (available, and enabled by the fix classes
and structural options of the run) is fixed by ``tcaudit fix``, and is never declined by it; every
rule whose fix changed the file was reported by ``scan`` as fixable, except the companions that a
structural conversion asked for completes in the next round (tcaudit/structural.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import scan
from tcaudit.findings import FixClass
from tcaudit.fix.engine import fix_enabled, fix_file
from tcaudit.structural import CONVERSIONS, companion_enabled

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
DEFAULT_CLASSES = frozenset({FixClass.SAFE, FixClass.NUMERICS})
STRUCTURAL_PREFIXES = {c.name.upper(): c for c in CONVERSIONS}


def _fix_fixture_settings(path: Path) -> Settings:
    """The settings test_fix.py fixes each ``fixtures/fix`` pair with (by file-name prefix)."""
    prefix = path.name.split("_")[0].upper()
    if prefix == "PAD":  # the width padding of TC101/TC102, asked for with ``--pad-dims``
        return Settings(select=("TC101", "TC102"), pad_dims=True, root=path.parent)
    if prefix in STRUCTURAL_PREFIXES:
        conversion = STRUCTURAL_PREFIXES[prefix]
        select = ("TC5",) if conversion.name == "ddp" else conversion.rules
        return Settings(select=select, structural_fixes=(conversion.name,), root=path.parent)
    return Settings(select=("ALL",) if prefix == "ALL" else (prefix,), root=path.parent)


CASES = [
    *((p, _fix_fixture_settings(p)) for p in sorted((FIXTURES / "fix").glob("*.in.py"))),
    *((p, Settings(root=p.parent)) for p in sorted((FIXTURES / "scripts").glob("*.py"))),
    (FIXTURES / "resnet50" / "train.py", Settings(root=FIXTURES / "resnet50")),
    *(
        (FIXTURES / "resnet50" / "train.py", Settings(root=FIXTURES / "resnet50", structural_fixes=(c.name,)))
        for c in CONVERSIONS
    ),
]


def _case_id(case) -> str:
    path, settings = case
    options = "+".join(settings.structural_fixes)
    return f"{path.parent.name}/{path.name}" + (f"[{options}]" if options else "")


def _key(finding) -> tuple[str, str, str]:
    return (finding.rule, finding.message, " ".join(finding.source_line.split()))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_scan_promises_exactly_what_fix_does(case):
    path, settings = case
    result = scan([str(path)], settings, model_audit=False)
    assert not result.errors, result.errors
    promised = [
        f for f in result.findings
        if f.fix is not None and f.fix.available and fix_enabled(f, DEFAULT_CLASSES, settings.fix_options)
    ]
    fixed = fix_file(path, settings, DEFAULT_CLASSES, path.name)
    if any(f.rule == "TC000" for f in result.findings):  # a file Python cannot parse: fix says so, changes nothing
        assert fixed.error is not None and fixed.error.startswith("not fixed: cannot parse"), fixed.error
        assert not promised and fixed.fixed == fixed.original
        return
    assert fixed.error is None, fixed.error

    declined_keys = {_key(f): reason for f, reason in fixed.declined}
    broken = {f"{f.rule} line {f.location.line}: {declined_keys[_key(f)]}" for f in promised if _key(f) in declined_keys}
    assert not broken, f"scan said fixable, fix declined: {sorted(broken)}"

    not_applied = sorted({f.rule for f in promised} - set(fixed.applied))
    assert not not_applied, f"scan said fixable, fix did not change the file for {not_applied}"

    unreported = sorted(
        rule for rule in set(fixed.applied) - {f.rule for f in promised}
        if not companion_enabled(rule, settings.structural_fixes)
    )
    assert not unreported, f"fix applied {unreported}, which scan did not report as fixable"


def test_the_naive_resnet50_scan_shows_channels_last_as_fixable():
    """channels_last is the largest single win for a convnet under AMP on Hopper (on an H200, bf16
    autocast alone gave ResNet50 1.10x, with channels_last 2.13x); scan must show it before the
    autocast fix is made, not on a second scan after it."""
    path = FIXTURES / "resnet50" / "train.py"
    result = scan([str(path)], Settings(root=path.parent), model_audit=False)
    channels_last = [f for f in result.findings if f.rule == "TC303"]
    assert channels_last and all(f.fix is not None and f.fix.available for f in channels_last)
    assert "TC201" in channels_last[0].message
