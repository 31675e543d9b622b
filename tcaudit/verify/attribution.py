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

# Rules whose edits only make sense together are left out together:
RULE_GROUPS: tuple[tuple[str, ...], ...] = (
    # fp16 autocast is unsafe without its GradScaler, and the scaler fixes (deprecated API, bf16
    # scaler removal, unscale before clipping, backward outside autocast) edit the same steps.
    ("TC201", "TC202", "TC203", "TC204", "TC205", "TC207"),
    # non_blocking copies only overlap from pinned memory.
    ("TC402", "TC403"),
    # persistent workers need workers.
    ("TC401", "TC404"),
    # The DDP conversion and its companions (sampler, set_epoch, no_sync, bucket view, device switch).
    ("TC501", "TC502", "TC503", "TC504", "TC505", "TC506", "TC507"),
)


def groups_for(applied: list[str]) -> list[tuple[str, ...]]:
    """The groups of rules that changed the file, in the order they were first applied."""
    groups: list[tuple[str, ...]] = []
    for rule in applied:
        group = next((g for g in RULE_GROUPS if rule in g), (rule,))
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
    from tcaudit.verify.runner import audited_models

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
            entry.copy = folder / script.name
            entry.copy.write_bytes(without.source.encode(without.fixed))
            (folder / "patch.diff").write_text(without.diff())
        plans.append(entry)
    return plans
