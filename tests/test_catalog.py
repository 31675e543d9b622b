"""The catalog and the implementations cannot drift; every rules/ example runs."""

from __future__ import annotations

import re

import pytest

from tcaudit.catalog import load_catalog, rules_dir
from tcaudit.rules.registry import discover_script_rules

from helpers import scan_code

CATALOG = load_catalog()
SPEC_IDS = {
    "TC000", "TC101", "TC102", "TC103", "TC104", "TC105", "TC106", "TC110", "TC111", "TC112",
    "TC201", "TC202", "TC203", "TC204", "TC205", "TC206", "TC207", "TC208",
    "TC301", "TC302", "TC303", "TC304", "TC305", "TC306", "TC307",
    "TC401", "TC402", "TC403", "TC404", "TC405", "TC406",
    "TC501", "TC502", "TC503", "TC504", "TC505", "TC506", "TC507",
    "TC601", "TC602", "TC603", "TC604",
}


def implemented_ids() -> set[str]:
    ids = set(discover_script_rules())
    ids.add("TC000")  # the engine itself reports parse errors
    ids.add("TC001")  # and unused suppressions, in its filtering stage (tcaudit/unused_suppressions.py)
    try:
        from tcaudit.rules.registry import discover_model_rules
    except ImportError:
        return ids
    return ids | set(discover_model_rules())


def test_every_catalog_entry_has_an_implementation():
    missing = sorted(set(CATALOG) - implemented_ids())
    assert not missing, f"catalog entries without an implementation: {missing}"


def test_every_implementation_has_a_catalog_entry():
    missing = sorted(implemented_ids() - set(CATALOG))
    assert not missing, f"implementations without a rules/ entry: {missing}"


def test_rule_files_are_well_formed():
    for path in sorted(rules_dir().glob("*.toml")):
        assert re.fullmatch(r"TC\d{3}", path.stem), path
    for spec in CATALOG.values():
        assert spec.bad, f"{spec.id} needs at least one bad example"
        assert spec.good, f"{spec.id} needs at least one good example"
        assert spec.summary and spec.why


def _examples(kind: str):
    for spec in CATALOG.values():
        for index, example in enumerate(getattr(spec, kind)):
            yield pytest.param(spec, example, id=f"{spec.id}-{kind}{index}")


def _scan(spec, tmp_path, code):
    needs_model = spec.needs == "model"
    if needs_model:
        pytest.importorskip("torch")
    return scan_code(tmp_path, code, select=(spec.id,), model_audit=needs_model)


@pytest.mark.parametrize("spec,example", list(_examples("bad")))
def test_bad_example_fires(spec, example, tmp_path):
    result = _scan(spec, tmp_path, example.code)
    hits = [f for f in result.findings if f.rule == spec.id]
    assert hits, f"{spec.id} did not fire on its bad example:\n{example.code}"
    if example.expect is not None:
        assert len(hits) == example.expect, [f.message for f in hits]


@pytest.mark.parametrize("spec,example", list(_examples("good")))
def test_good_example_is_silent(spec, example, tmp_path):
    result = _scan(spec, tmp_path, example.code)
    hits = [f"{f.location.line}: {f.message}" for f in result.findings if f.rule == spec.id]
    assert not hits, f"{spec.id} fired on its good example:\n{example.code}\n{hits}"


def test_spec_rule_ids_are_all_in_the_catalog():
    """The ids SPEC.md lists are public; none may disappear."""
    missing = sorted(SPEC_IDS - set(CATALOG))
    assert not missing, f"SPEC.md rules missing from rules/: {missing}"


def _fixable_examples():
    for spec in CATALOG.values():
        for index, example in enumerate(spec.bad):
            if example.fixed is not None:
                yield pytest.param(spec, example, id=f"{spec.id}-fixed{index}")


FIXABLE = list(_fixable_examples())


# Rules whose fix is offered only on evidence from a `tcaudit verify` run of the same script text, or from
# the model audit (TC108's `fix --fp8` picks the layers from it): a TOML example cannot carry that run,
# so their exact before/after lives in their own test.
FIX_NEEDS_A_RUN = {"TC508": "tests/test_rule_tc508.py", "TC108": "tests/test_issue52_fp8.py"}


def test_every_fixable_rule_shows_its_fix():
    """A rule whose codemod exists carries at least one bad example with its exact fixed form."""
    from tcaudit.rules.registry import discover_codemods

    with_fixed = {spec.id for spec, _ in (p.values for p in FIXABLE)}
    missing = sorted(set(discover_codemods()) - with_fixed - set(FIX_NEEDS_A_RUN))
    assert not missing, f"rules with a codemod but no `fixed` example: {missing}"


def _expanded(fixed: str) -> str:
    """A fixed form with TC405's one-line stand-in for the inserted DALI helper block, expanded."""
    from tcaudit.rules.pipeline.tc405_cpu_image_decode import HELPER_PLACEHOLDER, helper_block

    return fixed.replace(HELPER_PLACEHOLDER + "\n", helper_block())


@pytest.mark.parametrize("spec,example", FIXABLE)
def test_bad_example_turns_into_its_fixed_form(spec, example, tmp_path):
    from tcaudit.config import STRUCTURAL_OPTIONS, Settings
    from tcaudit.fix.engine import fix_file

    path = tmp_path / "train.py"
    path.write_text(example.code.lstrip("\n"), encoding="utf-8")
    # Structural rules' fixed forms are what ``fix --ddp/--dali/--compile`` writes; TC101/TC102's what
    # ``fix --pad-dims`` writes.
    settings = Settings(select=(spec.id,), structural_fixes=STRUCTURAL_OPTIONS, pad_dims=True)
    result = fix_file(path, settings)
    assert result.error is None
    assert result.fixed == _expanded(example.fixed.lstrip("\n")), result.diff()
    path.write_text(result.fixed, encoding="utf-8")
    assert not fix_file(path, settings).changed
