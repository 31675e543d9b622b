"""TC208 autocast-unsafe-op: ops that raise or misbehave under autocast.

Detects binary cross-entropy on probabilities (``F.binary_cross_entropy``, ``nn.BCELoss``), which
raises under autocast, and sparse matrix multiplies under fp16 autocast (no fp16 kernel), in an
autocast block or in a function called from one.

Fix (numerics), for BCE in an autocast ``with`` block: cast its two inputs to float32 and put its
statement under ``torch.autocast(device_type=..., enabled=False)``. An input that is computed in the
loss call (``criterion(discriminator(fake), valid)``) is computed first, still under autocast, into a
name of its own: only the loss leaves autocast (moved with it, the discriminator would run in fp32
on the generator's half-precision output and raise "Input type and bias type should be the same").
Declined when the loss is computed in a helper, the autocast context is a variable, the loss is
part of a compound statement, or the statement calls something before the loss (hoisting its
inputs would reorder the calls). The sparse multiply has no fix (which inputs are sparse is not visible statically).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan, FollowsFix, Situation, SituationKind
from tcaudit.rewrite.codemod import FixContext, parse_expression, torch_import_name, unique_name
from tcaudit.rewrite.edits import contains
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import BF16, AmpFacts, amp_facts, unsafe_kind
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import call_nodes, full_name, nodes_of
from tcaudit.source.triggers import all_of


@dataclass(frozen=True, eq=False)
class BceOutsideAutocast(FixPlan):
    kind = "bce-outside-autocast"
    line: int
    device: str  # device-type expression of the enclosing autocast
    call: cst.Call  # the loss call whose inputs become float32
    statement: cst.SimpleStatementLine  # wrapped in autocast(enabled=False)
    hoisted: tuple[int, ...] = ()  # positional inputs computed in the call: assigned first, under autocast


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
        device_code = facts.code(device_expr)
    statement = call.statement.node if call.statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine):
        raise DeclineFix("the loss is part of a compound statement")
    hoisted = tuple(index for index, arg in enumerate(_inputs(call.node)) if _computes(arg.value))
    if hoisted:
        _check_hoistable(facts, statement, call.node)
    return BceOutsideAutocast(facts.line_of(call.node), device_code, call.node, statement, hoisted)


def _inputs(call: cst.Call) -> list[cst.Arg]:
    """The loss's two tensor inputs (input, target): its first two positional arguments."""
    return [arg for arg in call.args if arg.keyword is None and not arg.star][:2]


# Methods that move, cast or reshape a tensor (``y.cuda()``, ``labels.float().view(-1, 1)``): an input
# made of only these runs no model and produces no half tensor, so it stays in the loss call.
_PASSIVE_METHODS = frozenset({
    "to", "cuda", "cpu", "float", "double", "half", "bfloat16", "long", "type", "detach", "view", "reshape",
    "squeeze", "unsqueeze", "flatten", "clone", "contiguous", "view_as", "reshape_as", "expand_as", "type_as",
})


def _computes(node: cst.BaseExpression) -> bool:
    """Whether an input calls anything besides moving, casting or reshaping a tensor."""
    return any(not (isinstance(c.func, cst.Attribute) and c.func.attr.value in _PASSIVE_METHODS) for c in call_nodes(node))


def _check_hoistable(facts: ScriptFacts, statement: cst.SimpleStatementLine, call: cst.Call) -> None:
    """Computing the loss's inputs before the statement keeps the order of its calls only when
    nothing in the statement is called before the loss call and no part of it runs conditionally."""
    position = facts.position(call).start
    # The statement's other BCE losses leave autocast with it, their computed inputs hoisted in order;
    # a loss itself is pure, so computing an input before it reorders nothing that matters.
    losses = [c.node for c in facts.calls
              if c.statement is not None and c.statement.node is statement and unsafe_kind(facts, c) == "bce"]
    for node in call_nodes(statement):
        start = facts.position(node).start
        if any(contains(loss, node) for loss in losses):
            continue
        if (start.line, start.column) < (position.line, position.column) and not contains(node, call):
            raise DeclineFix("the loss statement calls something before the loss; computing the loss's inputs "
                             "first would reorder the calls: take the loss out of autocast by hand")
    if nodes_of(statement, (cst.IfExp, cst.Lambda, cst.BooleanOperation, cst.NamedExpr)):
        raise DeclineFix("the loss statement is evaluated conditionally; take the loss out of autocast by hand")


# -- the fix ------------------------------------------------------------------------------------


class AutocastUnsafeOpFix(Codemod):
    rule = "TC208"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        torch_name = torch_import_name(context.facts) or "torch"
        plans = sorted((f.fix.plan for f in findings), key=lambda plan: plan.line)
        return module.visit(_Wrap(module, plans, torch_name, _hoist_names(context.facts, plans)))


def _hoist_names(facts: ScriptFacts, plans: list[BceOutsideAutocast]) -> dict[tuple[int, int], str]:
    """A fresh name for every hoisted input, by (id of its call, input position): ``discriminator_out``
    for ``discriminator(x)``, ``bce_input`` otherwise."""
    names: dict[tuple[int, int], str] = {}
    for plan in plans:
        inputs = _inputs(plan.call)
        for index in plan.hoisted:
            value = inputs[index].value
            callee = full_name(value.func) if isinstance(value, cst.Call) else None
            base = f"{callee.rsplit('.', 1)[-1]}_out" if callee and callee.rsplit(".", 1)[-1].isidentifier() else "bce_input"
            names[(id(plan.call), index)] = unique_name(facts, base, names.values())
    return names


def _as_float(value: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=value, attr=cst.Name("float")))


class _Wrap(cst.CSTTransformer):
    """Compute the hoisted inputs first, cast the BCE inputs to float32 and put the loss statement
    under ``autocast(enabled=False)``."""

    def __init__(self, module: cst.Module, plans: list[BceOutsideAutocast], torch_name: str,
                 names: dict[tuple[int, int], str]) -> None:
        super().__init__()
        self.module = module
        self.plans = {id(plan.call): plan for plan in plans}
        self.wrap = {id(plan.statement): plan.device for plan in plans}
        self.names = names
        self.torch_name = torch_name
        self.hoists: dict[int, list[cst.SimpleStatementLine]] = {}  # by id of the statement
        self.statement: cst.SimpleStatementLine | None = None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statement = node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        plan = self.plans.get(id(original_node))
        if plan is None:
            return updated_node
        args, position = [], 0
        for arg in updated_node.args:
            if arg.keyword is None and not arg.star and position < 2:
                value = arg.value
                name = self.names.get((id(original_node), position))
                if name is not None:
                    assignment = cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=value)
                    self.hoists.setdefault(id(self.statement), []).append(cst.SimpleStatementLine([assignment]))
                    value = cst.Name(name)
                arg = arg.with_changes(value=_as_float(value))
                position += 1
            args.append(arg)
        return updated_node.with_changes(args=args)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        device = self.wrap.get(id(original_node))
        if device is None:
            return updated_node
        context_expr = parse_expression(f"{self.torch_name}.autocast(device_type={device}, enabled=False)", self.module)
        hoists = self.hoists.get(id(original_node), [])
        wrapped = cst.With(
            items=[cst.WithItem(context_expr)],
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=[] if hoists else updated_node.leading_lines,
        )
        if not hoists:
            return wrapped
        hoists[0] = hoists[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*hoists, wrapped])
