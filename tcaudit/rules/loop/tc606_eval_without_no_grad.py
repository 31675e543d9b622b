"""TC606 eval-without-no-grad: an evaluation loop that runs the model with autograd on.

Without ``torch.no_grad()`` every forward of the evaluation records its autograd graph and keeps
the activations it would need for a backward that never comes: memory grows with the model's depth
and the batch (it can run out of memory where training does not, with a larger eval batch) and the
recording costs host time per op. An evaluation loop is a loop that calls the model inside a function
the facts call eval (``evaluate``, ``validate``, ``test`` without a backward), or a loop after
``model.eval()`` in the same block with no backward or optimizer step in it. ``model.eval()`` alone
switches dropout and batch norm, not autograd.

Fix (numerics): wrap the loop in ``with torch.no_grad():``. Not ``inference_mode``: tensors created
under it can never be used in autograd later, which would change behaviour where a result of the
loop is reused. A loop that computes gradients (``backward``, an optimizer step, ``requires_grad_``,
``torch.autograd.grad``: saliency maps, adversarial inputs) needs autograd and is not reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, LoopWrapper, parse_expression, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import in_test_code, loop_header_end, loops_of
from tcaudit.script.facts import NO_GRAD_QUALNAMES, CallSite, Frame, ScriptFacts
from tcaudit.source.triggers import all_of
from tcaudit.source.syntax import full_name, parent_map

_MODEL_NAME = re.compile(r"(^|[._])(model\w*|\w*_model|net\w*|\w*Net|encoder|decoder|classifier|backbone)$")
_GRADIENT_METHODS = frozenset({"backward", "requires_grad_"})
_GRADIENT_CALLS = frozenset({"torch.autograd.grad", "torch.autograd.backward"})


@dataclass(frozen=True, eq=False)
class WrapInNoGrad(FixPlan):
    kind = "wrap-no-grad"
    loop: cst.For | cst.While
    context_expr: str  # ``torch.no_grad()`` with the file's name for torch


class EvalWithoutNoGrad(ScriptRule):
    id = "TC606"
    # Necessary: ``name.eval()`` as a statement of its own (the loop must follow it in the same block;
    # ``>>> model.eval()`` in a docstring and ``net = Net().eval()`` are not that); or an eval
    # function by name (facts' eval-function pattern) and a call of a model by its bare name (a
    # method call is not one), which _is_model knows by a model-like name (its own and
    # facts.model_names'), by ``X.parameters()`` handed to an optimizer, or by ``X.eval()``.
    triggers = (
        r"(?m)^[ \t]*(?:[^\n]*;[ \t]*)?[\w.]+\.eval\(\)",
        all_of(
            r"def _*(?:eval|valid|test|infer|predict|sample|generate)",
            r"(?<![\w.])\w*(?:model|net|Net|generator|discriminator|encoder|decoder|classifier|backbone)\w*\)?\s*\("
            r"|\.\s*(?:named_)?parameters\s*\(|\.eval\(",
        ),
    )

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if self._grad_disabled_globally(facts):
            return
        eval_receivers = {c.receiver_name for c in facts.method_calls("eval") if not c.node.args}
        loops: dict[int, Frame] = {}
        for call in facts.calls:
            if call.method is not None or not self._is_model(facts, call.name, eval_receivers):
                continue
            if self._grad_off(facts, call.ctx) or in_test_code(call.ctx):
                continue
            enclosing = loops_of(call.ctx)
            if enclosing:
                loops.setdefault(id(enclosing[-1].node), enclosing[-1])
        for frame in loops.values():
            why = self._evaluation(facts, frame, eval_receivers)
            if why is None:
                continue
            inside = facts.calls_within(frame.node)
            if any(self._computes_gradients(facts, c) for c in inside):
                continue  # saliency maps, adversarial inputs: the loop needs autograd, no_grad would break it
            if why == "after-eval" and any(
                c.method == "backward" or (c.method == "step" and facts.is_optimizer_name(c.receiver_name)) for c in inside
            ):
                continue  # ``model.eval()`` then a step: fine-tuning with frozen batch norm, not evaluation
            loop = frame.node
            where = "an evaluation function" if why == "eval-function" else "a loop after `.eval()`"
            yield self.finding(
                facts, loop,
                f"{where} runs the model with autograd on",
                explanation="Every forward records its graph and keeps its activations for a backward that never "
                "comes; wrap it in `with torch.no_grad():`.",
                end_node=loop_header_end(loop),
                fix=self.planned_fix(
                    FixClass.NUMERICS, "wrap the loop in `with torch.no_grad():`",
                    lambda loop=loop: self._plan(facts, loop),
                ),
            )

    @staticmethod
    def _plan(facts: ScriptFacts, loop: cst.CSTNode) -> WrapInNoGrad:
        torch = torch_import_name(facts)
        if torch is None:
            raise DeclineFix("the file does not `import torch`")
        assert isinstance(loop, (cst.For, cst.While))
        return WrapInNoGrad(loop, f"{torch}.no_grad()")

    @staticmethod
    def _is_model(facts: ScriptFacts, name: str | None, eval_receivers: set) -> bool:
        if not name:
            return False
        return name in facts.model_names or name in eval_receivers or bool(_MODEL_NAME.search(name))

    @staticmethod
    def _computes_gradients(facts: ScriptFacts, call: CallSite) -> bool:
        if call.method in _GRADIENT_METHODS or call.qualname in _GRADIENT_CALLS:
            return True
        return call.method == "step" and facts.is_optimizer_name(call.receiver_name)

    @staticmethod
    def _no_grad_decorated(facts: ScriptFacts, fn: cst.FunctionDef) -> bool:
        for decorator in fn.decorators:
            dec = decorator.decorator
            if facts.qualname(dec.func if isinstance(dec, cst.Call) else dec) in NO_GRAD_QUALNAMES:
                return True
        return False

    def _grad_off(self, facts: ScriptFacts, ctx: Frame) -> bool:
        for frame in ctx.chain():
            if frame.kind == "with" and "eval" in facts.with_kinds(frame.node):  # type: ignore[arg-type]
                return True
            if frame.kind == "def" and self._no_grad_decorated(facts, frame.node):  # type: ignore[arg-type]
                return True
        return False

    @staticmethod
    def _grad_disabled_globally(facts: ScriptFacts) -> bool:
        """``torch.set_grad_enabled(False)`` as a statement: an inference script that turned autograd off."""
        for call in facts.calls_to("torch.set_grad_enabled", "torch.autograd.set_grad_enabled"):
            statement = call.statement.node if call.statement is not None else None
            if isinstance(statement, cst.SimpleStatementLine) and call.node.args:
                value = call.node.args[0].value
                if isinstance(value, cst.Name) and value.value == "False":
                    return True
        return False

    def _evaluation(self, facts: ScriptFacts, frame: Frame, eval_receivers: set) -> str | None:
        """Why the loop is an evaluation ("eval-function" or "after-eval"), or None."""
        loop = frame.node
        fn = frame.function
        if fn is not None and facts.function_is_eval(fn):
            callers = callers_of(facts, fn, outside=True)
            if callers and all(self._grad_off(facts, c.ctx) for c in callers):
                return None  # ``with torch.no_grad(): evaluate(model)``
            return "eval-function"
        statement = self._statement_of(facts, loop)
        if statement is None:
            return None
        block, index = statement
        for previous in reversed(block[:index]):
            text = facts.code(previous)
            if re.search(r"\.train\(", text):
                return None
            if isinstance(previous, cst.SimpleStatementLine) and any(
                isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute)
                and s.value.func.attr.value == "eval" and not s.value.args
                and full_name(s.value.func.value) in eval_receivers
                for s in previous.body
            ):
                return "after-eval"
        return None

    @staticmethod
    def _statement_of(facts: ScriptFacts, loop: cst.CSTNode) -> tuple[tuple, int] | None:
        """The block holding the loop statement and its index there."""
        holder = parent_map(facts.module).get(id(loop))
        if not isinstance(holder, (cst.Module, cst.IndentedBlock)):
            return None
        body = tuple(holder.body)
        return next(((body, index) for index, item in enumerate(body) if item is loop), None)


class EvalWithoutNoGradFix(Codemod):
    rule = "TC606"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[WrapInNoGrad] = [f.fix.plan for f in findings]
        return module.visit(LoopWrapper({id(p.loop): parse_expression(p.context_expr, module) for p in plans}))

