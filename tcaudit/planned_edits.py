"""Each fixable finding's own edits: what its fix alone changes in the text scan analysed.

``scan`` runs the finding's codemod on the parsed file with that one finding and keeps the change as
text edits (tcaudit/rewrite/textedits.py), behind the same safety net ``tcaudit fix`` uses (the result
compiles, adds no unreachable code, uses no name before its import). A fix that waits for another
rule's fix (its plan is :class:`FollowsFix`) gets that rule's fix made first, in memory, and carries
both: applied to the original text, its edits give the file with the leader's fix and its own.
A fix whose edits cannot be made alone keeps ``edits=None`` (it is still made by ``tcaudit fix``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from tcaudit.findings import Finding, FollowsFix
from tcaudit.rewrite.textedits import edits_between

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.model_profile import AuditedModels
    from tcaudit.rules.base import Codemod, ScriptRule
    from tcaudit.script.facts import ScriptFacts

_CODEMODS: "dict[str, Codemod | None]" = {}


def codemod_of(rule: "ScriptRule") -> "Codemod | None":
    """The fix of ``rule``, from the rule's own module (already imported: the rule ran)."""
    if rule.id not in _CODEMODS:
        import sys

        from tcaudit.rules.base import Codemod, defined_in

        found = [c for c in defined_in(sys.modules[type(rule).__module__], Codemod) if c.rule == rule.id]
        _CODEMODS[rule.id] = found[0]() if found else None
    return _CODEMODS[rule.id]


def with_edits(
    facts: "ScriptFacts",
    findings: list[Finding],
    rules: "Sequence[ScriptRule]",
    settings: "Settings",
    models: "AuditedModels | None" = None,
) -> list[Finding]:
    """``findings`` (of ``facts``'s text), each available fix given its edits where they can be made."""
    by_id = {rule.id: rule for rule in rules}
    wanted = [
        f for f in findings
        if f.fix is not None and f.fix.available and f.fix.plan is not None
        and f.rule in by_id and codemod_of(by_id[f.rule]) is not None
    ]
    if not wanted:
        return findings
    leaders: dict[str, "tuple[ScriptFacts, str] | None"] = {}
    for finding in wanted:
        assert finding.fix is not None
        plan = finding.fix.plan
        leader = leader_of(finding)
        if leader is not None:
            if leader not in leaders:
                leader_rule = by_id.get(leader)
                leaders[leader] = None if leader_rule is None else _leader_applied(facts, findings, leader_rule, settings)
            new_text = _after_leader(facts, finding, leaders[leader], by_id.get(finding.rule), settings, models)
        else:
            new_text = _alone(facts, [finding], by_id[finding.rule], settings)
        if new_text is not None:
            finding.fix = dataclasses.replace(finding.fix, edits=edits_between(facts.source.text, new_text))
    return findings


def leader_of(finding: Finding) -> str | None:
    """The rule whose fix this finding's fix waits for (its plan's ``after``), or None."""
    plan = finding.fix.plan if finding.fix is not None else None
    after = getattr(plan, "after", None)
    return after if isinstance(after, str) and after != finding.rule else None


def _alone(facts: "ScriptFacts", findings: list[Finding], rule: "ScriptRule", settings: "Settings") -> str | None:
    """The text after the codemod of ``findings``' rule edits just them; None when it declines, fails
    or makes a text ``tcaudit fix`` would refuse."""
    from tcaudit.rewrite.codemod import DeclineFix, FixContext

    codemod = codemod_of(rule)
    if codemod is None:
        return None
    try:
        module = codemod.apply(facts.module, findings, FixContext(facts, settings))
        text = module.code
    except DeclineFix:
        return None
    except Exception:  # noqa: BLE001 - a codemod's failure costs only these edits; fix reports it
        return None
    if text == facts.source.text:
        return text
    return text if _acceptable(facts, module, text) else None


def _acceptable(before: "ScriptFacts", module, text: str) -> bool:
    """The safety net of ``tcaudit fix`` (tcaudit/fix/engine.py): the text compiles, and the edit adds
    neither unreachable code nor a name used before its import."""
    from tcaudit.script.guards import unreachable_statements, used_before_import

    try:
        compile(text, before.source.display_path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    if unreachable_statements(module) > unreachable_statements(before.module):
        return False
    return not (used_before_import(module) - used_before_import(before.module))


def _leader_applied(
    facts: "ScriptFacts", findings: list[Finding], leader: "ScriptRule", settings: "Settings"
) -> "tuple[ScriptFacts, str] | None":
    """The facts of the text with every available fix of ``leader`` made (and that text)."""
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import SourceError, SourceFile

    theirs = [
        f for f in findings
        if f.rule == leader.id and f.fix is not None and f.fix.available and leader_of(f) is None
    ]
    if not theirs:
        return None
    text = _alone(facts, theirs, leader, settings)
    if text is None:
        return None
    source = facts.source
    try:
        after = ScriptFacts(SourceFile(source.path, source.display_path, text.encode(source.encoding, "surrogatepass"),
                                       text, source.encoding))
    except (SourceError, ValueError, UnicodeError):
        return None
    return after, text


def _after_leader(
    facts: "ScriptFacts",
    finding: Finding,
    leader: "tuple[ScriptFacts, str] | None",
    rule: "ScriptRule | None",
    settings: "Settings",
    models: "AuditedModels | None",
) -> str | None:
    """The text after the leader's fix and then this finding's own (made from the leader's text)."""
    if leader is None or rule is None:
        return None
    from tcaudit.rules.base import RuleContext

    after, text = leader
    line = line_map(facts.source.text, text).get(finding.location.line)
    key = _line_key(finding.source_line)
    try:
        found = [
            f for f in rule.check(after, RuleContext(settings, models))
            if f.fix is not None and f.fix.available and leader_of(f) is None
        ]
    except Exception:  # noqa: BLE001
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
    return _alone(after, candidates, rule, settings)


def line_map(old: str, new: str) -> dict[int, int]:
    """Where each line of ``old`` is in ``new`` (1-based): kept lines exactly, a changed line at its
    place in the lines that replace it; deleted lines are left out."""
    import difflib

    from tcaudit.rewrite.textedits import source_lines

    out: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, source_lines(old), source_lines(new), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for index in range(i1, i2):
                out[index + 1] = j1 + index - i1 + 1
        elif tag == "replace":
            for index in range(i1, i2):
                out[index + 1] = j1 + min(index - i1, j2 - j1 - 1) + 1
    return out


def _line_key(line: str) -> str:
    return " ".join(line.split())
