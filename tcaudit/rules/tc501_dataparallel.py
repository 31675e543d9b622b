"""TC501 dataparallel: ``torch.nn.DataParallel``, recognised by type (an alias named ``DDP`` too)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rules.base import Codemod
from tcaudit.rewrite.ddp import DdpConversion
from tcaudit.script.distributed import distributed_facts


class DataParallelUsed(ScriptRule):
    id = "TC501"
    triggers = (r"(?<!Distributed)DataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if info.is_ddp_script:
            # The script already offers DDP/FSDP; DataParallel is its fallback for a plain launch
            # (the PyTorch ImageNet example's shape). TRAPS 8: add only what is missing.
            return
        for wrap in info.wraps_of("dataparallel"):
            call = wrap.call
            if in_test_code(call.ctx):
                continue
            written = call.name or "DataParallel"
            alias = written.split(".")[-1] != "DataParallel"
            if alias:
                fix = Fix(
                    FixClass.STRUCTURAL,
                    "launch with torchrun and wrap in DistributedDataParallel (fix --ddp)",
                    option="ddp",
                    available=False,
                    reason=f"`{written}` is DataParallel under another name; converting it would change what "
                    "that name means at every use, so the import and the calls must be renamed by hand first",
                    anchor={"kind": "convert-dataparallel", "line": facts.line_of(call.node), "callee": written},
                )
            else:
                fix = Fix(
                    FixClass.STRUCTURAL,
                    "launch with torchrun and wrap in DistributedDataParallel (fix --ddp)",
                    option="ddp",
                    anchor={
                        "kind": "convert-dataparallel",
                        "line": facts.line_of(call.node),
                        "callee": written,
                        "target": wrap.target,
                    },
                )
            shown = f"`{written}` (torch.nn.DataParallel)" if alias else f"`{written}`"
            yield self.finding(
                facts,
                call.node,
                f"{shown} runs one process that scatters each batch and gathers the outputs every step "
                "and replicates the model every forward; DistributedDataParallel with one process per GPU "
                "is faster even on one machine",
                fix=fix,
            )


# -- the fix ------------------------------------------------------------------------------------

class DataParallelFix(Codemod):
    rule = "TC501"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        wraps = distributed_facts(context.facts).wraps_of("dataparallel")
        if not wraps:
            raise DeclineFix("the DataParallel call could not be located")
        return DdpConversion(module, context.facts).convert(dataparallel=wraps)
