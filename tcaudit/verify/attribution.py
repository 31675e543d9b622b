"""``verify --attribute``: which rule's edits bought what, by leaving each out of the patch in turn.

Leave-one-out over the rules that changed the file: for each group, the fix engine makes the patch
again with that group ignored, and that copy runs in every round beside the original and the full
patch. A group's contribution is full-patch throughput over leave-out throughput, paired by round,
with the same interval as the speedup.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


def rule_groups() -> tuple[tuple[str, ...], ...]:
    """The rules whose edits only make sense together, left out together: each rule with those it
    names in ``fixed_with`` (fp16 autocast and its GradScaler fixes, pinned memory and non_blocking
    copies, workers and persistent workers), and each structural conversion with its rules and
    companions (tcaudit/structural.py), joined where they share a rule. Groups of one are left out."""
    from tcaudit.rules.registry import discover_script_rules
    from tcaudit.structural import CONVERSIONS

    parent: dict[str, str] = {}

    def root(rule: str) -> str:
        while parent.setdefault(rule, rule) != rule:
            rule = parent[rule]
        return rule

    def join(first: str, second: str) -> None:
        parent[root(second)] = root(first)

    for rule_id, cls in discover_script_rules().items():
        for other in cls.fixed_with:
            join(other, rule_id)
    for item in CONVERSIONS:
        members = (*item.rules, *item.companions)
        for other in members[1:]:
            join(members[0], other)
    groups: dict[str, list[str]] = {}
    for rule in parent:
        groups.setdefault(root(rule), []).append(rule)
    return tuple(sorted(tuple(sorted(g)) for g in groups.values() if len(g) > 1))


def groups_for(applied: list[str]) -> list[tuple[str, ...]]:
    """The groups of rules that changed the file, in the order they were first applied."""
    known = rule_groups()
    groups: list[tuple[str, ...]] = []
    for rule in applied:
        group = next((g for g in known if rule in g), (rule,))
        members = tuple(r for r in group if r in applied)
        if members not in groups:
            groups.append(members)
    return groups


@dataclass
class LeaveOut:
    rules: tuple[str, ...]
    # The side whose runs measure the patch without these rules: its own copy, "original" when
    # nothing else is left, "patched" when leaving them out changes nothing, "unavailable" when the
    # fix engine could not make that patch.
    side: str
    copy: Path | None = None

    @property
    def label(self) -> str:
        return "without-" + "+".join(self.rules)


def plan(script: Path, work: Path, settings, classes, applied: list[str], full_text: str,
         original_text: str) -> list[LeaveOut]:
    """One patch per group, each made by the fix engine with that group ignored."""
    from tcaudit.fix.engine import fix_file
    from tcaudit.verify.copies import audited_models, copy_bytes, copy_name

    models = audited_models(script, settings)
    plans = []
    for rules in groups_for(applied):
        without = fix_file(script, dataclasses.replace(settings, ignore=(*settings.ignore, *rules)), classes,
                           models=models)
        entry = LeaveOut(rules, side="")
        if without.error:
            entry.side = "unavailable"
        elif without.fixed == full_text:
            entry.side = "patched"
        elif without.fixed == original_text:
            entry.side = "original"
        else:
            entry.side = entry.label
            folder = work / entry.label
            folder.mkdir(parents=True, exist_ok=True)
            entry.copy = folder / copy_name(script)
            entry.copy.write_bytes(copy_bytes(without.source, without.fixed))
            (folder / "patch.diff").write_text(without.diff())
        plans.append(entry)
    return plans
