"""TC204 fp16-without-gradscaler: fp16 training without loss scaling loses small gradients."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import HALF, amp_facts, cast_dtype
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, ensure_import, torch_import_name
from tcaudit.rules.base import Codemod
from tcaudit.rules.tc201_missing_autocast import MissingAutocastFix, _AutocastEditor, add_grad_scaler
from tcaudit.script.amp import amp_facts


class Fp16WithoutGradScaler(ScriptRule):
    id = "TC204"
    triggers = (r"\.backward\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.training_steps or facts.mentions_gradscaler:
            return
        amp = amp_facts(facts)
        reason = None
        if amp.uses_lbfgs:
            reason = "GradScaler cannot drive an LBFGS closure (use bf16 instead)"
        elif not amp.has_optimizer:
            reason = "no torch.optim optimizer: GradScaler.step needs one (use bf16 instead)"
        fix = Fix(
            FixClass.NUMERICS,
            "add torch.amp.GradScaler: scaler.scale(loss).backward(), scaler.step(opt), scaler.update()",
            available=reason is None,
            reason=reason,
            anchor={"kind": "add-scaler"},
        )
        for site in amp.training_autocast_sites:
            if site.dtypes == frozenset({HALF}):
                yield self.finding(
                    facts,
                    site.call.node,
                    "fp16 autocast without a GradScaler: gradients below 6e-8 flush to zero and large "
                    "ones overflow; scale the loss with torch.amp.GradScaler, or use bf16",
                    fix=fix,
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


# -- the fix ------------------------------------------------------------------------------------

class Fp16WithoutGradScalerFix(Codemod):
    rule = "TC204"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        torch_name = torch_import_name(facts) or "torch"
        helper = MissingAutocastFix()
        editor = _AutocastEditor()
        done: set = set()
        lines = {f.location.line for f in findings}
        for site in amp_facts(facts).training_autocast_sites:
            if facts.line_of(site.call.node) not in lines:
                continue
            function = site.call.ctx.function
            if function in done:
                continue
            steps = [s for s in facts.training_steps if s.function is function and not s.scaler]
            if not steps:
                raise DeclineFix("the backward is not in the function that opens the fp16 autocast")
            add_grad_scaler(helper, facts, steps, editor, torch_name)
            done.add(function)
        new = module.visit(editor)
        if torch_import_name(facts) is None:
            new = ensure_import(new, "import torch")
        return new
