"""TC404 workers-not-persistent: DataLoader workers re-spawned every epoch."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import all_of, ACCELERATOR_TEXT, LoaderSite, literal, pipeline_facts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod
from tcaudit.rewrite.edits import loader_keyword_fix


class WorkersNotPersistent(ScriptRule):
    id = "TC404"
    triggers = (all_of(r"DataLoader", ACCELERATOR_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not (facts.uses_accelerator or pipeline.uses_cuda):
            return
        for site in pipeline.training_loaders:
            workers = site.keys.get("num_workers", [])
            if not workers or all(literal(kv.value) == 0 for kv in workers):
                continue
            if site.has("persistent_workers") or not site.complete:
                continue
            if not pipeline.reiterated(site):
                continue  # one pass (or iterated where this file cannot see): nothing to keep alive
            if pipeline.repeats(site.call.ctx):
                continue  # a new DataLoader each epoch: persistent workers would not outlive it
            yield self.finding(
                facts,
                site.call.node,
                "this DataLoader's worker processes are started again at every epoch (each re-imports "
                "the script's modules, re-pickles the dataset and refills its prefetch queue); pass "
                "`persistent_workers=True` to keep them",
                fix=_fix(site),
            )


def _fix(site: LoaderSite) -> Fix:
    workers = site.keys["num_workers"]
    description = "pass persistent_workers=True"
    values = [literal(kv.value) for kv in workers]
    if all(_positive(kv.value) for kv in workers) and not any(kv.conditional for kv in workers):
        return Fix(FixClass.NUMERICS, description, anchor={"kind": "add-kwarg", "key": "persistent_workers", "value": "True"})
    if len(workers) == 1 and workers[0].source == "keyword" and values[0] is ...:
        # num_workers=args.workers may be 0, and persistent_workers=True with 0 workers is a ValueError.
        expr = cst.Module([]).code_for_node(workers[0].value)
        return Fix(
            FixClass.NUMERICS, f"pass persistent_workers={expr} > 0",
            anchor={"kind": "add-kwarg", "key": "persistent_workers", "value": f"{expr} > 0"},
        )
    return Fix(
        FixClass.NUMERICS, description, available=False,
        reason="num_workers may be 0 on some paths (it is set conditionally or in a kwargs dict), and "
               "persistent_workers=True with num_workers=0 raises ValueError",
    )


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
        return loader_keyword_fix(module, context.facts, findings)
