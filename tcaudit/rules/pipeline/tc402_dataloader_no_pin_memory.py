"""TC402 dataloader-no-pin-memory: a CUDA training DataLoader that returns pageable host memory.

Fix (numerics, by the fix classes' convention for loader settings): pass ``pin_memory=True``, or
replace a written ``pin_memory=False``. Declined when the key comes from a ``**kwargs`` dict.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.project.loaders import by_site, loaders_built_elsewhere, training_uses
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import apply_keyword_edits, plan_loader_keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.pipeline.helper_loaders import fix_in_helper
from tcaudit.script.evidence import CUDA_EVIDENCE, TRAINS
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_sharding import feeds_only_other_loops
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.triggers import all_of


class DataLoaderNoPinMemory(ScriptRule):
    id = "TC402"
    # No "DataLoader" in the text is needed: a helper of another module may build it (get_data(args)).
    triggers = (all_of(CUDA_EVIDENCE, TRAINS),)
    # A module whose DataLoader a training script of the project gets from one of its functions.
    helper_triggers = (r"DataLoader\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        for site in pipeline.training_loaders if pipeline.uses_cuda else ():
            if site.has("pin_memory"):
                if not all(literal(v) is False for v in site.values("pin_memory")):
                    continue  # pinned on some path, or a flag the user controls
            elif not site.complete:
                continue
            if pipeline.dataset_kind(site) == "device":
                continue  # CUDA tensors cannot be pinned
            if feeds_only_other_loops(facts, site.call):
                continue  # its batches only reach evaluation
            yield self.finding(
                facts,
                site.call.node,
                "DataLoader feeds CUDA training from pageable memory: pass `pin_memory=True`",
                explanation="Every host-to-device copy from pageable memory is staged through a bounce buffer "
                "and cannot overlap compute; pin the batches (and copy them with `non_blocking=True`).",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "set pin_memory=True",
                    lambda site=site: plan_loader_keyword(site, "pin_memory", "True"),
                ),
            )
        values = context.values(facts)
        for loader in loaders_built_elsewhere(facts, context.project(facts)):
            site = loader.site
            if not _pageable(values, loader.pipeline.facts, site) or loader.pipeline.dataset_kind(site) == "device":
                continue
            yield self.finding(
                facts,
                loader.call.node,
                f"DataLoader from `{loader.helper.name}` feeds CUDA training from pageable memory: pass `pin_memory=True`",
                explanation="Every host-to-device copy from pageable memory is staged through a bounce buffer "
                "and cannot overlap compute; pin the batches (and copy them with `non_blocking=True`).",
                fix=fix_in_helper(loader, FixClass.NUMERICS, "set pin_memory=True"),
                related=[self.place(loader.pipeline.facts, site.call.node,
                                    f"DataLoader (returned by `{loader.helper.name}`) feeds CUDA training from pageable "
                                    "memory: pass `pin_memory=True`", mirror=True)],
            )

        for site, uses in by_site(training_uses(facts, context.settings.root)):
            if not _pageable(values, facts, site) or pipeline.dataset_kind(site) == "device":
                continue
            yield self.finding(
                facts,
                site.call.node,
                f"DataLoader (returned by `{uses[0].helper}`) feeds CUDA training from pageable memory: pass `pin_memory=True`",
                explanation="Every host-to-device copy from pageable memory is staged through a bounce buffer "
                "and cannot overlap compute; pin the batches (and copy them with `non_blocking=True`).",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "set pin_memory=True", lambda site=site: plan_loader_keyword(site, "pin_memory", "True"),
                ),
                related=[self.place(use.script, use.call.node, f"{use.script.source.display_path} trains with it on CUDA")
                         for use in uses[:8]],
            )


def _pageable(values, facts: ScriptFacts, site) -> bool:
    """No ``pin_memory``, or one that is False wherever it is set."""
    if not site.has("pin_memory"):
        return site.complete
    held = [values.of(facts, v, site.call.ctx.function) for v in site.values("pin_memory")]
    return all(h is not None and all(v.value is False for v in h) for h in held)


# -- the fix ------------------------------------------------------------------------------------


class DataLoaderNoPinMemoryFix(Codemod):
    rule = "TC402"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
