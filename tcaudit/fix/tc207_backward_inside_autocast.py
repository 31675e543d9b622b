"""TC207 fix: move the backward (and what follows it in the block) out of the autocast block."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, StatementEditor


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
