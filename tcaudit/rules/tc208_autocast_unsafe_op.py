"""TC208 autocast-unsafe-op: ops that raise or misbehave under autocast.

Detects binary cross-entropy on probabilities (``F.binary_cross_entropy``, ``nn.BCELoss``), which
raises under autocast, and sparse matrix multiplies under fp16 autocast (no fp16 kernel), in an
autocast block or in a function called from one.

Fix (numerics), for BCE in an autocast ``with`` block: cast its two inputs to float32 and put its
statement under ``torch.autocast(device_type=..., enabled=False)``. Declined when the loss is
computed in a helper, the autocast context is a variable or the loss is part of a compound
statement. The sparse multiply has no fix (which inputs are sparse is not visible statically).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass, FixPlan, FollowsFix, Situation, SituationKind
from tcaudit.rewrite.codemod import DeclineFix, FixContext, parse_expression, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import BF16, AmpFacts, amp_facts, unsafe_kind
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.triggers import all_of

@dataclass(frozen=True, eq=False)
class BceOutsideAutocast(FixPlan):
    kind = "bce-outside-autocast"
    line: int
    device: str  # device-type expression of the enclosing autocast
    call: cst.Call  # the loss call whose inputs become float32
    statement: cst.SimpleStatementLine  # wrapped in autocast(enabled=False)


class AutocastUnsafeOp(ScriptRule):
    id = "TC208"
    after = ("TC201",)  # a BCE loss the autocast of TC201's fix would wrap is taken out of it after
    triggers = (all_of(r"binary_cross_entropy|BCELoss|sparse", r"(?i:autocast)|" + BACKWARD_CALL),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        amp = amp_facts(facts)
        if not amp.autocast_sites and not facts.autocast_withs:
            yield from self._after_autocast_fix(facts, context)
            return
        under = self._functions_called_under_autocast(facts)
        for call in facts.calls:
            if not (facts.in_autocast(call.ctx) or call.ctx.function in under):
                continue
            kind = unsafe_kind(facts, call)
            if kind == "bce":
                yield self.finding(
                    facts,
                    call.node,
                    "binary cross-entropy on probabilities raises a RuntimeError under autocast",
                    explanation="It raises under fp16 and bf16 autocast; use BCEWithLogitsLoss on the logits (drop "
                    "the sigmoid), or compute this loss outside autocast on .float() inputs.",
                    fix=self.planned_fix(
                        FixClass.NUMERICS,
                        "compute the loss outside autocast in float32, or BCEWithLogits when the sigmoid "
                        "is the model's last op",
                        lambda call=call: _plan(facts, amp, call),
                    ),
                )
            elif kind == "sparse" and amp.autocast_dtypes != frozenset({BF16}):
                yield self.finding(
                    facts,
                    call.node,
                    "sparse matrix multiply under fp16 autocast: there is no fp16 sparse kernel; run it "
                    "outside autocast on float32 inputs",
                    fix=Fix(FixClass.NUMERICS, "move the sparse op out of autocast", available=False,
                            reason="which inputs are sparse is not visible statically",
                            protects=_helper_under_autocast(facts, call)),
                )

    def _after_autocast_fix(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """No autocast yet, but TC201's fix will wrap a statement computing BCE: this rule's fix then
        takes the loss out of autocast, in the next round; scan says so now. (A BCE that TC201's
        wrap would reach through a helper makes TC201 decline instead.)"""
        bce = [c for c in facts.calls if unsafe_kind(facts, c) == "bce"]
        if not bce:
            return
        wrapped = {
            id(statement) for f in context.fixable("TC201", facts) if f.fix.plan is not None
            for statement in f.fix.plan.put_under_autocast()
        }
        for call in bce:
            if call.statement is None or id(call.statement.node) not in wrapped:
                continue
            yield self.finding(
                facts,
                call.node,
                "with autocast (TC201), this binary cross-entropy on probabilities would raise a RuntimeError",
                explanation="BCE on probabilities raises under fp16 and bf16 autocast; the fix computes it outside "
                "autocast on .float() inputs once TC201's autocast is in place.",
                fix=Fix(FixClass.NUMERICS, "compute the loss outside autocast in float32, once TC201's autocast "
                        "is in place", plan=FollowsFix("TC201")),
            )

    @staticmethod
    def _functions_called_under_autocast(facts: ScriptFacts) -> set:
        out = set()
        for call in facts.calls:
            if facts.in_autocast(call.ctx):
                name = (call.name or "").removeprefix("self.")
                if name and "." not in name:
                    out.update(facts.functions_by_name.get(name, []))
        return out


def _helper_under_autocast(facts: ScriptFacts, call: CallSite) -> tuple[Situation, ...]:
    """The situation an unfixable op in a helper called under autocast is kept out of: more calls of
    that helper under autocast. None for an op written in the autocast block itself."""
    helper = call.ctx.function
    if helper is None or facts.autocast_frame(call.ctx) is not None:
        return ()
    return (Situation(SituationKind.RUNS_UNDER_AUTOCAST, helper.name.value),)


def _plan(facts: ScriptFacts, amp: AmpFacts, call: CallSite) -> BceOutsideAutocast:
    frame = facts.autocast_frame(call.ctx)
    if frame is None or frame.kind != "with":
        helper = call.ctx.function
        raise DeclineFix(
            "the loss is computed in a helper called under autocast; move it out by hand",
            # No other fix may put more calls of the helper under autocast (TC201 wrapping another step).
            protects=(Situation(SituationKind.RUNS_UNDER_AUTOCAST, helper.name.value),) if helper is not None else (),
        )
    sites = {id(s.call.node): s for s in amp.autocast_sites}
    site = next((sites[id(item.item)] for item in frame.node.items if id(item.item) in sites), None)
    if site is None:
        raise DeclineFix("the autocast context is a variable; its device type is not known here")
    device_expr = site.call.arg("device_type", 0)
    if (site.call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) or device_expr is None:
        device_code = f'"{site.device or "cuda"}"'
    else:
        device_code = facts.module.code_for_node(device_expr)
    statement = call.statement.node if call.statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine):
        raise DeclineFix("the loss is part of a compound statement")
    return BceOutsideAutocast(facts.line_of(call.node), device_code, call.node, statement)


# -- the fix ------------------------------------------------------------------------------------


class AutocastUnsafeOpFix(Codemod):
    rule = "TC208"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        torch_name = torch_import_name(context.facts) or "torch"
        return module.visit(_Wrap(module, [f.fix.plan for f in findings], torch_name))


def _float_args(call: cst.Call) -> cst.Call:
    args = []
    for index, arg in enumerate(call.args):
        if arg.keyword is None and not arg.star and index < 2:
            arg = arg.with_changes(value=cst.Call(func=cst.Attribute(value=arg.value, attr=cst.Name("float"))))
        args.append(arg)
    return call.with_changes(args=args)


class _Wrap(cst.CSTTransformer):
    """Cast the BCE inputs to float32 and put their statement under ``autocast(enabled=False)``."""

    def __init__(self, module: cst.Module, plans: list[BceOutsideAutocast], torch_name: str) -> None:
        super().__init__()
        self.module = module
        self.calls = {id(plan.call) for plan in plans}
        self.wrap = {id(plan.statement): plan.device for plan in plans}
        self.torch_name = torch_name

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return _float_args(updated_node) if id(original_node) in self.calls else updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        device = self.wrap.get(id(original_node))
        if device is None:
            return updated_node
        context_expr = parse_expression(f"{self.torch_name}.autocast(device_type={device}, enabled=False)", self.module)
        return cst.With(
            items=[cst.WithItem(context_expr)],
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=updated_node.leading_lines,
        )
