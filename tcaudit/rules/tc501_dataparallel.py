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

from tcaudit.findings import Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rewrite.ddp import DdpLayout, apply_conversion, plan_conversion
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.training_code import flag_frames


@dataclass(frozen=True, eq=False)
class ConvertDataParallel(FixPlan):
    kind = "convert-dataparallel"
    layout: DdpLayout  # where the conversion edits this parse
    line: int
    callee: str
    target: str | None


class DataParallelUsed(ScriptRule):
    id = "TC501"
    triggers = (r"(?<!Distributed)DataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        wraps = info.wraps_of("dataparallel")
        launched = _multi_process_launch(info) if wraps else None
        for wrap in wraps:
            call = wrap.call
            if in_test_code(call.ctx):
                continue
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
                layout = plan_conversion(facts, dataparallel=wraps)
                return ConvertDataParallel(layout, facts.line_of(wrap.call.node), written, wrap.target)

            shown = f"`{written}` (torch.nn.DataParallel)" if alias else f"`{written}`"
            if launched:
                # Several processes (``launched``), each with its own DataParallel: nothing all-reduces
                # the gradients between them, so every rank trains its own model.
                message = f"{shown} in a multi-process job ({launched}): ranks never synchronise gradients"
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
