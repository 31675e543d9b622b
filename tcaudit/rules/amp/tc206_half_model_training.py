"""TC206 half-model-training: the whole model cast to fp16/bf16 and trained that way.

Detects ``model.half()``, ``model.bfloat16()`` and ``model.to(torch.float16)`` (and alike) in a
training script.

Fix (numerics): drop the cast (a statement that only casts the model is removed); TC201 then
reports the fp32 training step and its fix wraps forward and loss in ``torch.autocast``. Declined
when the inputs are cast to half precision too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import BF16, HALF, amp_facts, cast_dtype, dtypes_of
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import full_name
from tcaudit.source.triggers import all_of


@dataclass(frozen=True, eq=False)
class ReplaceModelCast(FixPlan):
    kind = "replace-model-cast"
    line: int
    dtype: str
    call: cst.Call  # the cast
    statement: cst.SimpleStatementLine | None  # removed whole when it does nothing but the cast


class HalfModelTraining(ScriptRule):
    id = "TC206"
    triggers = (all_of(r"half|bfloat16|float16|HalfTensor", BACKWARD_CALL),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.training_steps:
            return  # inference in half precision is the right thing to do
        amp = amp_facts(facts)
        inputs_cast = None
        for call in amp.half_model_casts:
            dtype = cast_dtype(facts, call)
            if inputs_cast is None:
                inputs_cast = _inputs_cast_to_half(facts, amp)

            def plan(call=call, dtype=dtype) -> ReplaceModelCast:
                if inputs_cast:
                    raise DeclineFix("the inputs are cast to half precision too; drop those casts together with "
                                     "the model cast and use autocast")
                return ReplaceModelCast(facts.line_of(call.node), dtype, call.node, _cast_only_statement(call))

            yield self.finding(
                facts,
                call.node,
                f"the whole model is cast to {dtype} and trained that way; keep fp32 weights under torch.autocast",
                explanation="Weights, gradients and optimizer state lose small updates (an fp16 weight of 1.0 "
                "ignores any step below 0.0005); keep fp32 weights and run the forward under torch.autocast.",
                fix=self.planned_fix(
                    FixClass.NUMERICS,
                    f"drop the cast and wrap forward and loss in torch.autocast(dtype=torch.{dtype})",
                    plan,
                ),
            )


def _inputs_cast_to_half(facts: ScriptFacts, amp) -> bool:
    """Whether something other than the model is cast to fp16/bf16 outside evaluation."""
    model_casts = {id(c.node) for c in amp.half_model_casts}
    return any(
        id(call.node) not in model_casts and not facts.in_eval(call.ctx) and dtype in (HALF, BF16)
        for call, dtype in amp.casts
    )


def _cast_only_statement(call: CallSite) -> cst.SimpleStatementLine | None:
    """The statement when it does nothing but cast the model: ``model.half()`` or ``model = model.half()``."""
    statement = call.statement.node if call.statement else None
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    if value is not call.node:
        return None
    receiver = full_name(call.receiver) if call.receiver is not None else None
    if isinstance(small, cst.Expr) or (
        isinstance(small, cst.Assign) and len(small.targets) == 1
        and full_name(small.targets[0].target) == receiver
    ):
        return statement
    return None


# -- the fix ------------------------------------------------------------------------------------


class _DropCast(StatementEditor):
    def __init__(self, facts: ScriptFacts, calls: set[int]) -> None:
        super().__init__()
        self.facts = facts
        self.calls = calls

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.calls or not isinstance(updated_node.func, cst.Attribute):
            return updated_node
        receiver = updated_node.func.value
        method = updated_node.func.attr.value
        if method in ("half", "bfloat16"):
            return receiver
        kept = []
        for arg in updated_node.args:
            is_dtype = (arg.keyword is not None and arg.keyword.value == "dtype") or (
                arg.keyword is None and dtypes_of(self.facts, arg.value) & {HALF, BF16}
            )
            if not is_dtype:
                kept.append(arg)
        if not kept:
            return receiver
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=kept)


class HalfModelTrainingFix(Codemod):
    rule = "TC206"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[ReplaceModelCast] = [f.fix.plan for f in findings]
        editor = _DropCast(context.facts, {id(p.call) for p in plans})
        for plan in plans:
            if plan.statement is not None:
                editor.remove(plan.statement)
        return module.visit(editor)
