"""TC302 cudnn-benchmark-off: a convnet trained on CUDA without ``cudnn.benchmark = True``.

Detects a CUDA convnet training script that never sets ``cudnn.benchmark``/``deterministic``.
Fix (numerics): insert ``torch.backends.cudnn.benchmark = True`` after the imports.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import insert_setting
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import CUDA_TEXT, InsertSetting, all_of, pipeline_facts, setting_plan

FIX_CODE = "torch.backends.cudnn.benchmark = True"


class CudnnBenchmarkOff(ScriptRule):
    id = "TC302"
    triggers = (all_of(r"backward", CUDA_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training or _cudnn_configured(facts):
            return
        models = pipeline.convnets(context.models)  # the audit's FLOP shares where it built the model
        if not models:
            return
        model = models[0]
        yield self.finding(
            facts,
            model.construction,
            f"convnet `{model.name}` trains on CUDA without `{FIX_CODE}`: cuDNN picks its convolution "
            "algorithms by heuristics instead of timing them for these fixed input shapes",
            fix=self.planned_fix(
                FixClass.NUMERICS,
                "let cuDNN time and choose its convolution algorithms",
                lambda: setting_plan(facts, FIX_CODE),
            ),
        )


def _cudnn_configured(facts: ScriptFacts) -> bool:
    """Any write of ``cudnn.benchmark`` / ``cudnn.deterministic`` (``True`` is done, ``False`` is
    deliberate, e.g. under ``--seed``), or any ``use_deterministic_algorithms`` call."""
    for binding in facts.bindings:
        target = facts.resolve(binding.target) or binding.target
        if target.endswith(("cudnn.benchmark", "cudnn.deterministic")):
            return True
        if target.split(".")[-1] in ("benchmark", "deterministic") and "cudnn" in target:
            return True
    for call in facts.calls:
        name = call.qualname or call.name or ""
        if name.endswith("use_deterministic_algorithms"):
            return True
    return False


# -- the fix ------------------------------------------------------------------------------------

class CudnnBenchmarkOffFix(Codemod):
    rule = "TC302"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: InsertSetting = findings[0].fix.plan  # one finding per file
        return insert_setting(module, context.facts, plan.code)
