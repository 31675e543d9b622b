"""TC204 fp16-without-gradscaler: fp16 training without loss scaling loses small gradients.

Detects fp16 autocast in a training script with no GradScaler anywhere, and a model cast to fp16
and trained (which TC206 rewrites first).

Fix (numerics), for fp16 autocast: create one ``torch.amp.GradScaler`` per function holding the
autocast's training steps, scale their backwards, route ``optimizer.step()`` through it and update it
after the last step (the same edit as TC201's GradScaler, held in an :class:`AddScaler` plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import DeclineFix, FixContext, ensure_import, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.tc201_missing_autocast import AutocastEditor, GradScalerPlan, plan_grad_scaler
from tcaudit.script.amp import HALF, amp_facts, cast_dtype
from tcaudit.script.facts import ScriptFacts


@dataclass(frozen=True, eq=False)
class AddScaler(FixPlan):
    kind = "add-scaler"
    function: cst.FunctionDef | None  # the function whose steps get the scaler (None: module level)
    grad_scaler: GradScalerPlan


class Fp16WithoutGradScaler(ScriptRule):
    id = "TC204"
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
                    "fp16 autocast without a GradScaler: gradients below 6e-8 flush to zero and large "
                    "ones overflow; scale the loss with torch.amp.GradScaler, or use bf16",
                    fix=self.planned_fix(
                        FixClass.NUMERICS, description, lambda site=site: self._plan(facts, amp, site.call.ctx.function)
                    ),
                )
        for call in amp.half_model_casts:
            if cast_dtype(facts, call) != HALF:
                continue
            yield self.finding(
                facts,
                call.node,
                "model trained in fp16 without a GradScaler: small gradients flush to zero; keep fp32 "
                "weights under autocast with a GradScaler (see TC206)",
                fix=Fix(
                    FixClass.NUMERICS,
                    "replace the cast with autocast and a GradScaler",
                    available=False,
                    reason="the model cast is rewritten by TC206's fix first",
                ),
            )

    @staticmethod
    def _plan(facts: ScriptFacts, amp, function) -> AddScaler:
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
        return AddScaler(function, plan_grad_scaler(facts, steps))


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
