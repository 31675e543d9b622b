"""TC205 fix: insert ``scaler.unscale_(optimizer)`` right before the clip."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, StatementEditor, parse_statement
from tcaudit.script.facts import CLIP_FUNCTIONS


class ClipBeforeUnscaleFix(Codemod):
    rule = "TC205"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = StatementEditor()
        for finding in findings:
            line = finding.fix.anchor["line"]
            code = finding.fix.anchor["code"]
            call = next(
                (c for c in facts.calls
                 if (c.qualname or c.name or "").split(".")[-1] in CLIP_FUNCTIONS and facts.line_of(c.node) == line),
                None,
            )
            if call is None or call.statement is None:
                raise DeclineFix("the clip call could not be located")
            statement = call.statement.node
            if not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                raise DeclineFix("the clip sits in a one-line suite; split the line first")
            editor.insert_before(statement, [parse_statement(code, module)])
        return module.visit(editor)
