"""Each fixable finding's own edits: what its fix alone changes in the text scan analysed.

``scan`` runs the finding's codemod on the parsed file with that one finding and keeps the change as
text edits (tcaudit/rewrite/textedits.py), behind the same safety net ``tcaudit fix`` uses
(``rules.base.fixed_text``). A fix that waits for another rule's fix (its plan names that rule in
``after``: it is worded for the script once that fix is made) gets the leader's fixes made first, in
memory, and carries both: applied to the original text, its edits give the file with the leader's fix
and its own. A fix whose edits cannot be made alone keeps ``edits=None`` (``tcaudit fix`` still makes it).

Each fix is made on the smallest region of the module that holds it (``rules.base.made_in_region``:
the top-level statements its plan touches, every module-level statement, placeholders for the other
functions and classes), so one finding's edits cost its own statements, not the whole module; and, where
the caller asks (``Settings.fix_edits == "lazy"``: the Python API's and the editor's default), only when
``finding.fix.edits`` is first read.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from tcaudit.findings import Finding, PendingEdits, TextEdit
from tcaudit.rewrite.textedits import edits_between, position_map
from tcaudit.source.deep import call_with_deep_stack

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.rules.base import RuleContext, ScriptRule
    from tcaudit.script.facts import ScriptFacts


def with_edits(
    facts: "ScriptFacts",
    findings: list[Finding],
    rules: "Sequence[ScriptRule]",
    settings: "Settings",
    context: "RuleContext",
    lines: "tuple[int, int] | None" = None,
    lazy: bool = False,
) -> list[Finding]:
    """``findings`` (of ``facts``'s text), each available fix given its edits where they can be made.
    ``lines``: (first, last): only the findings whose span meets those lines (an editor's code action
    asks for one place; each fix's edits cost a codemod run). ``lazy``: each fix gets its edits as
    :class:`~tcaudit.findings.PendingEdits`, made for that finding alone the first time
    ``finding.fix.edits`` is read (the analysis is kept until then)."""
    from tcaudit.rules.base import codemod_of

    by_id = {rule.id: rule for rule in rules}
    # Per (follower rule, leader): the leader's text, made once, with the follower's findings there.
    after_leaders: dict[tuple[str, str], _LeaderText | None] = {}

    def made(finding: Finding, rule: "ScriptRule") -> "tuple[TextEdit, ...] | None":
        # An editor's older analysis, asked after the document's next one began (a quick fix racing the
        # typing): its facts may be the next text's in part, so it makes no edits (ScriptFacts.outdated).
        if facts.outdated:
            return None
        edits = edits_of(finding, rule)
        return None if facts.outdated else edits

    def edits_of(finding: Finding, rule: "ScriptRule") -> "tuple[TextEdit, ...] | None":
        from tcaudit.rules.base import fixed_edits

        leader = finding.waits_for
        if leader is None:
            return fixed_edits(facts, [finding], rule, settings)
        else:
            key = (rule.id, leader)
            if key not in after_leaders:
                after_leaders[key] = _leader_text(facts, context.fixed_by(leader, facts), rule, context)
            new_text = _after_leader(finding, after_leaders[key], rule, context)
        return None if new_text is None else edits_between(facts.source.text, new_text)

    for finding in findings:
        if lines is not None and (finding.location.end_line < lines[0] or finding.location.line > lines[1]):
            continue
        fix = finding.fix
        rule = by_id.get(finding.rule)
        if fix is None or not fix.available or fix.plan is None or rule is None or codemod_of(rule) is None:
            continue
        if lazy:
            # Made on a deep stack, as the scan was: deeply nested code needs it for the codemod too.
            pending = PendingEdits(functools.partial(call_with_deep_stack, made, finding, rule))
            finding.fix = dataclasses.replace(fix, edits=pending)
            continue
        edits = made(finding, rule)
        if edits is not None:
            finding.fix = dataclasses.replace(fix, edits=edits)
    return findings


@dataclass(frozen=True)
class _LeaderText:
    """The text after a leader's fixes (``context.fixed_by``: the one place that makes it), where each
    position of the original went in it, and a follower rule's fixable findings there."""

    after: "ScriptFacts"
    where: "Callable[[int, int], tuple[int, int] | None]"
    found: list[Finding]


def _leader_text(
    facts: "ScriptFacts", after: "ScriptFacts | None", rule: "ScriptRule", context: "RuleContext"
) -> _LeaderText | None:
    """What the follower ``rule``'s findings are matched against; None where the leader made no text or
    the rule fails on it (its findings then stand without edits)."""
    if after is None:
        return None
    try:
        found = [
            f for f in rule.check(after, context)
            if f.fix is not None and f.fix.available and f.waits_for is None
        ]
    except Exception:  # noqa: BLE001 - the findings stand without edits
        return None
    return _LeaderText(after, position_map(facts.source.text, after.source.text), found)


def _after_leader(
    finding: Finding, leader: _LeaderText | None, rule: "ScriptRule", context: "RuleContext"
) -> str | None:
    """The text after the leader's fixes and then this finding's own, made from the leader's text: the
    rule's finding there on the node this finding's node became
    (:func:`~tcaudit.rewrite.textedits.position_map`: the leader may re-indent the statement under a new
    ``with``, or add a keyword to the same call), never a finding picked by its line's text."""
    if leader is None:
        return None
    from tcaudit.rules.base import fixed_text

    location = finding.location
    start = leader.where(location.line, location.column)
    end = leader.where(location.end_line, location.end_column - 1) if location.end_column > 1 else None
    if start is None:
        return None
    found = leader.found
    # The node where this finding's node went; else the one node inside it (the leader's fix may give
    # the follower a new node to stand on there: TC504 at the sampler TC503 put into the loader's call).
    candidates = [f for f in found if (f.location.line, f.location.column) == start]
    if len(candidates) > 1:  # nodes that start at one place (a call and its callee): the one that ends there too
        candidates = [f for f in candidates if (f.location.end_line, f.location.end_column - 1) == end]
    if not candidates and end is not None:
        candidates = [f for f in found if start <= (f.location.line, f.location.column)
                      and (f.location.end_line, f.location.end_column - 1) <= end]
    if len(candidates) != 1:
        return None
    return fixed_text(leader.after, candidates, rule, context.settings)
