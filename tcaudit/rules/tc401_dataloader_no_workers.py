"""TC401 dataloader-no-workers: a training DataLoader that loads in the main process.

Fix (numerics: the order of random augmentations changes): pass ``num_workers=min(16, os.cpu_count()
or 1)`` (replacing a written ``num_workers=0``), importing ``os`` when the file does not. Declined
when the key comes from a ``**kwargs`` dict, or when the script has no ``__main__`` guard (worker
processes started with spawn would re-run it).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rewrite.edits import (
    KeywordPlan,
    add_stdlib_import,
    apply_keyword_edits,
    decline_key_in_dict,
    plan_loader_keyword,
)
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.costs import cost_note
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import ACCELERATOR_TEXT, LoaderSite, PipelineFacts, all_of, literal, pipeline_facts

WORKERS = "min(16, os.cpu_count() or 1)"


class DataLoaderNoWorkers(ScriptRule):
    id = "TC401"
    triggers = (all_of(r"DataLoader", ACCELERATOR_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        cost = cost_note(self.spec, context.settings.gpu, "workers")
        for site in loaders_without_workers(pipeline):
            yield self.finding(
                facts,
                site.call.node,
                "this training DataLoader loads and augments every batch in the main process "
                "(num_workers=0), so the GPU waits for it each step; use worker processes: "
                f"`num_workers={WORKERS}`{cost}",
                fix=self.planned_fix(
                    FixClass.NUMERICS, f"set num_workers={WORKERS}", lambda site=site: plan_workers(pipeline, site)
                ),
            )


def loaders_without_workers(pipeline: PipelineFacts) -> list[LoaderSite]:
    """The training DataLoaders this rule reports: no worker processes, on a dataset that gains from them."""
    facts = pipeline.facts
    if not (facts.uses_accelerator or pipeline.uses_cuda):
        return []
    out = []
    for site in pipeline.training_loaders:
        if site.has("num_workers"):
            if not all(literal(v) == 0 for v in site.values("num_workers")):
                continue  # workers, or a value the user controls (num_workers=args.workers)
        elif not site.complete:
            continue  # an untraceable **kwargs may set it
        if pipeline.dataset_kind(site) != "other":
            # Tensors already on the GPU cannot go through workers; an in-memory TensorDataset
            # gains nothing from them; an IterableDataset that does not shard by worker would
            # yield every sample once per worker.
            continue
        out.append(site)
    return out


def plan_workers(pipeline: PipelineFacts, site: LoaderSite) -> KeywordPlan:
    """The edit that gives this DataLoader workers; DeclineFix when it cannot be made safely."""
    facts = pipeline.facts
    decline_key_in_dict(site, "num_workers")
    ctx = site.call.ctx
    guard = pipeline.main_guard
    if guard is None or (ctx.function is None and not ctx.inside(guard)):
        raise DeclineFix(
            "the script has no `if __name__ == \"__main__\":` guard around its training code: worker "
            "processes started with spawn/forkserver (Windows, macOS, Linux from Python 3.14) would "
            "re-run the whole script"
        )
    os_name = _os_name(facts)
    value = WORKERS.replace("os.", f"{os_name}.")
    imports = ("os",) if os_name == "os" and not _imports_os(facts) else ()
    return plan_loader_keyword(site, "num_workers", value, imports)


def _os_name(facts: ScriptFacts) -> str:
    for site in facts.imports:
        if site.qualname == "os" and site.ctx is facts.module_frame:
            return site.local
    if facts.bindings_of("os"):
        raise DeclineFix("the name `os` is bound to something else in this file")
    return "os"


def _imports_os(facts: ScriptFacts) -> bool:
    return any(site.qualname == "os" and site.local == "os" and site.ctx is facts.module_frame for site in facts.imports)


# -- the fix ------------------------------------------------------------------------------------


class DataLoaderNoWorkersFix(Codemod):
    rule = "TC401"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[KeywordPlan] = [finding.fix.plan for finding in findings]
        new = apply_keyword_edits(module, plans)
        if any("os" in plan.imports for plan in plans):
            new = add_stdlib_import(new, "os")
        return new
