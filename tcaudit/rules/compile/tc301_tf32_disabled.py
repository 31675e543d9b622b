"""TC301 tf32-disabled: CUDA training in fp32 matmul precision without TF32.

Detects a script that trains on CUDA in fp32 (no autocast, no float64) and never decides about TF32.
Fix (numerics): insert ``torch.set_float32_matmul_precision("high")`` after the imports.
"""

from __future__ import annotations

import re
from typing import Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, FixClass, Severity
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import InsertSetting, insert_setting, setting_plan
from tcaudit.rules.advice import held_back, little_to_gain
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import strip_comments
from tcaudit.source.triggers import all_of

# Any of these in the code means the user decided about TF32 (on, or deliberately off: ``allow_tf32 =
# False``, ``"highest"``, ``"ieee"``) — either way there is nothing to report.
TF32_SETTING = re.compile(
    r"allow_tf32|fp32_precision|set_float32_matmul_precision|NVIDIA_TF32_OVERRIDE|TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
)
FLOAT64 = ("torch.float64", "torch.double")
FIX_CODE = 'torch.set_float32_matmul_precision("high")'


class Tf32Disabled(ScriptRule):
    id = "TC301"
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not context.settings.target.has_tf32:
            return  # TF32 Tensor Cores start with Ampere (sm_80): on a V100 or T4 the setting does nothing
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        if TF32_SETTING.search(strip_comments(facts.source.text)):
            return
        # Under autocast the GEMMs run in fp16/bf16 already; TF32 would only touch the few fp32 ops
        # left, so a script with AMP (even behind a flag) gets no finding.
        if pipeline.trains_under_autocast or _trained_dtype(facts, pipeline) in ("float64", "half"):
            return  # fp64 never uses TF32; a model cast to fp16/bf16 runs its GEMMs on tensor cores already
        step = facts.training_steps[0]
        models = pipeline.trained_models
        profiles = [pipeline.profile_of(m, context.models) for m in models]
        if profiles and all(p is not None and p.gemm_share == 0 for p in profiles):
            return  # only convolutions (DCGAN, a 1x1 conv): cuDNN runs them in TF32 by default, no matmul to speed up
        convnet = bool(models) and all(pipeline.is_convnet(m, context.models) for m in models)
        small = little_to_gain(facts, context)
        if convnet:
            # No figure for a launch-bound model: the explanation says why it gains nothing instead.
            cost = context.cost(self.spec, "convnet") if small is None else ""
            message = "fp32 training without TF32 matmuls (a convnet: small gain)"
            explanation = (
                f"This convnet gains little{cost}, only its linear layers would: `{FIX_CODE}` after the imports."
            )
            severity = Severity.INFO
        else:
            message = "fp32 matmuls run at full FP32 precision without TF32"
            explanation = (
                "TF32 tensor cores (Ampere and newer) run them several times faster: add "
                f"`{FIX_CODE}` after the imports, or train under autocast."
            )
            severity = None
        if small is not None:
            message, explanation, severity = message + small.message, explanation + small.explanation, Severity.INFO
        yield self.finding(
            facts,
            step.backward.node,
            message,
            severity=severity,
            explanation=explanation,
            details=small.details if small is not None else None,
            fix=held_back(self.planned_fix(
                FixClass.NUMERICS,
                "enable TF32 for fp32 matmuls after the imports",
                lambda: setting_plan(facts, FIX_CODE),
            ), small, self.id, context.settings),
        )


def _trained_dtype(facts: ScriptFacts, pipeline) -> str | None:
    """``"float64"`` for fp64 training (``model.double()``, ``.to(torch.float64)``,
    ``set_default_dtype(torch.float64)``), ``"half"`` for a model cast to fp16/bf16 as a whole
    (``model.half()``, ``.to(torch.bfloat16)``) and not cast back (``model.half().float()``); None for fp32."""
    models = set(pipeline.trained_model_names) | facts.model_names
    for call in facts.calls:
        if (call.qualname or "") == "torch.set_default_dtype" and call.node.args:
            dtype = facts.resolve(get_full_name_for_node(call.node.args[0].value))
            if dtype in FLOAT64:
                return "float64"
            if dtype in HALF:
                return "half"
    casts: list[str] = []
    for call in facts.calls:
        if isinstance(call.receiver, (cst.Name, cst.Attribute)) and call.receiver_name in models:
            cast = _cast_of(facts, call.node)
            if cast:
                casts.append(cast)
    for name in models:
        for binding in facts.bindings_of(name):
            value = binding.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                cast = _cast_of(facts, value)
                if cast:
                    casts.append(cast)
                    break  # the outermost cast is the one that stays
                value = value.func.value
    if "float64" in casts:
        return "float64"
    if casts and all(c == "half" for c in casts):
        return "half"
    return None


HALF = ("torch.float16", "torch.half", "torch.bfloat16")


def _cast_of(facts: ScriptFacts, call: cst.Call) -> str | None:
    if not isinstance(call.func, cst.Attribute):
        return None
    method = call.func.attr.value
    if method == "double":
        return "float64"
    if method in ("half", "bfloat16"):
        return "half"
    if method == "float":
        return "float32"
    if method == "to":
        dtypes = {facts.resolve(get_full_name_for_node(a.value)) for a in call.args}
        if dtypes & set(FLOAT64):
            return "float64"
        if dtypes & set(HALF):
            return "half"
        if dtypes & {"torch.float32", "torch.float"}:
            return "float32"
    return None


# -- the fix ------------------------------------------------------------------------------------

class Tf32DisabledFix(Codemod):
    rule = "TC301"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: InsertSetting = findings[0].fix.plan  # one finding per file
        return insert_setting(module, context.facts, plan.code)
