"""TC204 fp16-without-gradscaler: fp16 training without loss scaling loses small gradients.

Detects fp16 autocast in a training script with no GradScaler anywhere, and a model cast to fp16
and trained (which TC206 rewrites first).

Fix (numerics), for fp16 autocast: create one ``torch.amp.GradScaler`` per function holding the
autocast's training steps, scale their backwards, route ``optimizer.step()`` through it and update it
after the last step (the same edit as TC201's GradScaler, :mod:`tcaudit.rewrite.autocast`, held in an :class:`AddScaler` plan).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.autocast import AutocastEditor, GradScalerPlan, plan_grad_scaler
from tcaudit.rewrite.codemod import FixContext, ensure_import, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import HALF, amp_facts, cast_dtype
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import condition_code, extra_conditions, is_pure_test
from tcaudit.source.syntax import names_in


@dataclass(frozen=True, eq=False)
class AddScaler(FixPlan):
    kind = "add-scaler"
    function: cst.FunctionDef | None  # the function whose steps get the scaler (None: module level)
    grad_scaler: GradScalerPlan


class Fp16WithoutGradScaler(ScriptRule):
    id = "TC204"
    fixed_with = ("TC201",)  # fp16 autocast is unsafe without its GradScaler
    triggers = (r"\.backward\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.training_steps or facts.mentions_gradscaler:
            return
        amp = amp_facts(facts)
        description = "add torch.amp.GradScaler: scaler.scale(loss).backward(), scaler.step(opt), scaler.update()"
        for site in amp.training_autocast_sites:
            if site.dtypes == frozenset({HALF}):
                yield self.finding(
                    facts,
                    site.call.node,
                    "fp16 autocast without a GradScaler",
                    explanation="Gradients below 6e-8 flush to zero and large ones overflow; scale the loss "
                    "with torch.amp.GradScaler, or use bf16.",
                    fix=self.planned_fix(
                        FixClass.NUMERICS, description, lambda site=site: self._plan(facts, amp, site)
                    ),
                )
        for call in amp.half_model_casts:
            if cast_dtype(facts, call) != HALF:
                continue
            yield self.finding(
                facts,
                call.node,
                "model trained in fp16 without a GradScaler: small gradients flush to zero",
                explanation="Keep fp32 weights under autocast with a GradScaler (see TC206).",
                fix=Fix(
                    FixClass.NUMERICS,
                    "replace the cast with autocast and a GradScaler",
                    available=False,
                    reason="the model cast is rewritten by TC206's fix first",
                ),
            )

    @staticmethod
    def _plan(facts: ScriptFacts, amp, site) -> AddScaler:
        function = site.call.ctx.function
        if amp.uses_lbfgs:
            raise DeclineFix("GradScaler cannot drive an LBFGS closure (use bf16 instead)")
        if not amp.has_optimizer:
            raise DeclineFix("no torch.optim optimizer: GradScaler.step needs one (use bf16 instead)")
        steps = [s for s in facts.training_steps if s.function is function and not s.scaler]
        if not steps and function is not None:
            # The autocast opens in a forward helper (``_forward``); the scaler goes where the backward
            # is (``_backward``, or the caller of ``loss = self._forward(batch)``).
            steps = [s for s in facts.training_steps if not s.scaler and function in amp.helpers_on_loss_path(s)]
            if len({id(s.function) for s in steps}) > 1:
                raise DeclineFix("the fp16 forward feeds backwards in several functions; add the GradScaler by hand")
        if not steps:
            raise DeclineFix("the backward is not in the function that opens the fp16 autocast")
        grad_scaler = plan_grad_scaler(facts, steps)
        # The scaler is on exactly where the fp16 autocast is: on the plain path it would scale fp32
        # losses and, as its scale grows, skip steps for gradients that are fine in fp32.
        create, _, enabled = grad_scaler.create.removesuffix(")").rpartition("enabled=")
        # One scaler serves every fp16 autocast of the function (``if args.amp: ... elif
        # args.fp16_head: ...``): it is on where any of them runs, so the tests are joined by ``or``.
        siblings = [s for s in amp.training_autocast_sites
                    if s.dtypes == frozenset({HALF}) and s.call.ctx.function is function] or [site]
        alternatives: list[str] = []
        for sibling in siblings:
            tests = [t for t in _fp16_conditions(facts, sibling, steps, grad_scaler.before) if t != enabled]
            if not tests:
                alternatives = []  # one of them runs wherever the backward does: no test to add
                break
            conjunction = _all_of(tests)
            if conjunction not in alternatives:
                alternatives.append(conjunction)
        tests = alternatives[:1] if len(alternatives) == 1 else (
            [" or ".join(f"({a})" if " " in a else a for a in alternatives)] if alternatives else []
        )
        if tests:
            parts = ([] if enabled == "True" else [enabled]) + tests
            joined = _all_of(parts)
            grad_scaler = replace(grad_scaler, create=f"{create}enabled={joined})")
        return AddScaler(function, grad_scaler)


def _all_of(tests: list[str]) -> str:
    """``tests`` joined by ``and``, each in parentheses where its own ``or`` (or, beside others, a
    conditional expression) would otherwise bind wrongly."""
    return " and ".join(f"({t})" if " or " in t or (len(tests) > 1 and " if " in t) else t for t in tests)


def _fp16_conditions(facts: ScriptFacts, site, steps, loop: cst.CSTNode | None) -> list[str]:
    """The tests under which the fp16 autocast runs that its backwards do not share (an ``if
    args.amp:`` arm around it, its own ``enabled=args.amp``), as code valid where the scaler is
    created (before ``loop``). Raises DeclineFix where such a test cannot be repeated there (it
    calls something, or reads a name the loop assigns)."""
    codes: list[str] = []
    tests: list[cst.BaseExpression] = []
    if loop is None or site.call.ctx.function is not steps[0].function:
        # The scaler is made in ``__init__`` or beside a backward in another function than the
        # autocast: the autocast's tests may read names that do not exist there. It stays on with the
        # device, which on the plain path costs at most a skipped step once its scale has grown.
        return codes
    enabled = site.call.arg("enabled")
    # An ``enabled=`` that calls something (``torch.cuda.is_available()``) is not repeated: the
    # scaler's own ``enabled=`` already tests for the device.
    if enabled is not None and is_pure_test(enabled) and not (isinstance(enabled, cst.Name) and enabled.value == "True"):
        tests.append(enabled)
        codes.append(facts.code(enabled))
    conditions = extra_conditions(site.call.ctx, steps[0].ctx)
    if conditions:
        code = condition_code(facts.module, conditions)
        if code is None:
            raise DeclineFix(f"the fp16 autocast runs only under the `if` on line {facts.line_of(conditions[0].test)}, "
                             "whose test calls something; add the GradScaler under that condition by hand")
        tests += [b.test.test for b in conditions]
        codes.append(code)
    if codes:
        read = set().union(*(names_in(test) for test in tests))
        assigned = sorted(name for name in read if any(b.ctx.inside(loop) for b in facts.bindings_of(name)))
        if assigned:
            raise DeclineFix(f"the fp16 autocast runs only where `{' and '.join(codes)}` holds, which reads "
                             f"`{assigned[0]}` assigned in the training loop; add the GradScaler by hand")
    return codes


class Fp16WithoutGradScalerFix(Codemod):
    rule = "TC204"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = AutocastEditor()
        done: set[int] = set()
        for finding in findings:
            plan: AddScaler = finding.fix.plan
            if id(plan.function) in done:
                continue  # two fp16 autocasts in one function: one scaler
            editor.add_grad_scaler(plan.grad_scaler, module)
            done.add(id(plan.function))
        new = module.visit(editor)
        if torch_import_name(context.facts) is None:
            new = ensure_import(new, "import torch")
        return new
