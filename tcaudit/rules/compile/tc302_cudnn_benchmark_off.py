"""TC302 cudnn-benchmark-off: a convnet trained on CUDA without ``cudnn.benchmark = True``.

Detects a CUDA convnet training script that never sets ``cudnn.benchmark``/``deterministic``.
Fix (numerics): insert ``torch.backends.cudnn.benchmark = True`` after the imports.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import InsertSetting, insert_setting, setting_plan
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.triggers import all_of

FIX_CODE = "torch.backends.cudnn.benchmark = True"


class CudnnBenchmarkOff(ScriptRule):
    id = "TC302"
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training or _cudnn_configured(facts):
            return
        models = pipeline.convnets(context.models)  # the audit's FLOP shares where it built the model
        models = [site for site in models if not _takes_image_lists(facts, site.name)]
        if not models:
            return
        model = models[0]
        yield self.finding(
            facts,
            model.construction,
            f"convnet `{model.name}` trains on CUDA without `{FIX_CODE}`",
            explanation="cuDNN then picks its convolution algorithms by heuristics instead of timing them for "
            "these fixed input shapes.",
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


def _takes_image_lists(facts: ScriptFacts, model_name: str) -> bool:
    """``model(images, targets)`` with ``images = list(image.to(device) for image in images)``: the
    detection API (torchvision's detection models, DETR), whose images differ in size from batch to
    batch, so benchmark would re-time the convolutions for every new shape."""
    for call in facts.calls:
        if call.name != model_name or not call.node.args:
            continue
        first = call.node.args[0].value
        if _builds_list(first):
            return True
        if isinstance(first, cst.Name) and any(
            binding.ctx == call.ctx and _builds_list(binding.value) for binding in facts.bindings_of(first.value)
        ):
            return True
    return False


def _builds_list(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.List, cst.ListComp)):
        return True
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "list"


# -- the fix ------------------------------------------------------------------------------------

class CudnnBenchmarkOffFix(Codemod):
    rule = "TC302"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: InsertSetting = findings[0].fix.plan  # one finding per file
        return insert_setting(module, context.facts, plan.code)
