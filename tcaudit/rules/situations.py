"""Declines that hold across rules: a fix declined to keep the script out of a situation (BCE under
autocast, fused SGD under a GradScaler) stops every other rule's edit that would bring it about.

Two checks use the same :class:`~tcaudit.findings.Situation` records:

* at detection, :func:`block_created` declines each available fix whose plan says it creates a
  situation that another finding's decline protects against, so ``scan`` promises what ``fix`` does;
* in the fix engine, :func:`instances` counts each protected situation in the text before and after
  an edit, which catches an edit that brings one about without declaring it (a later round's edit, or
  a plan that cannot know, such as an autocast wrap around a call into the protected helper).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

from tcaudit.findings import Finding, Situation, SituationKind
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import keyword


@dataclass(frozen=True)
class Protection:
    """A declined fix's situation, with the rule that declined and why."""

    situation: Situation
    rule: str
    reason: str

    def refusal(self) -> str:
        """The reason given to an edit that this protection refuses."""
        return (f"it would bring about {self.situation.describe()}, which {self.rule} declined to fix "
                f"({self.reason})")


def covers(protected: Situation, created: Situation) -> bool:
    """Whether bringing about ``created`` is what ``protected`` guards against: the same kind, and the
    same subject unless either stands for the whole file."""
    if protected.kind is not created.kind:
        return False
    return not protected.subject or not created.subject or protected.subject == created.subject


def protections(findings: Iterable[Finding]) -> list[Protection]:
    """Every situation a declined fix among ``findings`` protects against."""
    out: list[Protection] = []
    for finding in findings:
        fix = finding.fix
        if fix is None or fix.available:
            continue
        for situation in fix.protects:
            out.append(Protection(situation, finding.rule, fix.reason or "no reason given"))
    return out


def refusing(finding: Finding, guarded: Iterable[Protection]) -> Protection | None:
    """The protection (of another rule) that the finding's available fix would break, if any."""
    fix = finding.fix
    if fix is None or not fix.available:
        return None
    for protection in guarded:
        if protection.rule == finding.rule:
            continue  # a rule's own fixes already respect its own declines
        if any(covers(protection.situation, created) for created in fix.creates):
            return protection
    return None


def block_created(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each fix that would create a situation another finding's decline protects
    against declined, the reason naming the situation and the declining rule."""
    guarded = protections(findings)
    if not guarded:
        return findings
    out: list[Finding] = []
    for finding in findings:
        protection = refusing(finding, guarded)
        if protection is not None:
            assert finding.fix is not None
            finding = dataclasses.replace(finding, fix=finding.fix.declined(protection.refusal()))
        out.append(finding)
    return out


def instances(situation: Situation, facts: ScriptFacts) -> int:
    """How many times ``situation`` occurs in the analysed text (an edit that raises the count brings
    it about once more)."""
    if situation.kind is SituationKind.RUNS_UNDER_AUTOCAST:
        return _calls_under_autocast(facts, situation.subject)
    if situation.kind is SituationKind.FUSED_SGD_UNDER_GRADSCALER:
        if not facts.mentions_gradscaler:
            return 0
        return sum(
            1 for call in facts.calls
            if (call.qualname or "").endswith(".SGD")
            and (fused := keyword(call.node, "fused")) is not None and literal(fused.value) is True
        )
    raise ValueError(f"no count for {situation.kind}")


def _calls_under_autocast(facts: ScriptFacts, function: str) -> int:
    """Calls of ``function`` (``f(...)`` or ``self.f(...)``) made under autocast, directly or from a
    function that is itself called under autocast."""
    called_under: set[int] = set()
    for call in facts.calls:
        name = (call.name or "").removeprefix("self.")
        if name and "." not in name and facts.in_autocast(call.ctx):
            called_under.update(id(fn) for fn in facts.functions_by_name.get(name, []))
    count = 0
    for call in facts.calls:
        if (call.name or "").removeprefix("self.") != function:
            continue
        if facts.in_autocast(call.ctx) or id(call.ctx.function) in called_under:
            count += 1
    return count
