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
from tcaudit.project.loaders import by_site, loaders_built_elsewhere, training_uses
from tcaudit.rewrite.codemod import FixContext, ensure_import
from tcaudit.rewrite.ddp import convertible_loop
from tcaudit.rewrite.edits import add_torch_import
from tcaudit.rewrite.sampler import SAMPLER_IMPORT, SamplerEditor, SamplerEdits, plan_sampler
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import DistributedFacts, distributed_facts, in_test_code, is_dataloader
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_sharding import (
    SELF_SHARDING_LIBRARIES,
    plain_sampler,
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
    # Under ``fix --ddp`` a helper module's DataLoader gets its sampler only for scripts whose conversion
    # TC505 will make: a declined conversion leaves the project as it was.
    after = ("TC505",)
    triggers = (r"DistributedDataParallel|FullyShardedDataParallel|fully_shard",)
    # A module whose function builds the DataLoader a DDP script of the project trains with.
    helper_triggers = (r"DataLoader\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.is_ddp_script:
            yield from self._for_scripts(facts, context)
            return
        if facts.frameworks or info.iterable_dataset_defined:
            return
        if facts.imported_roots() & SELF_SHARDING_LIBRARIES:
            return
        yield from self._built_elsewhere(facts, context)
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
                    facts.code(dataset) if dataset is not None else None,
                    facts.code(shuffle) if shuffle is not None else None,
                    name,
                    facts.code(edits.sampler),
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

    def _built_elsewhere(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """A training DataLoader a helper of another module builds (``dataloader = create_loader(...)``):
        reported at the script's call, the DataLoader a mirrored related place; the fix belongs there."""
        for loader in loaders_built_elsewhere(facts, context.project(facts)):
            if not _unsharded(loader.pipeline.facts, loader.site):
                continue
            where = loader.pipeline.facts.source.display_path
            yield self.finding(
                facts,
                loader.call.node,
                f"the training DataLoader from `{loader.helper.name}` of this DDP job has no DistributedSampler",
                explanation=_EXPLANATION,
                fix=Fix(FixClass.SAFE, _DESCRIBED, available=False,
                        reason=f"the DataLoader is built in {loader.where} (`{loader.helper.name}`), another module: "
                        f"the fix belongs there (`tcaudit fix` of this script makes it in {where} where that is safe)"),
                related=[self.place(loader.pipeline.facts, loader.site.call.node,
                                    f"DataLoader (returned by `{loader.helper.name}`) feeds DDP training without a "
                                    "DistributedSampler", mirror=True)],
            )

    def _for_scripts(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """This module's function builds the DataLoader that a DDP script of the project trains with (or,
        under ``fix --ddp``, one the conversion makes a DDP script): reported here, fixed here, with the
        sampler guarded by ``torch.distributed.is_initialized()`` so other callers without a process group
        get the loader they always got."""
        ddp = "ddp" in context.settings.structural_fixes
        for site, uses in by_site(training_uses(facts, context.settings.root)):
            if not _unsharded(facts, site):
                continue
            jobs = [use for use in uses if distributed_facts(use.script).is_ddp_script
                    or (ddp and self._converted(use.script, context))]
            if not jobs:
                continue
            yield self.finding(
                facts,
                site.call.node,
                f"DataLoader (returned by `{jobs[0].helper}`) feeds DDP training without a DistributedSampler",
                explanation=_EXPLANATION,
                fix=self.planned_fix(FixClass.SAFE, _DESCRIBED_GUARDED,
                                     lambda site=site: self._guarded_plan(facts, site)),
                related=[self.place(use.script, use.call.node, f"{use.script.source.display_path} trains with it "
                                    "under DDP") for use in jobs[:8]],
            )

    @staticmethod
    def _converted(script: ScriptFacts, context: RuleContext) -> bool:
        """Whether ``fix --ddp`` converts ``script``: TC505 offers it a conversion it can make. (Where TC505
        is not among the rules run, this module is fixed as the companion of a script's conversion that
        ``fix`` has just made.)"""
        if convertible_loop(script) is None:
            return False
        return "TC505" not in context.settings.enabled_rules() or bool(context.fixable("TC505", script))

    @staticmethod
    def _guarded_plan(facts: ScriptFacts, site) -> AddSampler:
        call = site.call
        edits = plan_sampler(facts, call, guarded=True)
        return AddSampler(call.node, edits, facts.line_of(call.node), None, edits.shuffle_code, site.target,
                          edits.guarded[2] if edits.guarded else facts.code(edits.sampler), edits.import_sampler)

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
                if dataset is not None and SHARDED_TEXT.search(facts.code(dataset)):
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


def _unsharded(facts: ScriptFacts, site) -> bool:
    """A DataLoader with no sampler of its own (a plain RandomSampler aside) whose dataset is not sharded."""
    if not site.complete or site.values("batch_sampler"):
        return False
    if any(plain_sampler(facts, value) is None for value in site.values("sampler")):
        return False
    dataset = site.call.arg("dataset", 0)
    return dataset is None or not SHARDED_TEXT.search(facts.code(dataset))


_DESCRIBED = ("pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle= "
              "(shuffle with a sampler is a ValueError)")
_DESCRIBED_GUARDED = ("pass sampler=DistributedSampler(dataset, shuffle=...) while a process group is initialised, "
                      "and shuffle= only without one")


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
            editor.take(plan.call, plan.edits, module)
            needs_import |= plan.import_sampler
        new = module.visit(editor)
        if needs_import:
            new = ensure_import(new, SAMPLER_IMPORT)
        for statement in sorted({f.fix.plan.edits.dist_import for f in findings} - {None}):
            new = add_torch_import(new, statement)
        return new


