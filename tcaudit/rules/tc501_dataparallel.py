"""TC501 dataparallel: ``torch.nn.DataParallel``, recognised by type (an alias named ``DDP`` too).

Fix (structural, ``fix --ddp``): the DDP conversion of :mod:`tcaudit.rewrite.ddp`, with the
``DataParallel(...)`` call replaced by the DistributedDataParallel wrap. Declined for an alias (the
name would change meaning at every use) and for every reason the conversion itself declines,
planned here so that ``scan`` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rewrite.ddp import DdpLayout, apply_conversion, plan_conversion
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts


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
        if info.is_ddp_script:
            # The script already offers DDP/FSDP; DataParallel is its fallback for a plain launch
            # (the PyTorch ImageNet example's shape). TRAPS 8: add only what is missing.
            return
        wraps = info.wraps_of("dataparallel")
        for wrap in wraps:
            call = wrap.call
            if in_test_code(call.ctx):
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
            yield self.finding(
                facts,
                call.node,
                f"{shown} runs one process that scatters each batch and gathers the outputs every step "
                "and replicates the model every forward; DistributedDataParallel with one process per GPU "
                "is faster even on one machine",
                fix=self.planned_fix(
                    FixClass.STRUCTURAL,
                    "launch with torchrun and wrap in DistributedDataParallel (fix --ddp)",
                    plan,
                    option="ddp",
                ),
            )


class DataParallelFix(Codemod):
    rule = "TC501"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: ConvertDataParallel = findings[0].fix.plan  # DataParallel used more than once is declined
        return apply_conversion(module, context.facts, plan.layout)
