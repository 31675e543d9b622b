"""TC205 clip-before-unscale: clipping gradients that are still multiplied by the loss scale.

Fix (safe): insert ``scaler.unscale_(optimizer)`` as the statement right before the clip; where the
loss is scaled only on one arm of an ``if`` (``if args.amp:``) and the clip runs on both, under that
arm's condition. A clip on the arm without a scaler is not reported; a clip after the optimizer step
is TC213's (it clips nothing the step used), not a place for ``unscale_``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_statement
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CLIP_FUNCTIONS, ScriptFacts
from tcaudit.script.guards import condition_code, exclusive, extra_conditions
from tcaudit.script.steps import clipped_after_step


@dataclass(frozen=True, eq=False)
class InsertUnscale(FixPlan):
    kind = "insert-before"
    statement: cst.BaseStatement  # the statement holding the clip call
    line: int
    code: str


class ClipBeforeUnscale(ScriptRule):
    id = "TC205"
    fixed_with = ("TC201",)  # unscaling edits the steps of the GradScaler
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
            conditions: list = []
            same_function_steps = [s for s in scaled if s.function is function]
            if same_function_steps:
                # Only a scaled backward that runs on the clip's path counts: the plain (non-AMP) arm
                # of ``if args.amp: ... else: ...`` clips unscaled gradients.
                on_path = [s for s in same_function_steps
                           if facts.line_of(s.backward.node) < line and not exclusive(s.backward.ctx, call.ctx)]
                if not on_path:
                    continue  # before the scaled backward, or on the arm without a scaler
                if any(u.ctx.function is function and facts.line_of(u.node) < line
                       and not exclusive(u.ctx, call.ctx) for u in unscales):
                    continue
                if clipped_after_step(facts, call) is not None:
                    continue  # the step already used the gradients: TC213 says so
                step = on_path[-1]
                conditions = extra_conditions(step.backward.ctx, call.ctx)
            elif unscales:
                continue  # backward and clip in different functions, and an unscale_ somewhere: trust it
            else:
                step = scaled[0]
            scaler = step.scaler
            optimizer = self._optimizer_for(facts, function)
            unscale = f"{scaler}.unscale_({optimizer})"
            guard = condition_code(facts.module, conditions) if conditions else ""
            code = unscale if not conditions or guard is None else f"if {guard}:\n    {unscale}\n"

            def plan(call=call, line=line, code=code, guard=guard) -> InsertUnscale:
                if guard is None:
                    raise DeclineFix(
                        "the loss is scaled only under a condition that calls something, which the fix "
                        "would have to evaluate again before the clip; unscale by hand on that path"
                    )
                statement = call.statement.node if call.statement is not None else None
                if not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                    raise DeclineFix("the clip sits in a one-line suite; split the line first")
                return InsertUnscale(statement, line, code)

            where = f" The loss is scaled only where `{guard}`: unscale under `if {guard}:`." if guard else ""
            yield self.finding(
                facts,
                call.node,
                f"gradients are clipped while still scaled by `{scaler}`; call `{unscale}` first",
                explanation=f"The gradients are 65536x too large at the default initial scale, so the clip "
                f"crushes every update.{where}",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    f"insert {unscale} before the clip" + (f", under `if {guard}:`" if guard else ""),
                    plan,
                ),
            )

    @staticmethod
    def _optimizer_for(facts: ScriptFacts, function) -> str:
        for call in facts.optimizer_steps:
            if call.ctx.function is function and call.receiver_name in facts.scalers and call.node.args:
                return facts.code(call.node.args[0].value)
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
        return editor.apply(module)
