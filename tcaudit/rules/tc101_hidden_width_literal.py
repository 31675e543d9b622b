"""TC101 gemm-dim-unaligned, script level: a hidden width the script sets as a literal is not a multiple of 8.

The model audit (``tcaudit/model/tc101_gemm_dim_unaligned.py``) measures the built model and reports
every unaligned GEMM, with no fix. This half reads the script: a width between two ``nn.Linear``
layers that the script writes as a literal it controls (``hidden = 500``, an argparse default, a model
class's parameter default, or ``nn.Linear(784, 500)`` then ``nn.Linear(500, 10)``), found and judged
by :mod:`tcaudit.script.layer_widths`. It runs only when asked for (``tcaudit fix --pad-dims``,
``pad-dims = true``): without that, scan and fix report and edit what they did before. Fix (numerics): the literal becomes the model audit's suggested size (the next multiple of 64 from
256 on, of 8 below), so the layers get units the model's input and output never see. Declined with
the reason where that is not certain (a checkpoint load, the width feeding anything but layer widths,
the model's input or output width, ...). One finding per width (``script.layer_widths.one_width_finding``): a
fixable literal stands for the model audit's findings of the layers it sizes; a declined one gives
its reason to them.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.literals import pad_literals
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.costs import cost_note
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.layer_widths import one_width_finding, script_widths, width_finding, width_layers, width_named
from tcaudit.source.triggers import all_of


class HiddenWidthLiteral(ScriptRule):
    id = "TC101"
    triggers = (all_of(BACKWARD_CALL, r"Linear"),)

    @classmethod
    def merge_model_findings(cls, script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
        return one_width_finding(script, model)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not context.settings.pad_dims:
            return  # an opt-in: without it the model audit's findings are the whole report, as before
        for width in script_widths(facts):
            if width.rule == self.id:
                key = "n_multiple_of_4" if width.value % 4 == 0 else "odd_n"
                cost = cost_note(self.spec, context.settings.gpu, key)
                effect = f"the GEMMs of {width_layers(facts, width)} miss the fast bf16/fp16 Tensor Core kernels{cost}"
                what = f"hidden width {width.value}{width_named(width)}"
                yield width_finding(self, facts, width, what, effect, "units")


class PadHiddenWidth(Codemod):
    rule = "TC101"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return pad_literals(module, findings)
