"""TC301 tf32-disabled: CUDA training in fp32 matmul precision without TF32.

Detects a script that trains on CUDA in fp32 (no autocast, no float64) and never decides about TF32.
Fix (numerics): insert ``torch.set_float32_matmul_precision("high")`` after the imports.

Frameworks that own the loop (:mod:`tcaudit.project.frameworks`), where they train in fp32: a Lightning
``Trainer`` (Lightning prints the same hint, on Ampere and later), fixed the same way; Hugging Face training
arguments without ``tf32``, fixed where they are built as ``tf32=`` CUDA-on-Ampere-or-later (``tf32=True``
raises a ValueError on the CPU and before Ampere), declined with ``--tf32`` for ``HfArgumentParser`` and
reported at the trainer when another module builds them. Silent with ``torch_compile`` on (the arguments
then turn TF32 on themselves).
"""

from __future__ import annotations

import re
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, Severity
from tcaudit.project.frameworks import LoopOwner, loop_owners, owners_reached
from tcaudit.project.values import Values
from tcaudit.rewrite.codemod import FixContext, torch_import_name
from tcaudit.rewrite.edits import (
    AddKeyword,
    InsertSetting,
    KeywordPlan,
    add_torch_import,
    apply_keyword_edits,
    insert_setting,
    setting_plan,
)
from tcaudit.rules.advice import held_back, little_to_gain, set_where_built
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import full_name, strip_comments
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
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE),
                r"Trainer(?<!\wTrainer)\b|TrainingArguments|SFTConfig|HfArgumentParser|LightningCLI")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not context.settings.target.has_tf32:
            return  # TF32 Tensor Cores start with Ampere (sm_80): on a V100 or T4 the setting does nothing
        if TF32_SETTING.search(strip_comments(facts.source.text)):
            return
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            yield from self._frameworks(facts, context)
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


    def _frameworks(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """A Lightning trainer or Hugging Face training arguments that train in fp32 (TC215's question) with
        TF32 never decided."""
        values = context.values(facts)
        lightning_reported = False
        for owner in loop_owners(facts):
            if owner.framework == "accelerate" or owner.cpu_only(values) or not owner.trains_in_fp32(values):
                continue
            if owner.framework == "lightning":
                if lightning_reported:
                    continue  # one setting for the whole process: the first trainer says it
                lightning_reported = True
                precision = owner.setting(values, "precision")
                unseen = precision.source == "config" and not any(v.where for v in precision.values or [])
                yield self.finding(
                    facts,
                    owner.node.func,
                    f"Lightning `{owner.label}` trains in fp32 without TF32 matmuls: {_short_how(precision.how)}",
                    severity=Severity.INFO if unseen else None,
                    explanation="Lightning runs fp32 matmuls at full FP32 precision unless told otherwise (on Ampere "
                    "and later it prints a hint to call `torch.set_float32_matmul_precision`); TF32 tensor cores run "
                    f"them several times faster: `{FIX_CODE}` after the imports, or mixed precision (TC215).",
                    fix=self.planned_fix(FixClass.NUMERICS, "enable TF32 for fp32 matmuls after the imports",
                                         lambda: setting_plan(facts, FIX_CODE)),
                )
                continue
            if not _tf32_undecided(owner, values):
                continue
            yield self.finding(
                facts,
                owner.node.func,
                f"`{owner.label}` trains in fp32 without TF32 matmuls: {_tf32_how(owner)}",
                explanation=_HF_EXPLANATION,
                fix=self.planned_fix(FixClass.NUMERICS, "set tf32 where CUDA has TF32 (Ampere and later)",
                                     lambda owner=owner: _hf_plan(owner)),
            )
        for trainer, owner in owners_reached(facts, context.project(facts)):
            if owner.cpu_only(values) or not owner.trains_in_fp32(values) or not _tf32_undecided(owner, values):
                continue
            where = owner.where
            yield self.finding(
                facts,
                trainer.node.func,
                f"the `{owner.label}` this trainer gets trains in fp32 without TF32 matmuls (built in another module)",
                explanation=_HF_EXPLANATION + " Set it where the arguments are built.",
                fix=self.planned_fix(FixClass.NUMERICS, "set tf32 where CUDA has TF32 (Ampere and later)",
                                     lambda where=where: set_where_built(where, f"tf32={_TF32_WHERE_AMPERE}")),
                related=[self.place(owner.facts, owner.node.func,
                                    f"the {owner.label} this trainer gets: fp32, no TF32")],
            )


_HF_EXPLANATION = (
    "Without `bf16`/`fp16` the Trainer runs every matmul in fp32, and without `tf32` at full FP32 precision; TF32 "
    "tensor cores (Ampere and later) run them several times faster. `tf32=True` alone raises a ValueError on the "
    "CPU and on GPUs before Ampere, so the fix sets it where CUDA has TF32; mixed precision (TC215) gains more."
)


_TF32_WHERE_AMPERE = "torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8"


def _short_how(how: str) -> str:
    return how if len(how) <= 50 else "`precision` is 32"


def _tf32_undecided(owner: LoopOwner, values: Values) -> bool:
    """Hugging Face arguments that leave ``tf32`` unset (not on the command line either) and do not compile
    (``torch_compile=True`` turns TF32 on by itself in ``TrainingArguments.__post_init__``)."""
    tf32 = owner.setting(values, "tf32")
    if tf32.arg is not None or not tf32.values or any(v.value is not None for v in tf32.values):
        return False  # written, with any value, is the user's decision (as `allow_tf32 = False` is)
    compiled = owner.setting(values, "torch_compile").values
    return bool(compiled) and all(v.value is False for v in compiled)


def _tf32_how(owner: LoopOwner) -> str:
    if owner.parsed_by == "HfArgumentParser":
        return "`--tf32` is not passed"
    return "`tf32` is not set"


def _hf_plan(owner: LoopOwner) -> KeywordPlan:
    if owner.parsed_by is not None:
        raise DeclineFix(f"the training arguments come from the command line (`{owner.parsed_by}`): pass `--tf32 True` "
                         "on a GPU of Ampere or later (it raises a ValueError elsewhere)")
    if owner.call.has_star_kwargs:
        raise DeclineFix("the call passes `**kwargs`, which may hold `tf32`; a second one would be a TypeError")
    torch_local = torch_import_name(owner.facts)
    name = torch_local or "torch"
    code = _TF32_WHERE_AMPERE.replace("torch.", f"{name}.")
    return AddKeyword(owner.node, "tf32", code, () if torch_local else ("torch",))


def _trained_dtype(facts: ScriptFacts, pipeline) -> str | None:
    """``"float64"`` for fp64 training (``model.double()``, ``.to(torch.float64)``,
    ``set_default_dtype(torch.float64)``), ``"half"`` for a model cast to fp16/bf16 as a whole
    (``model.half()``, ``.to(torch.bfloat16)``) and not cast back (``model.half().float()``); None for fp32."""
    models = set(pipeline.trained_model_names) | facts.model_names
    for call in facts.calls:
        if (call.qualname or "") == "torch.set_default_dtype" and call.node.args:
            dtype = facts.resolve(full_name(call.node.args[0].value))
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
        dtypes = {facts.resolve(full_name(a.value)) for a in call.args}
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
        # Hugging Face training arguments get ``tf32=`` where they are built; otherwise one setting per file.
        options: list[KeywordPlan] = [f.fix.plan for f in findings if isinstance(f.fix.plan, AddKeyword)]
        settings = [f.fix.plan for f in findings if isinstance(f.fix.plan, InsertSetting)]
        if options:
            # Hugging Face arguments only: a file that owns a loop or a Lightning trainer gets the one setting.
            new = apply_keyword_edits(module, options)
            return add_torch_import(new, "import torch") if any("torch" in p.imports for p in options) else new
        return insert_setting(module, context.facts, settings[0].code)
