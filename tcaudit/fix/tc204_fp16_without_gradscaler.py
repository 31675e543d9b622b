"""TC204 fix: add a GradScaler to the fp16 training steps that lack one."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, ensure_import, torch_import_name
from tcaudit.fix.tc201_missing_autocast import MissingAutocastFix, _AutocastEditor, add_grad_scaler
from tcaudit.script.amp import amp_facts


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
