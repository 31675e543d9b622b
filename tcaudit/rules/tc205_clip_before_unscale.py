"""TC205 clip-before-unscale: clipping gradients that are still multiplied by the loss scale.

Fix (safe): insert ``scaler.unscale_(optimizer)`` as the statement right before the clip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor, parse_statement
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CLIP_FUNCTIONS, ScriptFacts


@dataclass(frozen=True, eq=False)
class InsertUnscale(FixPlan):
    kind = "insert-before"
    statement: cst.BaseStatement  # the statement holding the clip call
    line: int
    code: str


class ClipBeforeUnscale(ScriptRule):
    id = "TC205"
    triggers = (r"clip_grad",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        scaled = [step for step in facts.training_steps if step.scaler]
        if not scaled:
            return
        unscales = facts.method_calls("unscale_")
        for call in facts.calls:
            short = (call.qualname or call.name or "").split(".")[-1]
            if short not in CLIP_FUNCTIONS:
                continue
            function = call.ctx.function
            line = facts.line_of(call.node)
            same_function_steps = [s for s in scaled if s.function is function]
            if same_function_steps:
                if not any(facts.line_of(s.backward.node) < line for s in same_function_steps):
                    continue  # clipping before the scaled backward of this function: not scaled yet
                if any(u.ctx.function is function and facts.line_of(u.node) < line for u in unscales):
                    continue
            elif unscales:
                continue  # backward and clip in different functions, and an unscale_ somewhere: trust it
            scaler = same_function_steps[0].scaler if same_function_steps else scaled[0].scaler
            optimizer = self._optimizer_for(facts, function)
            code = f"{scaler}.unscale_({optimizer})"

            def plan(call=call, line=line, code=code) -> InsertUnscale:
                statement = call.statement.node if call.statement is not None else None
                if not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                    raise DeclineFix("the clip sits in a one-line suite; split the line first")
                return InsertUnscale(statement, line, code)

            yield self.finding(
                facts,
                call.node,
                f"gradients are clipped while still scaled by `{scaler}` (65536x at the default initial "
                f"scale), so the clip crushes every update; call `{code}` first",
                fix=self.planned_fix(FixClass.SAFE, f"insert {code} before the clip", plan),
            )

    @staticmethod
    def _optimizer_for(facts: ScriptFacts, function) -> str:
        for call in facts.optimizer_steps:
            if call.ctx.function is function and call.receiver_name in facts.scalers and call.node.args:
                return facts.module.code_for_node(call.node.args[0].value)
        for call in facts.optimizer_steps:
            if call.ctx.function is function and call.receiver_name not in facts.scalers:
                return call.receiver_name or "optimizer"
        return "optimizer"


class ClipBeforeUnscaleFix(Codemod):
    rule = "TC205"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        for finding in findings:
            plan: InsertUnscale = finding.fix.plan
            editor.insert_before(plan.statement, [parse_statement(plan.code, module)])
        return module.visit(editor)
