"""TC403 blocking-h2d-copy: a batch from a DataLoader copied to the GPU without ``non_blocking``.

Fix (safe): pass ``non_blocking=True`` to the ``.cuda()``/``.to()`` call. Declined when the call
passes ``*args``/``**kwargs`` (it may already pass ``non_blocking``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.batch_loops import BatchLoop, element_source
from tcaudit.script.callers import callers_of
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import literal, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, keyword
from tcaudit.source.triggers import all_of


class BlockingH2DCopy(ScriptRule):
    id = "TC403"
    fixed_with = ("TC402",)  # non_blocking copies only overlap from pinned memory
    triggers = (all_of(r"DataLoader", BACKWARD_CALL, CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.uses_cuda or pipeline.framework_owned or not facts.training_steps:
            return  # a framework's prepared loader moves batches itself
        reported: set[int] = set()
        for batch in pipeline.batch_loops:
            if not _plain_tensor_batches(pipeline, batch) or not pipeline.is_training_loop(batch):
                continue
            pinned = all(
                any(literal(v) is not False for v in site.values("pin_memory")) for site in batch.loaders
            )
            for call in facts.calls:
                if id(call.node) in reported or not _copies_batch(facts, call, batch, pipeline.batch_loops):
                    continue
                if facts.in_eval(call.ctx):
                    continue
                reported.add(id(call.node))
                hint = "" if pinned else " (with `pin_memory=True` on the DataLoader, or the copy stays synchronous)"
                yield self.finding(
                    facts,
                    call.node,
                    f"`{call.method}()` copies a batch to the GPU synchronously: pass `non_blocking=True`",
                    explanation="The host waits for the copy instead of queueing the forward pass; copy with "
                    f"`non_blocking=True`{hint}.",
                    fix=self.planned_fix(FixClass.SAFE, "pass non_blocking=True", lambda call=call: _plan(call)),
                )


def _plan(call: CallSite) -> AddKeyword:
    if any(arg.star for arg in call.node.args):
        raise DeclineFix("the call may already pass non_blocking=")
    return AddKeyword(call.node, "non_blocking", "True")


def _plain_tensor_batches(pipeline: PipelineFacts, batch: BatchLoop) -> bool:
    """Batches are default-collated tensors: no ``collate_fn`` (a custom one may return a
    NestedTensor or a BatchEncoding whose ``.to`` takes no ``non_blocking``), a known keyword set,
    a dataset not already on the GPU, and any iterable class of this file the loop may read instead
    building nothing but torch tensors."""
    for site in batch.loaders:
        if site.has("collate_fn") or not site.complete:
            return False
        if pipeline.dataset_kind(site) == "device":
            return False
    # ``SyntheticBatches(...) if args.synthetic else DataLoader(...)``
    if not all(pipeline.yields_plain_tensors(value) for value in batch.own_iterables):
        return False
    return bool(batch.loaders)


def _copies_batch(facts: ScriptFacts, call: CallSite, batch: BatchLoop, loops: list[BatchLoop]) -> bool:
    if call.method not in ("cuda", "to") or not moves_to_device(call):
        return False
    if keyword(call.node, "non_blocking") is not None:
        return False  # non_blocking=False written out is a choice
    if call.method == "to" and len([a for a in call.node.args if a.keyword is None]) > 1:
        return False  # .to(device, dtype, non_blocking) positional forms
    receiver = call.receiver
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    name = full_name(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
    if name is None:
        return False
    if name not in batch.names:
        return _copies_batch_elements(facts, call, name, batch, loops)
    return _in_loop(call, batch)


def _in_loop(call: CallSite, batch: BatchLoop) -> bool:
    loop = batch.loop
    if isinstance(loop, (cst.For, cst.While)):
        return call.ctx.inside(loop)
    return call.ctx.function is loop


def _copies_batch_elements(
    facts: ScriptFacts, call: CallSite, name: str, batch: BatchLoop, loops: list[BatchLoop]
) -> bool:
    """The copy moves the elements of a batch one by one: ``[t.to(device) for t in batch]``,
    ``{k: v.cuda() for k, v in batch.items()}``, ``map(lambda t: t.cuda(), (x, y))``, in the loop or in
    a helper of this file the loop hands the batch to (``batch = to_device(batch)``)."""
    statement = call.statement
    if statement is None:
        return False
    source = element_source(statement.node, call.node, name)
    if source is None:
        return False
    if _in_loop(call, batch):
        return _mentions_batch(source, batch.names)
    function = call.ctx.function
    if function is None or call.ctx.nearest("class") is not None:
        return False
    parameter = full_name(source) if isinstance(source, cst.Name) else None
    params = [p.name.value for p in function.params.params]
    if parameter not in params:
        return False
    index = params.index(parameter)
    callers = callers_of(facts, function, how="bare")
    # Every call of the helper hands it a batch of a loader loop (this one or another): then what it
    # copies is always a loader's batch, whose memory the loader does not reuse while it is referenced.
    return any(_in_loop(c, batch) for c in callers) and all(
        (argument := c.arg(parameter, index)) is not None
        and any(_in_loop(c, loop) and _mentions_batch(argument, loop.names) for loop in loops)
        for c in callers
    )


def _mentions_batch(expr: cst.BaseExpression, names: set[str]) -> bool:
    """``batch``, ``batch.items()``, ``batch.values()``, ``(x, y)``, ``batch[1:]`` of batch names."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        return bool(expr.elements) and all(_mentions_batch(e.value, names) for e in expr.elements)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args:
        if expr.func.attr.value in ("items", "values"):
            return _mentions_batch(expr.func.value, names)
        return False
    if isinstance(expr, cst.Subscript):
        return _mentions_batch(expr.value, names)
    return isinstance(expr, (cst.Name, cst.Attribute)) and full_name(expr) in names


# -- the fix ------------------------------------------------------------------------------------

class BlockingH2DCopyFix(Codemod):
    rule = "TC403"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
