"""TC102 conv-channels-unaligned, script level: a channel count the script sets as a literal is not a multiple of 8.

The model audit (``tcaudit/model/tc102_conv_channels_unaligned.py``) measures the built model and
reports every unaligned convolution, with no fix. This half reads the script: a channel count out of
one convolution and into the next (``BatchNorm2d(C)``/``LayerNorm(C)``/``GroupNorm(g, C)`` in between
taking the same size, or a ``nn.Linear(C, ...)`` after global pooling) that the script writes as a
literal it controls (a constant, an argparse default, a model class's parameter default, or
``nn.Conv2d(32, 30, 3)`` then ``nn.Conv2d(30, 64, 1)``), found and judged by
:mod:`tcaudit.script.layer_widths`. It runs only when asked for (``tcaudit fix --pad-dims``, ``pad-dims =
true``), as TC101's script half. Fix (numerics): the literal becomes the model audit's suggested count (30 → 32). Declined with the reason
where that is not certain (a checkpoint load, a grouped convolution, a GroupNorm whose groups would
not divide the padded count, the count feeding anything but layer widths, ...). One finding per
count (``script.layer_widths.one_width_finding``), as TC101's script half.
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


class ChannelWidthLiteral(ScriptRule):
    id = "TC102"
    triggers = (all_of(BACKWARD_CALL, r"Conv[123]d"),)

    @classmethod
    def merge_model_findings(cls, script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
        return one_width_finding(script, model)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not context.settings.pad_dims:
            return  # an opt-in: without it the model audit's findings are the whole report, as before
        for width in script_widths(facts):
            if width.rule == self.id:
                cost = cost_note(self.spec, context.settings.gpu, "channels")
                effect = f"cuDNN cannot use its fast bf16/fp16 Tensor Core kernels for {width_layers(facts, width)}{cost}"
                what = f"channel count {width.value}{width_named(width)}"
                yield width_finding(self, facts, width, what, effect, "channels")


class PadChannelWidth(Codemod):
    rule = "TC102"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return pad_literals(module, findings)
