"""Rules are leaves (issue 27): a rule module (``tcaudit/rules/<wing>/tcNNN_*.py``, script and model
rules alike) imports no other rule module; what two rules share lives below them: analysis in
``tcaudit/script/``, editing in ``tcaudit/rewrite/``, what one family shares in its wing's helpers.
The rest of the layout (wings, floors, no cycles) is held by tests/test_layers.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

RULES = REPO / "tcaudit" / "rules"
RULE_MODULE = re.compile(r"tc\d{3}_\w+")


def _rule_modules() -> list[Path]:
    return sorted(p for p in RULES.rglob("*.py") if RULE_MODULE.fullmatch(p.stem))


def imported_rule_modules(path: Path) -> set[str]:
    """The rule modules ``path`` imports anywhere (at the top, inside functions, relatively)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # ``from .tc201_x import ...`` or ``from . import tc201_x``
                base = f"tcaudit.rules.{path.parent.name}" + (f".{node.module}" if node.module else "") if node.level == 1 else ""
            else:
                base = node.module or ""
            dotted = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            if parts[:2] == ["tcaudit", "rules"]:
                found.update(part for part in parts[2:] if RULE_MODULE.fullmatch(part))
    found.discard(path.stem)
    return found


def test_there_are_rule_modules_to_check():
    assert len(_rule_modules()) > 60


def test_no_rule_module_imports_another():
    imports = {(path.stem, other) for path in _rule_modules() for other in imported_rule_modules(path)}
    assert imports == set(), (
        "move what the rules share into tcaudit/script/ or tcaudit/rewrite/; a rule that reads another's "
        "outcome declares it in `after` and asks RuleContext.findings_of / fixable / fixed_by"
    )


def _script_rules():
    from tcaudit.rules.registry import discover_script_rules

    return discover_script_rules()


OUTCOME_CALL = re.compile(r"context\.(?:findings_of|fixable|fixed_by)\(\s*\"(TC\d{3})\"")
WAITS_FOR = re.compile(r"(?:FollowsFix\(\s*|after(?::\s*str)?\s*=\s*)\"(TC\d{3})\"")


def test_a_rule_declares_every_rule_whose_outcome_it_reads_or_whose_fix_it_waits_for():
    """``after`` is the one record of how rules depend on each other: the engine orders checks and fixes
    by it, so a rule that reads another's findings (or waits for its fix) without declaring it would
    read nothing, or fix out of order."""
    import inspect
    import sys

    missing = []
    for rule_id, cls in sorted(_script_rules().items()):
        text = inspect.getsource(sys.modules[cls.__module__])
        named = set(OUTCOME_CALL.findall(text)) | set(WAITS_FOR.findall(text))
        if "context.compiles_trained_models(" in text:
            named.add("TC305")  # RuleContext.compiles_trained_models reads TC305's findings
        for leader in sorted(named - {rule_id} - set(cls.after)):
            missing.append(f"{rule_id} reads {leader} without `after`")
    assert not missing, missing


def test_after_names_real_rules_and_has_no_cycle():
    from tcaudit.rules.base import in_rule_order

    rules = _script_rules()
    for rule_id, cls in rules.items():
        assert set(cls.after) <= set(rules), f"{rule_id}.after names unknown rules"
    ordered = [r.id for r in in_rule_order([cls() for cls in rules.values()])]
    position = {rule: index for index, rule in enumerate(ordered)}
    for rule_id, cls in rules.items():
        assert all(position[leader] < position[rule_id] for leader in cls.after), rule_id


def test_attribution_groups_come_from_the_rules_declarations():
    """``verify --attribute`` leaves rules out together by what the rules declare (``fixed_with``) and the
    structural conversions' members, not by a list of its own; these are the groups it has measured by."""
    from tcaudit.verify.attribution import groups_for, rule_groups

    rules = _script_rules()
    for rule_id, cls in rules.items():
        assert set(cls.fixed_with) <= set(rules) - {rule_id}, f"{rule_id}.fixed_with names unknown rules"
    assert rule_groups() == (
        ("TC201", "TC202", "TC203", "TC204", "TC205", "TC207"),
        ("TC401", "TC404"),
        ("TC402", "TC403"),
        ("TC501", "TC502", "TC503", "TC504", "TC505", "TC506", "TC507"),
    )
    # Only the rules that changed the file, in the order they first did; the others stand alone.
    assert groups_for(["TC303", "TC204", "TC201", "TC402", "TC301"]) == [
        ("TC303",), ("TC201", "TC204"), ("TC402",), ("TC301",),
    ]


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "tc999_probe.py"
    module.write_text(
        "def check():\n"
        "    from tcaudit.rules.amp.tc201_missing_autocast import MissingAutocast\n"
        "    import tcaudit.rules.amp.tc206_half_model_training\n"
        "    from tcaudit.rules import tc304_legacy_jit_flags\n"
        "    from .tc503_ddp_without_distributed_sampler import DdpWithoutDistributedSampler\n"
        "    from tcaudit.rules.base import ScriptRule\n",
        encoding="utf-8",
    )
    assert imported_rule_modules(module) == {
        "tc201_missing_autocast", "tc206_half_model_training", "tc304_legacy_jit_flags",
        "tc503_ddp_without_distributed_sampler",
    }
