"""TC505 single-process-training: a CUDA training script that can only ever use one GPU (info)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code, loop_header_end
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod
from tcaudit.rewrite.ddp import DdpConversion


class SingleProcessTraining(ScriptRule):
    id = "TC505"
    # Necessary: the text names CUDA and has a training step (a backward or an optimizer step).
    triggers = (r"(?s)\A(?=.*\bcuda\b).*(?:\.backward\(|\.step\()",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.uses_cuda or not facts.training_steps or not facts.optimizer_steps or not info.is_script:
            return
        if info.multi_process_reasons or info.is_rl_script:
            return  # already distributed / Hogwild / a framework's job / RL: data comes from an env
        loop = info.first_training_loop()
        if loop is None or in_test_code(loop):
            return
        anchor = {
            "kind": "convert-ddp",
            "loop_line": facts.line_of(loop.node),
            "models": sorted(facts.model_names),
            "loaders": [info.dataloader_name(c) for c in info.dataloaders],
            "launch": "torchrun --nproc_per_node=N",
        }
        if not info.dataloaders:
            fix = Fix(
                FixClass.STRUCTURAL,
                "wrap the model in DDP and launch with torchrun (fix --ddp)",
                option="ddp",
                available=False,
                reason="no DataLoader to shard with a DistributedSampler; the data pipeline must be split "
                "across ranks by hand",
                anchor=anchor,
            )
        else:
            fix = Fix(
                FixClass.STRUCTURAL,
                "wrap the model in DDP and launch with torchrun (fix --ddp)",
                option="ddp",
                anchor=anchor,
            )
        yield self.finding(
            facts,
            loop.node,
            "this CUDA training loop runs in a single process on one GPU; DistributedDataParallel under "
            "torchrun scales it across the GPUs of the machine",
            end_node=loop_header_end(loop.node),
            fix=fix,
        )


# -- the fix ------------------------------------------------------------------------------------

class SingleProcessTrainingFix(Codemod):
    rule = "TC505"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return DdpConversion(module, context.facts).convert()
