"""TC203 gradscaler-with-bf16: a GradScaler beside bf16 autocast scales for nothing.

Detects a GradScaler that may run (built enabled, or with ``enabled=`` a flag such as ``args.amp`` or
``use_fp16``, or a test for fp16 on a dtype that may be fp16) in a file whose every training autocast
is bf16 for sure. Not reported for ``enabled=False`` or a test that cannot hold
(``enabled=(dtype == torch.float16)`` with ``dtype = torch.bfloat16``).

Fix (safe): remove the scaler (what a disabled scaler does, so a flag that enables it changes nothing): its creation, ``scaler.update()`` and ``scaler.unscale_(opt)``
statements go, ``scaler.scale(loss)`` becomes ``loss`` and ``scaler.step(opt)`` becomes
``opt.step()``. Declined when the scaler is created conditionally, not assigned to a name, used for
anything else (``state_dict`` for a checkpoint), passed around, or shares a line with other code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import BF16, HALF, UNKNOWN, amp_facts, dtypes_of
from tcaudit.script.facts import AUTOCAST_QUALNAMES, GRADSCALER_SUFFIXES, CallSite, ScriptFacts

_SCALER_METHODS = frozenset({"scale", "step", "update", "unscale_"})


@dataclass(frozen=True, eq=False)
class RemoveScaler(FixPlan):
    kind = "remove-scaler"
    line: int
    scaler: str  # the name the scaler is bound to
    creation: cst.CSTNode  # the statement creating it, removed
    calls: tuple[cst.Call, ...]  # ``scaler.scale(loss)`` → ``loss``, ``scaler.step(opt)`` → ``opt.step()``
    removed: tuple[cst.SimpleStatementLine, ...]  # the ``update()`` and ``unscale_()`` statements


class GradScalerWithBf16(ScriptRule):
    id = "TC203"
    fixed_with = ("TC201",)  # the scaler of the autocast TC201 chooses
    triggers = (r"Scaler",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        amp = amp_facts(facts)
        # Every training autocast must be bf16 for sure; a dtype chosen at run time may be fp16.
        if not amp.training_autocast_sites or amp.autocast_dtypes != frozenset({BF16}):
            return
        if any(c.method in ("half",) for c in amp.half_model_casts):
            return
        if _autocast_handed_on_uncalled(facts):
            return  # its callers run it at the default dtype: fp16 on CUDA, where the scaler belongs
        for call in facts.calls:
            qual = call.qualname or call.name or ""
            if not qual.endswith(GRADSCALER_SUFFIXES):
                continue
            enabled = call.arg("enabled")
            if enabled is not None and not may_be_true(facts, enabled):
                continue  # ``enabled=False``, or a test for fp16 on a dtype that is bf16 for sure
            when = ""
            if enabled is not None and not (isinstance(enabled, cst.Name) and enabled.value == "True"):
                when = f" (enabled by `{facts.code(enabled)}`)"
            yield self.finding(
                facts,
                call.node,
                f"GradScaler{when} with bf16 autocast; remove the scaler",
                explanation="bf16 has fp32's exponent range, so loss scaling only adds a scale, an unscale and "
                "an inf check to every step.",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    "remove the GradScaler and call backward/step directly",
                    lambda call=call: _plan(facts, call),
                ),
            )


def _autocast_handed_on_uncalled(facts: ScriptFacts) -> bool:
    """An autocast passed on as a callable (``return torch.cuda.amp.autocast``, ``ac = torch.autocast``):
    called elsewhere, without a dtype this analysis sees. ``partial(torch.autocast, ...)`` is a site of
    its own, with the dtype it binds."""
    placed: set[int] = set()
    for call in facts.calls:
        placed.add(id(call.node.func))
        if (call.qualname == "functools.partial" or call.name == "partial") and call.node.args:
            placed.add(id(call.node.args[0].value))
    for site in facts.imports:
        names = site.node.names if isinstance(site.node, (cst.Import, cst.ImportFrom)) else ()
        for alias in names if isinstance(names, Sequence) else ():
            placed.add(id(alias.name))
            if alias.asname is not None:
                placed.add(id(alias.asname.name))
    for function, _ in facts.functions:
        placed.update(id(decorator.decorator) for decorator in function.decorators)
    return any(
        ref.qualname in AUTOCAST_QUALNAMES and id(ref.node) not in placed and not facts.in_eval(ref.ctx)
        for ref in facts.references
    )


def may_be_true(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    """Whether a scaler's ``enabled=`` may hold: anything but ``False`` and a test for fp16 on a dtype
    that can only be something else (``dtype == torch.float16`` with ``dtype = torch.bfloat16``).
    A flag (``args.amp``, ``use_fp16``) may be set, so the scaler may run beside the bf16 autocast."""
    values = [v for v in facts.binding_values(expr) if not isinstance(v, (cst.IfExp, cst.BooleanOperation))]
    return any(_value_may_be_true(facts, value) for value in values) if values else True


def _value_may_be_true(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Name) and value.value == "False":
        return False
    if isinstance(value, cst.Comparison) and len(value.comparisons) == 1:
        target = value.comparisons[0]
        if isinstance(target.operator, (cst.Equal, cst.Is)):
            sides = (value.left, target.comparator)
            for tested, literal in (sides, sides[::-1]):
                if dtypes_of(facts, literal) == frozenset({HALF}):
                    seen = dtypes_of(facts, tested)
                    return HALF in seen or UNKNOWN in seen
    return True


def _plan(facts: ScriptFacts, call: CallSite) -> RemoveScaler:
    statement = call.statement.node if call.statement is not None else None
    binding = next(
        (b for b in facts.bindings if statement is not None and b.statement and b.statement.node is statement), None
    )
    if binding is None:
        raise DeclineFix("the GradScaler is not assigned to a name; remove it by hand")
    if not isinstance(binding.value, cst.Call):
        raise DeclineFix("the scaler is created conditionally; remove it by hand")
    scaler = binding.target
    uses = [c for c in facts.calls if c.receiver_name == scaler]
    other = sorted({c.method for c in uses} - _SCALER_METHODS)
    if other:
        raise DeclineFix(f"the scaler is also used for {', '.join(other)} (e.g. a checkpoint)")
    if facts.mentions(scaler) > len(uses) + 1:
        raise DeclineFix("the scaler is passed around or tested; remove it by hand")
    removed = []
    for use in uses:
        if use.method in ("update", "unscale_"):
            use_statement = use.statement.node if use.statement else None
            if not isinstance(use_statement, cst.SimpleStatementLine) or len(use_statement.body) != 1:
                raise DeclineFix(f"`{scaler}.{use.method}()` shares its line with other code")
            removed.append(use_statement)
    calls = tuple(use.node for use in uses if use.method in ("scale", "step"))
    return RemoveScaler(facts.line_of(call.node), scaler, statement, calls, tuple(removed))


# -- the fix ------------------------------------------------------------------------------------


class _Unscale(StatementEditor):
    """Statement removals, and the scaler's ``scale``/``step`` calls replaced by what they wrap."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: set[int] = set()

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if id(original_node) not in self.calls or not isinstance(func, cst.Attribute):
            return updated_node
        if func.attr.value == "scale" and len(updated_node.args) == 1:
            return updated_node.args[0].value  # scaler.scale(loss) → loss
        if func.attr.value == "step" and updated_node.args:
            optimizer = updated_node.args[0].value
            rest = list(updated_node.args[1:])
            return cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")), args=rest)
        return updated_node


class GradScalerWithBf16Fix(Codemod):
    rule = "TC203"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _Unscale()
        for finding in findings:
            plan: RemoveScaler = finding.fix.plan
            editor.remove(plan.creation)
            for statement in plan.removed:
                editor.remove(statement)
            editor.calls.update(id(call) for call in plan.calls)
        return module.visit(editor)
