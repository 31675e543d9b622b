"""TC501 dataparallel: ``torch.nn.DataParallel``, recognised by type (an alias named ``DDP`` too).

Fix (structural, ``fix --ddp``): the DDP conversion of :mod:`tcaudit.rewrite.ddp`, with the
``DataParallel(...)`` call replaced by the DistributedDataParallel wrap. Declined for an alias (the
name would change meaning at every use) and for every reason the conversion itself declines,
planned here so that ``scan`` shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.ddp import DdpLayout, apply_conversion, plan_conversion
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import single_process_branch
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.script.training_code import flag_frames
from tcaudit.source.syntax import full_name


@dataclass(frozen=True, eq=False)
class ConvertDataParallel(FixPlan):
    kind = "convert-dataparallel"
    layout: DdpLayout  # where the conversion edits this parse
    line: int
    callee: str
    target: str | None


class DataParallelUsed(ScriptRule):
    id = "TC501"
    triggers = (r"DataParallel(?<!DistributedDataParallel)",)  # not DDP (looked behind after the name: faster)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        wraps = info.wraps_of("dataparallel")
        launched = _multi_process_launch(info) if wraps else None
        frozen = pipeline_facts(facts).frozen_model_names if wraps else set()
        for wrap in wraps:
            call = wrap.call
            if in_test_code(call.ctx):
                continue
            wrapped = call.node.args[0].value if call.node.args else None
            if {wrap.target, full_name(wrapped) if wrapped is not None else None} & frozen:
                continue  # a frozen teacher, an EMA copy: no gradients to synchronise, no step to speed up
            if info.is_ddp_script and not (launched and not flag_frames(call.ctx)):
                # The script already offers DDP/FSDP; DataParallel behind a branch is its fallback for
                # a plain launch (the PyTorch ImageNet example's shape). TRAPS 8: add only what is missing.
                continue
            written = call.name or "DataParallel"
            alias = written.split(".")[-1] != "DataParallel"

            def plan(wrap=wrap, written=written, alias=alias) -> ConvertDataParallel:
                if alias:
                    raise DeclineFix(
                        f"`{written}` is DataParallel under another name; converting it would change what "
                        "that name means at every use, so the import and the calls must be renamed by hand first"
                    )
                layout = plan_conversion(facts, dataparallel=wraps, project=context.project(facts))
                return ConvertDataParallel(layout, facts.line_of(wrap.call.node), written, wrap.target)

            shown = f"`{written}` (torch.nn.DataParallel)" if alias else f"`{written}`"
            if launched and single_process_branch(call.ctx) and _wrapped_by_a_ddp_helper(facts, wrap.target):
                continue  # yolov5: ``smart_DDP(model)`` under torchrun, DataParallel for a plain launch
            if launched and single_process_branch(call.ctx):
                launched_here = None  # ``if RANK == -1: DataParallel``: the single-process mode of a DDP script
            else:
                launched_here = launched
            if launched_here:
                # Several processes (``launched``), each with its own DataParallel: nothing all-reduces
                # the gradients between them, so every rank trains its own model.
                message = f"{shown} in a multi-process job ({launched_here}): ranks never synchronise gradients"
                explanation = (
                    "Gradients are never synchronised across ranks, so each process trains its own copy of the "
                    "model; wrap it in DistributedDataParallel."
                )
                severity = Severity.ERROR
            else:
                message = f"{shown} scatters each batch and replicates the model every step in one process"
                explanation = "DistributedDataParallel with one process per GPU is faster, even on one machine."
                severity = None
            yield self.finding(
                facts,
                call.node,
                message,
                explanation=explanation,
                severity=severity,
                fix=self.planned_fix(
                    FixClass.STRUCTURAL,
                    "launch with torchrun and wrap in DistributedDataParallel (fix --ddp)",
                    plan,
                    option="ddp", context=context,
                ),
            )


class DataParallelFix(Codemod):
    rule = "TC501"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: ConvertDataParallel = findings[0].fix.plan  # DataParallel used more than once is declined
        return apply_conversion(module, context.facts, plan.layout)


_LAUNCH_ENV = re.compile(r"""environ(?:\.get)?[\[(]\s*["'](?:LOCAL_RANK|RANK|WORLD_SIZE)["']""")


def _multi_process_launch(info) -> str | None:
    """How the script runs as several processes: ``init_process_group``, ``mp.spawn`` or the torchrun
    environment (``os.environ["LOCAL_RANK"]``); None for a single-process script."""
    facts = info.facts
    if info.init_process_group_calls:
        return "init_process_group"
    for call in facts.calls:
        qual = call.qualname or ""
        if qual.startswith(("torch.multiprocessing", "torch.distributed")) and qual.endswith((".spawn", ".start_processes")):
            return call.name or "spawn"
    match = _LAUNCH_ENV.search(info.text)
    if match:
        return "the torchrun environment"
    return None


_DDP_HELPER = re.compile(r"ddp|distributed|fsdp", re.IGNORECASE)


def _wrapped_by_a_ddp_helper(facts: ScriptFacts, target: str | None) -> bool:
    """The same model is also rebound to a helper's wrap whose name says DDP (``model = smart_DDP(model)``,
    ``model = wrap_distributed(model)``): the script offers DDP through code of another module."""
    if not target:
        return False
    for binding in facts.bindings_of(target):
        value = binding.value
        if not isinstance(value, cst.Call) or not value.args:
            continue
        name = full_name(value.func) or ""
        argument = full_name(value.args[0].value)
        if argument == target and _DDP_HELPER.search(name.split(".")[-1]):
            return True
    return False
