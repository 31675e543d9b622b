"""TC215 framework-fp32-training: a framework that owns the loop trains in fp32 by default.

TC201's question for a Lightning ``Trainer`` (``precision`` unset or ``32``), a Hugging Face
``TrainingArguments`` / ``Seq2SeqTrainingArguments`` / TRL ``SFTConfig`` (neither ``bf16`` nor ``fp16``),
one parsed by ``HfArgumentParser`` (``--bf16`` not passed), an ``accelerate.Accelerator``
(``mixed_precision`` "no", an argparse ``--mixed_precision`` defaulting to "no") and a ``LightningCLI``
(``trainer.precision`` set nowhere). Silent for a trainer that visibly runs on the CPU and for a value
that cannot be read (a ``**kwargs``, a value computed at run time).

Fix (numerics): the framework's own option, in the file where the settings are built, on where CUDA is
(``precision="bf16-mixed" if torch.cuda.is_available() else "32-true"``, ``bf16=torch.cuda.is_available()``,
``mixed_precision="bf16" if torch.cuda.is_available() else "no"``; fp16 for a GPU without bf16), so a
CPU run computes what it did. Declined, naming the flag or key to set, where the value comes from the
command line, a config file or another module.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, Severity
from tcaudit.project.frameworks import OWNER_NAMED, LoopOwner, Setting, loop_owners, owners_reached
from tcaudit.project.values import Value, Values
from tcaudit.rewrite.codemod import FixContext, torch_import_name
from tcaudit.rewrite.edits import AddKeyword, KeywordPlan, ReplaceArgument, add_torch_import, apply_keyword_edits
from tcaudit.rules.advice import set_where_built
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts

_EXPLANATION = ("Without mixed precision every matmul and convolution runs in fp32, off the Tensor Cores' bf16/fp16 "
                "path (8-16x the fp32 throughput on Ampere and later); the framework's own option turns autocast on "
                "for the forward and the loss.")


class FrameworkFp32Training(ScriptRule):
    id = "TC215"
    triggers = (OWNER_NAMED,)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        values = context.values(facts)
        half = "fp16" if context.settings.precision == "fp16" or not context.settings.target.has_bf16 else "bf16"
        for owner in loop_owners(facts):
            if owner.cpu_only(values):
                continue
            verdict = _fp32(owner, values)
            if verdict is None:
                continue
            setting, words = verdict
            option = _option(owner, half)
            # Left to a config file tcaudit did not find (a bare Accelerator() under `accelerate launch`, a
            # LightningCLI whose YAML is passed on the command line): fp32 only if that file says nothing.
            unseen = setting.source == "config" and not any(v.where for v in setting.values or [])
            yield self.finding(
                facts,
                owner.node.func,
                f"{_who(owner)} trains in fp32: {words}",
                severity=Severity.INFO if unseen else None,
                explanation=f"{_EXPLANATION} Set `{option}`.",
                fix=self.planned_fix(FixClass.NUMERICS, f"set {option}",
                                     lambda owner=owner, setting=setting: _plan(owner, setting, half)),
            )
        for trainer, owner in owners_reached(facts, context.project(facts)):
            if owner.cpu_only(values):
                continue
            verdict = _fp32(owner, values)
            if verdict is None:
                continue
            where = owner.where
            option = _option(owner, half)
            yield self.finding(
                facts,
                trainer.node.func,
                f"{_who(owner)} this trainer gets (built in {where}) trains in fp32: {verdict[1]}",
                explanation=f"{_EXPLANATION} Set `{option}` where the arguments are built.",
                fix=self.planned_fix(FixClass.NUMERICS, f"set {option}", lambda where=where, option=option: set_where_built(
                    where, option)),
                related=[self.place(owner.facts, owner.node.func, f"the {owner.label} this trainer gets: fp32")],
            )


def _who(owner: LoopOwner) -> str:
    if owner.framework == "lightning":
        return f"Lightning `{owner.label}`"
    return f"`{owner.label}`"


def _fp32(owner: LoopOwner, values: Values) -> tuple[Setting, str] | None:
    """(the setting to change, why it is fp32) when every value the owner may train with is fp32."""
    if not owner.trains_in_fp32(values):
        return None
    if owner.framework == "lightning":
        precision = owner.setting(values, "precision")
        return precision, precision.how
    if owner.framework == "transformers":
        bf16, fp16 = owner.setting(values, "bf16"), owner.setting(values, "fp16")
        if bf16.source == "default" and fp16.source == "default":
            return bf16, "neither `bf16` nor `fp16` is set (both default to False)"
        if bf16.source == "command line" and fp16.source == "command line":
            return bf16, "`--bf16` and `--fp16` are not passed (both default to False)" if not bf16.arg else bf16.how
        return (fp16 if fp16.arg is not None and bf16.arg is None else bf16), f"{bf16.how}, {fp16.how}"
    mixed = owner.setting(values, "mixed_precision")
    if mixed.source == "config":
        return mixed, "no `mixed_precision` given, so `accelerate launch` decides (\"no\" unless told)"
    if all(v.value is None for v in mixed.values):
        # ``--mixed_precision`` defaulting to None (diffusers' scripts): the launch config decides.
        left = Setting(mixed.key, mixed.arg, [Value(None)], "config", mixed.flag)
        return left, f"{mixed.how}, so `accelerate launch` decides"
    return mixed, mixed.how


def _option(owner: LoopOwner, half: str) -> str:
    """The option the fix sets, as the user would write it."""
    if owner.framework == "lightning":
        return f'precision="{_lightning_value(half)}"'
    if owner.framework == "transformers":
        return f"{half}=True"
    return f'mixed_precision="{half}"'


def _lightning_value(half: str) -> str:
    return "bf16-mixed" if half == "bf16" else "16-mixed"


def _plan(owner: LoopOwner, setting: Setting, half: str) -> KeywordPlan:
    if owner.parsed_by == "HfArgumentParser":
        raise DeclineFix(f"the training arguments come from the command line (`HfArgumentParser`): pass `--{half}`")
    if owner.parsed_by == "LightningCLI":
        value = _lightning_value(half)
        raise DeclineFix(f"the trainer's settings come from LightningCLI's config and command line: set "
                         f"`trainer.precision: {value}` in the config, or pass `--trainer.precision {value}`")
    if setting.source == "command line":
        flag = setting.flag or setting.key
        value = _lightning_value(half) if owner.framework == "lightning" else half
        raise DeclineFix(f"the value comes from the command line ({setting.how}): pass `{flag} {value}`, or change "
                         "the default there by hand")
    if setting.source == "config":
        raise DeclineFix(f"the Accelerator is given no mixed precision of its own, so it takes what `accelerate launch` "
                         f"sets from its config file or flags: run `accelerate launch --mixed_precision {half}` or set `mixed_precision: {half}` "
                         "in the config (writing it into the script would override them)")
    key = setting.key
    if owner.framework == "transformers":
        key = half
        arg = _keyword(owner.node, key)
    else:
        arg = setting.arg
    if arg is not None and literal(arg.value) is ...:
        raise DeclineFix(f"`{key}` is set where its value comes from ({setting.how}): change it there by hand")
    if owner.call.has_star_kwargs:
        raise DeclineFix(f"the call passes `**kwargs`, which may hold `{key}`; a second one would be a TypeError")
    code, needs_torch = _value_code(owner, half)
    imports = ("torch",) if needs_torch else ()
    if arg is not None:
        return ReplaceArgument(owner.node, arg, key, code, imports)
    return AddKeyword(owner.node, key, code, imports)


def _keyword(call: cst.Call, key: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == key), None)


def _value_code(owner: LoopOwner, half: str) -> tuple[str, bool]:
    """The value written, on only where CUDA is (a CPU run keeps computing in fp32), and whether it needs
    ``import torch``; a Lightning trainer told to use the GPU gets the plain value."""
    torch = torch_import_name(owner.facts)
    name = torch or "torch"
    available = f"{name}.cuda.is_available()"
    if owner.framework == "lightning":
        accelerator = _keyword(owner.node, "accelerator")
        if accelerator is not None and literal(accelerator.value) in ("gpu", "cuda"):
            return f'"{_lightning_value(half)}"', False
        return f'"{_lightning_value(half)}" if {available} else "32-true"', torch is None
    if owner.framework == "transformers":
        return available, torch is None
    return f'"{half}" if {available} else "no"', torch is None


# -- the fix ------------------------------------------------------------------------------------------


class FrameworkFp32TrainingFix(Codemod):
    rule = "TC215"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[KeywordPlan] = [finding.fix.plan for finding in findings]
        new = apply_keyword_edits(module, plans)
        if any("torch" in plan.imports for plan in plans):
            new = add_torch_import(new, "import torch")
        return new
