"""TC505 single-process-training: a CUDA training script that can only ever use one GPU (info).

Fix (structural, ``fix --ddp``): the DDP conversion of :mod:`tcaudit.rewrite.ddp` (process group from
the torchrun environment, the trained model wrapped in DistributedDataParallel, rank-0-only logging and
saving); the next round adds the DistributedSampler, ``set_epoch`` and ``no_sync`` (TC503/TC504/TC507).
Planned here, so every reason the conversion is declined shows in ``scan``. A training DataLoader
that a helper of another module builds gets its DistributedSampler there (TC503's guarded fix in that
module, made by the same ``fix`` run), or the conversion declines, naming it.

Frameworks that own the loop: a Lightning ``Trainer`` pinned to one device (``devices=1``, ``devices=[0]``,
``gpus=1``) is reported at the trainer, the fix declined naming what to set (``devices`` decides how many
processes Lightning launches and the global batch); a Hugging Face trainer is reported once per file with
no change to the script: it runs DDP by itself under ``torchrun``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan
from tcaudit.project.frameworks import LoopOwner, Setting, hf_trainer_calls, loop_owners
from tcaudit.project.loaders import loaders_built_elsewhere
from tcaudit.project.values import Values
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
    # Or a framework's trainer: Lightning's ``Trainer(devices=...)``, Hugging Face's ``Trainer``/``SFTTrainer``.
    triggers = (all_of(CUDA_EVIDENCE, BACKWARD_CALL, STEP_CALL), r"Trainer\b|LightningCLI")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        loop = convertible_loop(facts)
        if loop is None:
            yield from self._frameworks(facts, context)
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


    def _frameworks(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        values = context.values(facts)
        owners = loop_owners(facts)
        for owner in owners:
            if owner.framework != "lightning" or owner.cpu_only(values) or _distributed_on_purpose(owner, values):
                continue
            pinned = _one_device(owner, values)
            if pinned is None:
                continue
            yield self.finding(
                facts,
                owner.node.func,
                f"Lightning `{owner.label}` trains on one GPU: {pinned.how}",
                explanation="With `devices=\"auto\"` (Lightning's default: every visible GPU) or `devices=-1`, "
                "Lightning "
                "launches one process per GPU and trains with DistributedDataParallel by itself; "
                f"`{pinned.key}=1` keeps the rest of the machine idle.",
                fix=Fix(FixClass.STRUCTURAL, "train on every visible GPU", available=False, reason=_lightning_reason(
                    owner, pinned)),
            )
        trainers = hf_trainer_calls(facts)
        hf_owners = [owner for owner in owners if owner.framework == "transformers"]
        if not trainers or any(owner.cpu_only(values) or _distributed_on_purpose(owner, values) for owner in hf_owners):
            return
        yield self.finding(
            facts,
            trainers[0].node.func,
            "the Hugging Face Trainer trains in one process unless launched with `torchrun`",
            explanation="Started with `python`, the Trainer runs one process: on one GPU, or on several through "
            "`nn.DataParallel` (one process driving every GPU, slower than DDP). Under `torchrun "
            "--nproc_per_node=N` (or `accelerate launch`) it reads the rank from the environment and trains with "
            "DistributedDataParallel, one process per GPU, with no change to the script.",
            fix=Fix(FixClass.STRUCTURAL, "launch with torchrun", available=False,
                    reason="how the script is launched is outside it: run `torchrun --nproc_per_node=N "
                    f"{facts.source.path.name}` (the Trainer sets up DDP from torchrun's environment); no code "
                    "changes"),
        )


# Options that say the user has chosen how to spread the work (a strategy, several nodes, DeepSpeed or FSDP).
_LIGHTNING_DISTRIBUTED = ("strategy", "num_nodes")
_HF_DISTRIBUTED = ("deepspeed", "fsdp", "fsdp_config", "parallelism_config", "ddp_backend",
                   "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "local_rank")


def _distributed_on_purpose(owner: LoopOwner, values: Values) -> bool:
    if owner.call.has_star_kwargs:
        return True  # ``**kwargs`` may hold the strategy
    keys = _LIGHTNING_DISTRIBUTED if owner.framework == "lightning" else _HF_DISTRIBUTED
    if owner.parsed_by is not None:
        return False  # the command line decides; the finding says how to launch
    return any(a.keyword is not None and a.keyword.value in keys for a in owner.node.args)


def _one_device(owner: LoopOwner, values: Values) -> Setting | None:
    """Lightning's ``devices`` (or the old ``gpus``) when every value it may hold names one device."""
    for key in ("devices", "gpus"):
        setting = owner.setting(values, key)
        if setting.source == "default":
            continue
        arg = setting.arg
        if arg is not None and isinstance(arg.value, (cst.List, cst.Tuple)):
            return setting if len(arg.value.elements) == 1 else None
        held = setting.values
        if held and all(v.value in (1, "1") for v in held):
            return setting
        return None
    return None


def _lightning_reason(owner: LoopOwner, pinned: Setting) -> str:
    change = ("it decides how many processes Lightning launches and the global batch (the per-device batch times the "
              "devices), so the learning rate may need scaling")
    if pinned.source in ("command line", "config"):
        flag = pinned.flag or f"--{pinned.key}"
        return (f"the value comes from the {pinned.source} ({pinned.how}): pass `{flag} -1` or set it in the config; "
                f"{change}")
    return f'set `devices="auto"` (or `-1`) with `strategy="ddp"` by hand: {change}'


class SingleProcessTrainingFix(Codemod):
    rule = "TC505"
    edits_plan_only = False  # the conversion finds the prints and saves to guard all over the module

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plan: ConvertToDdp = findings[0].fix.plan  # one finding per file: the first training loop
        return apply_conversion(module, context.facts, plan.layout)
