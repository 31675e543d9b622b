"""TC207 backward-inside-autocast: the backward pass sits inside the autocast block.

Fix (safe): end the ``with`` block before the backward: the backward statement and everything after
it in the block move out, one indentation level up. Declined when the backward is nested deeper in
the block, or the block holds nothing before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import Frame, ScriptFacts, TrainingStep
from tcaudit.source.triggers import all_of


@dataclass(frozen=True, eq=False)
class DedentBackward(FixPlan):
    kind = "dedent-backward"
    line: int
    with_line: int
    with_node: cst.With
    index: int  # the backward statement's index in the with block: it and what follows move out


class BackwardInsideAutocast(ScriptRule):
    id = "TC207"
    fixed_with = ("TC201",)  # the backward leaves the autocast block
    triggers = (all_of(r"autocast", BACKWARD_CALL),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for step in facts.training_steps:
            frame = facts.autocast_frame(step.ctx)
            if frame is None or frame.kind != "with":
                continue
            yield self.finding(
                facts,
                step.backward.node,
                "backward() runs inside the autocast block; dedent the backward",
                explanation="Autocast is meant for forward and loss: backward ops already run in the dtype "
                "their forward used.",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    "move the backward (and what follows it in the block) out of the autocast block",
                    lambda step=step, frame=frame: _plan(facts, step, frame),
                ),
            )


def _plan(facts: ScriptFacts, step: TrainingStep, frame: Frame) -> DedentBackward:
    with_node = frame.node
    if not isinstance(with_node, cst.With) or step.backward.statement is None:
        raise DeclineFix("the autocast block could not be located")
    body = with_node.body
    statement = step.backward.statement.node
    if not isinstance(body, cst.IndentedBlock) or not any(s is statement for s in body.body):
        raise DeclineFix("the backward is nested deeper inside the autocast block")
    index = next(i for i, s in enumerate(body.body) if s is statement)
    if index == 0:
        raise DeclineFix("the autocast block holds nothing but the backward")
    return DedentBackward(facts.line_of(step.backward.node), facts.line_of(with_node), with_node, index)


class BackwardInsideAutocastFix(Codemod):
    rule = "TC207"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        done: set[int] = set()
        for finding in findings:
            plan: DedentBackward = finding.fix.plan
            if id(plan.with_node) in done:
                continue  # a second backward in the same block moves out with the first
            body = plan.with_node.body
            kept, moved = list(body.body[: plan.index]), list(body.body[plan.index:])
            shortened = plan.with_node.with_changes(body=body.with_changes(body=kept))
            editor.replace_with(plan.with_node, [shortened, *moved])
            done.add(id(plan.with_node))
        return editor.apply(module)
