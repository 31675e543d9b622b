"""Each fixable finding's own edits: what its fix alone changes in the text scan analysed.

``scan`` runs the finding's codemod on the parsed file with that one finding and keeps the change as
text edits (tcaudit/rewrite/textedits.py), behind the same safety net ``tcaudit fix`` uses
(``rules.base.fixed_text``). A fix that waits for another rule's fix (its plan names that rule in
``after``: it is worded for the script once that fix is made) gets the leader's fixes made first, in
memory, and carries both: applied to the original text, its edits give the file with the leader's fix
and its own. A fix whose edits cannot be made alone keeps ``edits=None`` (``tcaudit fix`` still makes it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from tcaudit.findings import Finding
from tcaudit.rewrite.textedits import edits_between, line_map

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
) -> list[Finding]:
    """``findings`` (of ``facts``'s text), each available fix given its edits where they can be made.
    ``lines``: (first, last): only the findings whose span meets those lines (an editor's code action
    asks for one place; each fix's edits cost a codemod run)."""
    from tcaudit.rules.base import codemod_of, fixed_text

    by_id = {rule.id: rule for rule in rules}
    for finding in findings:
        if lines is not None and (finding.location.end_line < lines[0] or finding.location.line > lines[1]):
            continue
        fix = finding.fix
        rule = by_id.get(finding.rule)
        if fix is None or not fix.available or fix.plan is None or rule is None or codemod_of(rule) is None:
            continue
        leader = finding.waits_for
        if leader is None:
            new_text = fixed_text(facts, [finding], rule, settings)
        else:
            new_text = _after_leader(facts, finding, context.fixed_by(leader, facts), rule, context)
        if new_text is not None:
            finding.fix = dataclasses.replace(fix, edits=edits_between(facts.source.text, new_text))
    return findings


def _after_leader(
    facts: "ScriptFacts",
    finding: Finding,
    after: "ScriptFacts | None",
    rule: "ScriptRule",
    context: "RuleContext",
) -> str | None:
    """The text after the leader's fixes and then this finding's own, made from the leader's text."""
    if after is None:
        return None
    from tcaudit.rules.base import fixed_text

    line = line_map(facts.source.text, after.source.text).get(finding.location.line)
    key = _line_key(finding.source_line)
    try:
        found = [
            f for f in rule.check(after, context)
            if f.fix is not None and f.fix.available and f.waits_for is None
        ]
    except Exception:  # noqa: BLE001 - the finding stands without edits
        return None
    # The same statement in the leader's text: by its text (the leader may re-indent it, under a new
    # ``with``), the nearest to where its line went when the text repeats; by the line itself when
    # the leader's edit changed that line (a keyword added to the same call).
    candidates = [f for f in found if _line_key(f.source_line) == key] or [f for f in found if f.location.line == line]
    if len(candidates) > 1 and line is not None:
        distance = sorted(abs(f.location.line - line) for f in candidates)
        if distance[0] < distance[1]:
            candidates = [f for f in candidates if abs(f.location.line - line) == distance[0]]
    if len(candidates) != 1:
        return None
    return fixed_text(after, candidates, rule, context.settings)


def _line_key(line: str) -> str:
    return " ".join(line.split())
