"""TC404 workers-not-persistent: DataLoader workers re-spawned every epoch.

Also reported, with its fix, on a DataLoader without workers that TC401's fix gives workers in the
same run (so ``scan`` shows what ``fix`` will do). Fix (numerics): pass ``persistent_workers=True``
(``persistent_workers=<expr> > 0`` when the worker count is a flag that may be 0); declined when
``num_workers`` may be 0 on some path, which would make ``persistent_workers=True`` a ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.catalog import matches_selector
from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits, plan_loader_keyword
from tcaudit.rewrite.workers import plan_workers
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.pipeline.loader_workers import loaders_without_workers
from tcaudit.script.evidence import ACCELERATOR_OR_CUDA, TRAINS
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.triggers import all_of

MESSAGE = "DataLoader's worker processes start again every epoch: pass `persistent_workers=True`"
EXPLANATION = (
    "Each restart re-imports the script's modules, re-pickles the dataset and refills the prefetch queue; "
    "persistent workers are kept across epochs."
)


@dataclass(frozen=True, eq=False)
class AddAfterWorkers(FixPlan):
    """``persistent_workers=True`` on a DataLoader that TC401's fix gives workers first. The fix engine
    runs TC401's fix before this one and re-analyses the file in between, so this rule's fix then
    sees the workers and gets a plain :class:`AddKeyword`; this plan reaches the fix only when TC401's
    fix did not run, and is then declined (``persistent_workers=True`` alone would be a ValueError)."""

    kind = "add-kwarg"
    call: cst.Call
    key: str
    value: str
    after: str = "TC401"  # the fix that must run first


class WorkersNotPersistent(ScriptRule):
    id = "TC404"
    fixed_with = ("TC401",)  # persistent workers need workers
    after = ("TC401",)  # persistent workers need the workers TC401's fix adds: fixed after it
    triggers = (all_of(r"DataLoader", ACCELERATOR_OR_CUDA, TRAINS),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not (facts.uses_accelerator or pipeline.uses_cuda):
            return
        gaining_workers = {id(site.call.node) for site in _gaining_workers(pipeline, context)}
        for site in pipeline.training_loaders:
            workers = site.keys.get("num_workers", [])
            companion = id(site.call.node) in gaining_workers
            if not companion and (not workers or all(literal(kv.value) == 0 for kv in workers)):
                continue
            if site.has("persistent_workers") or not site.complete:
                continue
            if not pipeline.reiterated(site):
                continue  # one pass (or iterated where this file cannot see): nothing to keep alive
            if pipeline.repeats(site.call.ctx):
                continue  # a new DataLoader each epoch: persistent workers would not outlive it
            if companion:
                yield self.finding(
                    facts,
                    site.call.node,
                    "with workers (TC401), also pass `persistent_workers=True`",
                    explanation="The worker processes TC401's fix gives this DataLoader would otherwise start "
                    "again every epoch (re-importing the script's modules, re-pickling the dataset, refilling the "
                    "prefetch queue).",
                    fix=Fix(
                        FixClass.NUMERICS, "with workers (TC401), also pass persistent_workers=True",
                        plan=AddAfterWorkers(site.call.node, "persistent_workers", "True"),
                    ),
                )
                continue
            value = _persistent_value(site)
            yield self.finding(facts, site.call.node, MESSAGE, explanation=EXPLANATION, fix=self.planned_fix(
                FixClass.NUMERICS, f"pass persistent_workers={value or 'True'}", lambda site=site, value=value: _plan(site, value),
            ))


def _gaining_workers(pipeline: PipelineFacts, context: RuleContext) -> list[LoaderSite]:
    """The DataLoaders that TC401 reports with a fix it can make, when TC401 runs on this file."""
    settings = context.settings
    if settings is not None and (
        "TC401" not in settings.enabled_rules()
        or any(matches_selector("TC401", s) for s in settings.ignored_for(pipeline.facts.source.display_path))
    ):
        return []
    out = []
    for site in loaders_without_workers(pipeline):
        try:
            plan_workers(pipeline, site)
        except DeclineFix:
            continue
        out.append(site)
    return out


def _persistent_value(site: LoaderSite) -> str | None:
    """``True`` when the worker count is at least 1 on every path; ``<flag> > 0`` for
    ``num_workers=args.workers`` (which may be 0: persistent_workers=True with 0 workers is a
    ValueError); None when it may be 0 on some path this file shows."""
    workers = site.keys["num_workers"]
    if all(_positive(kv.value) for kv in workers) and not any(kv.conditional for kv in workers):
        return "True"
    if len(workers) == 1 and workers[0].source == "keyword" and literal(workers[0].value) is ...:
        return f"{cst.Module([]).code_for_node(workers[0].value)} > 0"
    return None


def _plan(site: LoaderSite, value: str | None) -> AddKeyword:
    if value is None:
        raise DeclineFix(
            "num_workers may be 0 on some paths (it is set conditionally or in a kwargs dict), and "
            "persistent_workers=True with num_workers=0 raises ValueError"
        )
    return plan_loader_keyword(site, "persistent_workers", value)


def _positive(expr: cst.BaseExpression) -> bool:
    """A worker count that is at least 1 on every path: a positive literal, ``min`` of such,
    ``max`` with one, ``x or 4`` (TC401's ``min(16, os.cpu_count() or 1)``)."""
    value = literal(expr)
    if isinstance(value, int) and not isinstance(value, bool):
        return value > 0
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
        return _positive(expr.right)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.args:
        args = [a.value for a in expr.args if a.keyword is None and not a.star]
        if len(args) != len(expr.args):
            return False
        if expr.func.value == "min":
            return all(_positive(a) for a in args)
        if expr.func.value == "max":
            return any(_positive(a) for a in args)
    return False


# -- the fix ------------------------------------------------------------------------------------


class WorkersNotPersistentFix(Codemod):
    rule = "TC404"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans = [finding.fix.plan for finding in findings]
        ready = [plan for plan in plans if not isinstance(plan, AddAfterWorkers)]
        if not ready:
            raise DeclineFix(
                "TC401's fix did not give this DataLoader workers, and persistent_workers=True without "
                "workers raises ValueError"
            )
        return apply_keyword_edits(module, ready)
