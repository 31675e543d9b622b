"""TC505 single-process-training: a CUDA training script that can only ever use one GPU (info).

Fix (structural, ``fix --ddp``): the DDP conversion of :mod:`tcaudit.rewrite.ddp` (process group from
the torchrun environment, the trained model wrapped in DistributedDataParallel, rank-0-only logging and
saving); the next round adds the DistributedSampler, ``set_epoch`` and ``no_sync`` (TC503/TC504/TC507).
Planned here, so every reason the conversion is declined shows in ``scan``. A training DataLoader
that a helper of another module builds gets its DistributedSampler there (TC503's guarded fix in that
module, made by the same ``fix`` run), or the conversion declines, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.project.loaders import loaders_built_elsewhere
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.ddp import (
    DdpLayout,
    apply_conversion,
    check_helper_loaders,
    check_training_sources,
    convertible_loop,
    plan_conversion,
)
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, loop_header_end
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE, STEP_CALL
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.triggers import all_of


@dataclass(frozen=True, eq=False)
class ConvertToDdp(FixPlan):
    kind = "convert-ddp"
    layout: DdpLayout  # where the conversion edits this parse
    loop_line: int
    model: str  # the trained model that gets the DDP wrap
    models: tuple[str, ...]
    loaders: tuple[str | None, ...]
    launch: str


class SingleProcessTraining(ScriptRule):
    id = "TC505"
    # Necessary: CUDA evidence (ScriptFacts.uses_cuda) and a training step (a backward or an optimizer step).
    triggers = (all_of(CUDA_EVIDENCE, BACKWARD_CALL, STEP_CALL),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        loop = convertible_loop(facts)
        if loop is None:
            return
        info = distributed_facts(facts)

        def plan() -> ConvertToDdp:
            project = context.project(facts)
            elsewhere = loaders_built_elsewhere(facts, project)
            check_training_sources(facts, elsewhere)
            if not info.dataloaders and not elsewhere:
                raise DeclineFix(
                    "no DataLoader to shard with a DistributedSampler; the data pipeline must be split "
                    "across ranks by hand"
                )
            check_helper_loaders(facts, elsewhere, context.settings.root)
            layout = plan_conversion(facts, project=project)
            return ConvertToDdp(
                layout,
                facts.line_of(loop.node),
                layout.model,
                tuple(sorted(facts.model_names)),
                tuple(info.dataloader_name(c) for c in info.dataloaders),
                "torchrun --nproc_per_node=N",
            )

        yield self.finding(
            facts,
            loop.node,
            "CUDA training loop runs in a single process on one GPU",
            explanation="DistributedDataParallel under torchrun scales it across the GPUs of the machine.",
            end_node=loop_header_end(loop.node),
            fix=self.planned_fix(
                FixClass.STRUCTURAL, "wrap the model in DDP and launch with torchrun (fix --ddp)", plan, option="ddp",
                context=context,
            ),
        )


class SingleProcessTrainingFix(Codemod):
    rule = "TC505"
    edits_plan_only = False  # the conversion finds the prints and saves to guard all over the module

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: ConvertToDdp = findings[0].fix.plan  # one finding per file: the first training loop
        return apply_conversion(module, context.facts, plan.layout)
