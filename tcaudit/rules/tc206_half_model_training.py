"""TC206 half-model-training: the whole model cast to fp16/bf16 and trained that way."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import amp_facts, cast_dtype
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from libcst.helpers import get_full_name_for_node
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor
from tcaudit.rules.base import Codemod
from tcaudit.script.amp import BF16, HALF, amp_facts, cast_dtype, dtypes_of


class HalfModelTraining(ScriptRule):
    id = "TC206"
    triggers = (r"half|bfloat16|float16|HalfTensor",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.training_steps:
            return  # inference in half precision is the right thing to do
        amp = amp_facts(facts)
        for call in amp.half_model_casts:
            dtype = cast_dtype(facts, call)
            yield self.finding(
                facts,
                call.node,
                f"the whole model is cast to {dtype} and trained that way: weights, gradients and "
                "optimizer state lose small updates (an fp16 weight of 1.0 ignores any step below "
                "0.0005); keep fp32 weights and run the forward under torch.autocast",
                fix=Fix(
                    FixClass.NUMERICS,
                    f"drop the cast and wrap forward and loss in torch.autocast(dtype=torch.{dtype})",
                    anchor={"kind": "replace-model-cast", "line": facts.line_of(call.node), "dtype": dtype},
                ),
            )


# -- the fix ------------------------------------------------------------------------------------

class _DropCast(StatementEditor):
    def __init__(self, facts, calls: set[int]) -> None:
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
        facts = context.facts
        amp = amp_facts(facts)
        lines = {f.fix.anchor["line"] for f in findings}
        casts = [c for c in amp.half_model_casts if facts.line_of(c.node) in lines]
        model_casts = {id(c.node) for c in amp.half_model_casts}
        for call in facts.calls:
            if id(call.node) in model_casts or facts.in_eval(call.ctx):
                continue
            if cast_dtype(facts, call) in (HALF, BF16):
                raise DeclineFix("the inputs are cast to half precision too; drop those casts together with the "
                                 "model cast and use autocast")
        editor = _DropCast(facts, {id(c.node) for c in casts})
        for call in casts:
            statement = call.statement.node if call.statement else None
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                continue
            small = statement.body[0]
            value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
            if value is not call.node:
                continue
            receiver = get_full_name_for_node(call.receiver) if call.receiver is not None else None
            if isinstance(small, cst.Expr) or (
                isinstance(small, cst.Assign) and len(small.targets) == 1
                and get_full_name_for_node(small.targets[0].target) == receiver
            ):
                editor.remove(statement)  # ``model.half()`` or ``model = model.half()``: nothing left to do
        return module.visit(editor)
