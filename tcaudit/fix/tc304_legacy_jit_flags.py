"""TC304 fix: delete the private TorchScript flag calls."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, StatementEditor


class LegacyJitFlagsFix(Codemod):
    rule = "TC304"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        lines = {(f.location.line, f.location.column) for f in findings}
        editor = StatementEditor()
        for call in facts.calls:
            pos = facts.position(call.node)
            if (pos.start.line, pos.start.column + 1) not in lines or call.statement is None:
                continue
            statement = call.statement.node
            if not isinstance(statement, cst.SimpleStatementLine):
                raise DeclineFix("the flag call is part of a larger statement")
            kept = [s for s in statement.body if not (isinstance(s, cst.Expr) and s.value is call.node)]
            if len(kept) == len(statement.body):
                raise DeclineFix("the flag call's result is used; remove it by hand")
            if kept:
                kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                editor.replace_with(statement, [statement.with_changes(body=kept)])
            else:
                editor.remove(statement)
        return module.visit(editor)
