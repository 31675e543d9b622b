"""TC401 dataloader-no-workers: a training DataLoader that loads in the main process.

Fix (numerics: the order of random augmentations changes): pass ``num_workers=min(16, os.cpu_count()
or 1)`` (replacing a written ``num_workers=0``), importing ``os`` when the file does not. Declined
when the key comes from a ``**kwargs`` dict, when the script has no ``__main__`` guard (worker
processes started with spawn would re-run it), or when the dataset draws from its own generator and
no ``worker_init_fn`` reseeds it (every worker would repeat the same draws: TC410,
:mod:`tcaudit.script.dataset_rng`; the decline is made in :func:`tcaudit.rewrite.workers.plan_workers`).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, Severity
from tcaudit.project.frameworks import LoopOwner, Setting, hf_trainer_calls, loop_owners, owners_reached
from tcaudit.project.loaders import by_site, dataset_built_there, loaders_built_elsewhere, training_uses, zero_workers
from tcaudit.project.values import Value
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, KeywordPlan, ReplaceArgument, add_stdlib_import, apply_keyword_edits
from tcaudit.rewrite.workers import WORKERS, imports_os, os_local_name, plan_workers
from tcaudit.rules.advice import set_where_built
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.pipeline.helper_loaders import fix_in_helper
from tcaudit.rules.pipeline.loader_workers import loaders_with_named_zero, loaders_without_workers
from tcaudit.script.evidence import ACCELERATOR_OR_CUDA, TRAINS
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.triggers import all_of


class DataLoaderNoWorkers(ScriptRule):
    id = "TC401"
    # No "DataLoader" in the text is needed: a helper of another module may build it (get_data(args)).
    # Or Hugging Face training arguments, which build the DataLoader for the Trainer.
    triggers = (all_of(ACCELERATOR_OR_CUDA, TRAINS), r"TrainingArguments|SFTConfig|HfArgumentParser")
    # A module whose DataLoader a training script of the project gets from one of its functions.
    helper_triggers = (r"DataLoader\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        cost = context.cost(self.spec, "workers")
        explanation = ("The GPU waits for each batch to be loaded and augmented; use worker processes: "
                       f"`num_workers={WORKERS}`{cost}.")
        for site in loaders_without_workers(pipeline):
            yield self.finding(
                facts,
                site.call.node,
                "training DataLoader loads every batch in the main process (num_workers=0)",
                explanation=explanation,
                fix=self.planned_fix(
                    FixClass.NUMERICS, f"set num_workers={WORKERS}", lambda site=site: plan_workers(pipeline, site)
                ),
            )
        values = context.values(facts)
        for site, value in loaders_with_named_zero(pipeline, values):
            yield self.finding(
                facts,
                site.call.node,
                f"training DataLoader loads every batch in the main process: {value.how}",
                explanation=explanation,
                fix=_set_at_source(value),
                related=[self.line_place(value.where, f"where `num_workers` gets 0: {value.how}")] if value.where else (),
            )
        for loader in loaders_built_elsewhere(facts, context.project(facts)):
            zero = zero_workers(values, loader.pipeline.facts, loader.site)
            if zero is None or not dataset_built_there(loader.site, loader.pipeline):
                continue
            why = f": {zero.how}" if zero.how else " (num_workers=0)"
            yield self.finding(
                facts,
                loader.call.node,
                f"training DataLoader from `{loader.helper.name}` loads every batch in the main process{why}",
                explanation=explanation,
                fix=fix_in_helper(loader, FixClass.NUMERICS, f"set num_workers={WORKERS}"),
                related=[self.place(loader.pipeline.facts, loader.site.call.node,
                                    f"training DataLoader (returned by `{loader.helper.name}`) loads every batch in the "
                                    f"main process{why}", mirror=True)],
            )

        yield from self._for_scripts(facts, context, pipeline, values, explanation)
        yield from self._for_hf_trainers(facts, pipeline, values)
        yield from self._for_hf_arguments_elsewhere(facts, context, values)

    def _for_hf_trainers(self, facts: ScriptFacts, pipeline, values) -> Iterator[Finding]:
        """Hugging Face training arguments that leave ``dataloader_num_workers`` at 0: the Trainer builds
        its DataLoader from them. Info: how much workers gain depends on each sample's loading work, which
        the dataset (tokenized ahead or decoded per sample) decides."""
        for owner in loop_owners(facts):
            setting = _no_workers(owner, values)
            if setting is None:
                continue
            yield self.finding(
                facts,
                owner.node.func,
                f"`{owner.label}`: the Trainer loads each batch in the main process; {_zero_how(setting)}",
                severity=Severity.INFO,
                explanation="The Trainer's DataLoader reads, collates and pads each batch while the GPU waits; "
                f"worker processes do it ahead: `dataloader_num_workers={WORKERS}`.",
                fix=self.planned_fix(FixClass.NUMERICS, f"set dataloader_num_workers={WORKERS}",
                                     lambda owner=owner, setting=setting: _plan_hf_workers(pipeline, owner, setting)),
            )

    def _for_hf_arguments_elsewhere(self, facts: ScriptFacts, context: RuleContext, values) -> Iterator[Finding]:
        """A Hugging Face Trainer of this file whose training arguments another module builds
        (``Trainer(args=make_args())``, ``make_args`` in config.py) with ``dataloader_num_workers`` at 0:
        reported at the trainer, the fix declined to where the arguments are built."""
        for trainer, owner in owners_reached(facts, context.project(facts)):
            setting = _no_workers(owner, values)
            if setting is None:
                continue
            where = owner.where
            option = f"dataloader_num_workers={WORKERS}"
            yield self.finding(
                facts,
                trainer.node.func,
                f"this Trainer loads each batch in the main process: {_zero_how(setting)} where its arguments are built",
                severity=Severity.INFO,
                explanation="The Trainer's DataLoader reads, collates and pads each batch while the GPU waits; "
                f"worker processes do it ahead: set `{option}` where the arguments are built.",
                fix=self.planned_fix(FixClass.NUMERICS, f"set {option}",
                                     lambda where=where, option=option: set_where_built(where, option)),
                related=[self.place(owner.facts, owner.node.func, f"the {owner.label} this trainer gets: no workers")],
            )

    def _for_scripts(self, facts: ScriptFacts, context: RuleContext, pipeline, values, explanation: str) -> Iterator[Finding]:
        """This module trains nothing, but scripts of the project train on CUDA with a DataLoader one of
        its functions builds (``utils.get_data``): reported and fixed here, where the DataLoader is."""
        for site, uses in by_site(training_uses(facts, context.settings.root)):
            zero = zero_workers(values, facts, site)
            if zero is None or not dataset_built_there(site, pipeline):
                continue
            why = f": {zero.how}" if zero.how else " (num_workers=0)"
            helper = uses[0].helper
            unguarded = tuple(sorted({use.script.source.display_path for use in uses if not use.guarded}))
            if zero.how:
                fix = _set_at_source(zero)
            else:
                fix = self.planned_fix(FixClass.NUMERICS, f"set num_workers={WORKERS}",
                                       lambda site=site, unguarded=unguarded: plan_workers(pipeline, site, unguarded))
            yield self.finding(
                facts,
                site.call.node,
                f"training DataLoader (returned by `{helper}`) loads every batch in the main process{why}",
                explanation=explanation,
                fix=fix,
                related=[self.place(use.script, use.call.node, f"{use.script.source.display_path} trains with it")
                         for use in uses[:8]],
            )


def _no_workers(owner: LoopOwner, values) -> Setting | None:
    """The ``dataloader_num_workers`` of Hugging Face training arguments, where every value it may hold is 0
    and the arguments are not visibly on the CPU; None otherwise."""
    if owner.framework != "transformers" or owner.cpu_only(values):
        return None
    setting = owner.setting(values, "dataloader_num_workers")
    if not setting.values or any(v.value != 0 for v in setting.values):
        return None
    return setting


def _zero_how(setting: Setting) -> str:
    if setting.source == "default":
        return "`dataloader_num_workers` defaults to 0"
    if setting.source == "command line" and setting.arg is None:
        return f"`{setting.flag}` defaults to 0"
    return setting.how


def _plan_hf_workers(pipeline, owner: LoopOwner, setting: Setting) -> KeywordPlan:
    if owner.parsed_by is not None:
        raise DeclineFix(f"the training arguments come from the command line (`{owner.parsed_by}`): pass "
                         "`--dataloader_num_workers 8` (or the machine's core count)")
    if setting.source == "command line":
        raise DeclineFix(f"the value comes from the command line ({setting.how}): pass a worker count there")
    if setting.arg is not None and literal(setting.arg.value) is ...:
        raise DeclineFix(f"`dataloader_num_workers` is set where its value comes from ({setting.how}): change it "
                         "there by hand")
    if owner.call.has_star_kwargs:
        raise DeclineFix("the call passes `**kwargs`, which may hold dataloader_num_workers; a second one would be "
                         "a TypeError")
    if not hf_trainer_calls(owner.facts):
        raise DeclineFix("the Trainer that gets these arguments is built in another module, and whether it runs under "
                         "an `if __name__ == \"__main__\":` guard (which worker processes started with spawn need) is "
                         "not followed: set `dataloader_num_workers` here by hand")
    guard = pipeline.main_guard
    unguarded = [t for t in hf_trainer_calls(owner.facts) if t.ctx.function is None and (guard is None or
                                                                                          not t.ctx.inside(guard))]
    if unguarded:
        raise DeclineFix("the Trainer is built outside an `if __name__ == \"__main__\":` guard: worker processes "
                         "started with spawn/forkserver would re-run the whole script")
    os_name = os_local_name(owner.facts)
    value = WORKERS.replace("os.", f"{os_name}.")
    imports = ("os",) if os_name == "os" and not imports_os(owner.facts) else ()
    if setting.arg is not None:
        return ReplaceArgument(owner.node, setting.arg, "dataloader_num_workers", value, imports)
    return AddKeyword(owner.node, "dataloader_num_workers", value, imports)


def _set_at_source(value: Value) -> Fix:
    """The declined fix of a worker count that is 0 through a name: it is changed where the value is set."""
    return Fix(
        FixClass.NUMERICS, f"set num_workers={WORKERS}", available=False,
        reason=f"the worker count is set where the value comes from ({value.said}): "
        + ("pass the flag, or raise its default there, by hand" if value.on_command_line
           else f"set it to `{WORKERS}` there, by hand"),
    )


# -- the fix ------------------------------------------------------------------------------------


class DataLoaderNoWorkersFix(Codemod):
    rule = "TC401"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[KeywordPlan] = [finding.fix.plan for finding in findings]
        new = apply_keyword_edits(module, plans)
        if any("os" in plan.imports for plan in plans):
            new = add_stdlib_import(new, "os")
        return new
