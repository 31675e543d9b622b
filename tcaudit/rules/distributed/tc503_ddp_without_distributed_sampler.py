"""TC503 ddp-without-distributed-sampler: a DDP script whose training DataLoader has no sampler.

Fix (safe): ``sampler=DistributedSampler(dataset, shuffle=<the loader's shuffle>)`` in place of the
loader's ``shuffle=`` (shuffle beside a sampler is a ValueError), importing DistributedSampler where
needed; a dataset built inside the DataLoader call is bound to a name on the line before. Declined
for a batch_sampler, a sampler already given, an IterableDataset, a loader built before
``init_process_group`` or ``shuffle=`` set where it cannot be moved safely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, ensure_import
from tcaudit.rewrite.sampler import SAMPLER_IMPORT, SamplerEditor, SamplerEdits, plan_sampler
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import DistributedFacts, code, distributed_facts, in_test_code, is_dataloader
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_sharding import (
    SELF_SHARDING_LIBRARIES,
    SHARDED_TEXT,
    dataset_expr,
    step_loop_sources,
    unsharded_training_loaders,
)


@dataclass(frozen=True, eq=False)
class AddSampler(FixPlan):
    kind = "add-distributed-sampler"
    call: cst.Call  # the DataLoader(...) call
    edits: SamplerEdits
    line: int
    dataset: str | None
    shuffle: str | None  # the loader's shuffle= as written, None when it has none
    loader: str | None
    sampler: str  # the sampler expression written
    import_sampler: bool


class DdpWithoutDistributedSampler(ScriptRule):
    id = "TC503"
    triggers = (r"DistributedDataParallel|FullyShardedDataParallel|fully_shard",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.is_ddp_script or facts.frameworks or info.iterable_dataset_defined:
            return
        if facts.imported_roots() & SELF_SHARDING_LIBRARIES:
            return
        for loader in unsharded_training_loaders(facts, info):
            if loader.unseen is not None:
                continue  # a **kwargs dict we cannot see may hold a sampler
            call, name = loader.call, loader.name
            dataset = dataset_expr(call)
            shuffle = call.arg("shuffle", 2)

            def plan(call=call, name=name, dataset=dataset, shuffle=shuffle) -> AddSampler:
                edits = plan_sampler(facts, call)
                return AddSampler(
                    call.node,
                    edits,
                    facts.line_of(call.node),
                    code(facts, dataset) if dataset is not None else None,
                    code(facts, shuffle) if shuffle is not None else None,
                    name,
                    code(facts, edits.sampler),
                    edits.import_sampler,
                )

            yield self.finding(
                facts,
                call.node,
                _message(name),
                explanation=_EXPLANATION,
                fix=self.planned_fix(
                    FixClass.SAFE,
                    "pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle= "
                    "(shuffle with a sampler is a ValueError)",
                    plan,
                ),
            )
        yield from self._partial_loaders(facts, info)

    def _partial_loaders(self, facts: ScriptFacts, info: DistributedFacts) -> Iterator[Finding]:
        """``make = functools.partial(DataLoader, batch_size=64, shuffle=True)``; ``loader = make(train_set)``
        iterated by the training loop: reported at the call that builds the loader, fix declined."""
        sources = None
        for partial in facts.calls:
            if not (partial.qualname or "").endswith("functools.partial") or not partial.node.args:
                continue
            inner = partial.node.args[0].value
            if not is_dataloader(facts.qualname(inner)) or in_test_code(partial.ctx):
                continue
            if any(a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler") for a in partial.node.args):
                continue
            names = [b.target for b in facts.bindings if b.value is partial.node]
            if sources is None:
                sources = {id(v) for v in step_loop_sources(facts, info)}
            for made in facts.calls:
                if made.name not in names or id(made.node) not in sources:
                    continue
                if any(a.star or (a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler")) for a in made.node.args):
                    continue
                dataset = made.arg("dataset", 0)
                if dataset is not None and SHARDED_TEXT.search(code(facts, dataset)):
                    continue
                yield self.finding(
                    facts,
                    made.node,
                    _message(info.target_of(made.node)),
                    explanation=_EXPLANATION,
                    fix=Fix(
                        FixClass.SAFE,
                        "pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle=",
                        available=False,
                        reason=f"the DataLoader is built through `functools.partial` (`{made.name}`); its "
                        "shuffle= and the sampler must be changed where the partial is made, by hand",
                    ),
                )


def _message(name: str | None) -> str:
    return f"the training DataLoader{f' `{name}`' if name else ''} of this DDP job has no DistributedSampler"


_EXPLANATION = "Every rank iterates the whole dataset, so N GPUs do the work of one."


# -- the plan for one DataLoader ---------------------------------------------------------------------------

class DdpDistributedSamplerFix(Codemod):
    rule = "TC503"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = SamplerEditor()
        needs_import = False
        for finding in findings:
            plan: AddSampler = finding.fix.plan
            editor.take(plan.call, plan.edits)
            needs_import |= plan.import_sampler
        new = module.visit(editor)
        if needs_import:
            new = ensure_import(new, SAMPLER_IMPORT)
        return new


