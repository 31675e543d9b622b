"""TC207 backward-inside-autocast: the backward pass sits inside the autocast block."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor
from tcaudit.rules.base import Codemod


class BackwardInsideAutocast(ScriptRule):
    id = "TC207"
    triggers = (r"autocast",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for step in facts.training_steps:
            frame = facts.autocast_frame(step.ctx)
            if frame is None or frame.kind != "with":
                continue
            yield self.finding(
                facts,
                step.backward.node,
                "backward() runs inside the autocast block; autocast is meant for forward and loss: "
                "backward ops already run in the dtype their forward used, so dedent the backward",
                fix=Fix(
                    FixClass.SAFE,
                    "move the backward (and what follows it in the block) out of the autocast block",
                    anchor={"kind": "dedent-backward", "line": facts.line_of(step.backward.node),
                            "with_line": facts.line_of(frame.node)},
                ),
            )


# -- the fix ------------------------------------------------------------------------------------

class BackwardInsideAutocastFix(Codemod):
    rule = "TC207"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = StatementEditor()
        done: set[int] = set()
        for finding in findings:
            line = finding.fix.anchor["line"]
            step = next((s for s in facts.training_steps if facts.line_of(s.backward.node) == line), None)
            frame = facts.autocast_frame(step.ctx) if step else None
            if step is None or frame is None or frame.kind != "with" or step.backward.statement is None:
                raise DeclineFix("the autocast block could not be located")
            with_node = frame.node
            assert isinstance(with_node, cst.With)
            if id(with_node) in done:
                continue
            body = with_node.body
            statement = step.backward.statement.node
            if not isinstance(body, cst.IndentedBlock) or not any(s is statement for s in body.body):
                raise DeclineFix("the backward is nested deeper inside the autocast block")
            index = next(i for i, s in enumerate(body.body) if s is statement)
            if index == 0:
                raise DeclineFix("the autocast block holds nothing but the backward")
            kept, moved = list(body.body[:index]), list(body.body[index:])
            editor.replace_with(with_node, [with_node.with_changes(body=body.with_changes(body=kept)), *moved])
            done.add(id(with_node))
        return module.visit(editor)
