"""TC406 tensor-created-then-moved: ``torch.zeros(...).cuda()`` instead of ``torch.zeros(..., device=...)``.

Fix (safe; numerics for random factories in the training step, whose CPU and CUDA generators draw
different numbers from one seed): pass the device to the factory and drop the ``.cuda()``/``.to()``
call. Declined when the move also changes the dtype or layout, when the tensor requires grad (created
on the device it becomes a leaf), and for a random factory outside the training step (a seeded split
or initialisation would change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import DeclineFix, FixContext, parse_expression
from tcaudit.rewrite.edits import CallEditor, add_keyword, keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import ACCELERATOR_NAMED
from tcaudit.script.expressions import keyword_arg, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.triggers import all_of

# Factories that take ``device=``. ``torch.from_numpy`` does not; ``torch.Tensor(...)`` is legacy.
FACTORIES = frozenset(
    f"torch.{name}"
    for name in (
        "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
        "logspace", "eye", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like", "randint_like", "tril_indices", "triu_indices",
    )
)


_MOVE_ARGUMENTS = {"cuda": ("device", "non_blocking"), "to": ("device", "non_blocking")}


@dataclass(frozen=True, eq=False)
class FoldDevice(FixPlan):
    """``factory(...).method(device)`` becomes ``factory(..., device=device)``."""

    kind = "move-device-into-factory"
    move: cst.Call  # the ``.cuda()``/``.to()`` call on the factory call, replaced by the latter
    device: str
    method: str


class TensorCreatedThenMoved(ScriptRule):
    id = "TC406"
    # It needs a move, an accelerator and one of the factories by name (an alias still spells it).
    triggers = (all_of(r"\.(?:cuda|to)\b", ACCELERATOR_NAMED,
                       r"\b(?:zeros|ones|empty|full|rand\w*|arange|linspace|logspace|eye|tensor|as_tensor|\w+_like"
                       r"|tril_indices|triu_indices)\("),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.uses_accelerator:
            return
        pipeline = pipeline_facts(facts)
        by_node = {id(c.node): c for c in facts.calls}
        for call in facts.calls:
            if call.method not in ("cuda", "to") or not isinstance(call.receiver, cst.Call):
                continue
            factory = by_node.get(id(call.receiver))
            if factory is None or factory.qualname not in FACTORIES or not moves_to_device(call):
                continue
            node = factory.node
            if any(keyword_arg(node, key) is not None for key in ("device", "generator", "pin_memory", "out")):
                continue  # a CPU generator or pinned staging buffer is deliberate
            if any(arg.star for arg in node.args):
                continue
            target = _device_text(facts, call)
            name = factory.qualname.split(".")[-1]
            per_step = _per_step(pipeline, call)
            yield self.finding(
                facts,
                call.node,
                f"`torch.{name}(...)` builds the tensor in host memory and then copies it to the device"
                f"{' on every step' if per_step else ''}; create it there: `torch.{name}(..., device={target})`",
                severity=None if per_step else Severity.INFO,
                fix=self.planned_fix(
                    FixClass.NUMERICS if name.startswith("rand") else FixClass.SAFE,
                    f"pass device={target} to torch.{name} and drop the .{call.method}() call",
                    lambda call=call, target=target, name=name, per_step=per_step: _plan(call, target, name, per_step),
                ),
            )


def _plan(call: CallSite, device: str, name: str, per_step: bool) -> FoldDevice:
    factory: cst.Call = call.receiver  # type: ignore[assignment]  # a factory call, by detection
    if name.startswith("rand") and not per_step:
        # Outside the step loop a random factory usually draws something the run depends on: a
        # seeded train/val split (randperm), an initialisation. The CUDA generator draws other
        # numbers than the CPU one from the same seed, so the run would change, not just its speed.
        raise DeclineFix(
            f"torch.{name} draws from the CPU generator here; on the device the same seed gives other "
            "numbers (a different split or initialisation), so the values the script computes would change"
        )
    method = call.method or ""
    allowed = _MOVE_ARGUMENTS.get(method, ())
    positional = [a for a in call.node.args if a.keyword is None]
    if any(a.star for a in call.node.args) or len(positional) > 1:
        raise DeclineFix(f"`.{method}()` passes more than the device; fold it by hand")
    if any(a.keyword is not None and a.keyword.value not in allowed for a in call.node.args):
        raise DeclineFix(f"`.{method}()` also changes the dtype or layout; fold it by hand")
    if keyword(factory, "requires_grad") is not None:
        raise DeclineFix(
            "the tensor requires grad: created on the device it becomes a leaf, and in-place writes "
            "that work on the moved copy would raise"
        )
    return FoldDevice(call.node, device, method)


def _device_text(facts: ScriptFacts, call: CallSite) -> str:
    if call.method == "cuda":
        arg = call.arg("device", 0)
        return f'"cuda:{facts.module.code_for_node(arg)}"' if isinstance(arg, cst.Integer) else (
            facts.module.code_for_node(arg) if arg is not None else '"cuda"'
        )
    arg = call.arg("device", 0)
    return facts.module.code_for_node(arg) if arg is not None else "device"


def _per_step(pipeline: PipelineFacts, call: CallSite) -> bool:
    """In a loop, in a ``forward``, or in a function called from a loop: a copy every iteration."""
    fn = call.ctx.function
    if fn is not None and fn.name.value == "forward":
        return True
    return pipeline.repeats(call.ctx)


# -- the fix ------------------------------------------------------------------------------------


class TensorCreatedThenMovedFix(Codemod):
    rule = "TC406"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: FoldDevice = finding.fix.plan
            device = parse_expression(plan.device, module)

            def fold(node: cst.Call, device=device) -> cst.BaseExpression:
                inner = node.func.value  # type: ignore[attr-defined]  # the factory call, as updated
                return add_keyword(inner, "device", device).with_changes(lpar=node.lpar, rpar=node.rpar)

            editor.rewrite_call(plan.move, fold)
        return module.visit(editor)
