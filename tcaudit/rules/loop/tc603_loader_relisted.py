"""TC603 loader-relisted: ``len(list(loader))`` / ``for batch in list(loader)`` runs the whole pipeline.

Fix (safe): ``len(list(loader))`` → ``len(loader)`` (declined when the file defines an
IterableDataset, or when nothing shows the name is a DataLoader: a generator has no ``len()``), and
``for b in list(loader)`` → ``for b in loader``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import CallEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import DistributedFacts, distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import full_name
from tcaudit.source.triggers import all_of

# ``loader``, ``trainloader``, ``self.val_dataloader``, ``train_dl``; not ``loaders`` (a collection).
_LOADER_NAME = re.compile(r"loader$|(^|_)dl$", re.IGNORECASE)
_WRAPPERS = ("iter", "enumerate", "tqdm", "tqdm.tqdm")


def _loader_inside(facts: ScriptFacts, info: DistributedFacts, expr: cst.BaseExpression) -> str | None:
    """The loader a ``list(...)`` argument iterates (through ``iter``/``enumerate``/``tqdm``)."""
    while isinstance(expr, cst.Call) and full_name(expr.func) in _WRAPPERS and expr.args:
        expr = expr.args[0].value
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return None
    dotted = full_name(expr)
    if not dotted:
        return None
    loader_ids = {id(c.node) for c in info.dataloaders}
    for value in facts.binding_values(expr):
        if id(value) in loader_ids:
            return dotted
    if _LOADER_NAME.search(dotted.split(".")[-1]):
        bound = [b.value for b in facts.bindings_of(dotted)]
        # A name bound to a list literal or comprehension is no loader, whatever it is called.
        if any(isinstance(v, (cst.List, cst.ListComp, cst.Tuple, cst.Dict)) for v in bound):
            return None
        return dotted
    return None


class LoaderRelisted(ScriptRule):
    id = "TC603"
    # Necessary: list( around a loader-like name, or list( in a file that builds a DataLoader. The
    # builtin is spelled in lower case; ``list`` comes first and its word boundary is checked behind
    # it, so the regex engine scans for the literal instead of trying every position.
    triggers = (r"list(?<!\wlist)\s*\([^)]*(?i:loader|dl)\b", all_of(r"DataLoader", r"list(?<!\wlist)\s*\("))

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        listing = {id(c.node): c for c in facts.calls if c.name == "list" and len(c.node.args) == 1}
        if not listing:
            return
        reported: set[int] = set()
        # len(list(loader)): counts batches by producing every one of them.
        for call in facts.calls:
            if call.name != "len" or len(call.node.args) != 1:
                continue
            inner = call.node.args[0].value
            if id(inner) not in listing or in_test_code(call.ctx):
                continue
            loader = _loader_inside(facts, info, inner.args[0].value)  # type: ignore[attr-defined]
            if loader is None:
                continue
            reported.add(id(inner))
            fix = self._len_fix(facts, info, call.node, loader)
            yield self.finding(
                facts,
                call.node,
                f"`len(list({loader}))` loads, decodes and collates every batch just to count them",
                explanation=f"`len({loader})` is free.",
                fix=fix,
            )
        # for batch in list(loader): materialises the epoch before the first step.
        for target_id, call in listing.items():
            statement = call.statement
            if target_id in reported or in_test_code(call.ctx) or statement is None or not isinstance(statement.node, cst.For):
                continue
            it = statement.node.iter
            if isinstance(it, cst.Call) and full_name(it.func) in ("enumerate", "tqdm", "tqdm.tqdm") and it.args:
                it = it.args[0].value
            if it is not call.node:
                continue
            loader = _loader_inside(facts, info, call.node.args[0].value)
            if loader is None:
                continue
            yield self.finding(
                facts,
                call.node,
                f"`list({loader})` loads every batch of the epoch into memory before the loop starts",
                explanation="It also stops the workers from overlapping loading with compute; iterate the loader "
                "directly.",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    f"iterate `{loader}` directly",
                    lambda call=call, loader=loader: ReplaceCall(
                        "unwrap-list", call.node, call.node.args[0].value, facts.line_of(call.node), loader
                    ),
                ),
            )

    def _len_fix(self, facts: ScriptFacts, info: DistributedFacts, node: cst.Call, loader: str) -> Fix:
        def plan() -> ReplaceCall:
            if info.iterable_dataset_defined:
                raise DeclineFix("the file defines an IterableDataset; a loader over it may have no len()")
            inner = node.args[0].value.args[0].value  # type: ignore[attr-defined]
            while isinstance(inner, cst.Call) and full_name(inner.func) in _WRAPPERS and inner.args:
                inner = inner.args[0].value
            loader_ids = {id(c.node) for c in info.dataloaders}
            # Every value the name may hold, on every path: ``DataLoader(...) if flag else stream()``
            # is a generator on one of them.
            values = [v for v in facts.binding_values(inner)
                      if not isinstance(v, (cst.IfExp, cst.BooleanOperation, cst.Name, cst.Attribute))]
            if not any(id(value) in loader_ids for value in values):
                raise DeclineFix(f"nothing in this file shows `{loader}` is a DataLoader; a generator has no len()")
            if not all(id(value) in loader_ids for value in values):
                raise DeclineFix(f"`{loader}` is a DataLoader on some paths only; a generator has no len()")
            return ReplaceCall("replace-expression", node.args[0].value, inner, facts.line_of(node), loader)

        return self.planned_fix(FixClass.SAFE, f"use len({loader})", plan)


@dataclass(frozen=True, eq=False)
class ReplaceCall(FixPlan):
    """``list(loader)`` (or ``list(enumerate(loader))`` under ``len``) becomes the expression inside."""

    kind: str  # ``replace-expression`` (the len) or ``unwrap-list`` (the loop)
    call: cst.Call  # the list(...) call
    replacement: cst.BaseExpression  # what it becomes
    line: int
    loader: str


class LoaderRelistedFix(Codemod):
    rule = "TC603"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: ReplaceCall = finding.fix.plan
            editor.rewrite_call(plan.call, lambda node, new=plan.replacement: new)
        return editor.apply(module)
