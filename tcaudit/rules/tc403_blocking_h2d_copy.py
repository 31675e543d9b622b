"""TC403 blocking-h2d-copy: a batch from a DataLoader copied to the GPU without ``non_blocking``.

Fix (safe): pass ``non_blocking=True`` to the ``.cuda()``/``.to()`` call. Declined when the call
passes ``*args``/``**kwargs`` (it may already pass ``non_blocking``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.batch_loops import BatchLoop
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import literal, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
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
                if id(call.node) in reported or not _copies_batch(call, batch):
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


def _copies_batch(call: CallSite, batch: BatchLoop) -> bool:
    if call.method not in ("cuda", "to") or not moves_to_device(call):
        return False
    if any(arg.keyword is not None and arg.keyword.value == "non_blocking" for arg in call.node.args):
        return False  # non_blocking=False written out is a choice
    if call.method == "to" and len([a for a in call.node.args if a.keyword is None]) > 1:
        return False  # .to(device, dtype, non_blocking) positional forms
    receiver = call.receiver
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    name = get_full_name_for_node(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
    if name not in batch.names:
        return False
    loop = batch.loop
    if isinstance(loop, (cst.For, cst.While)):
        return call.ctx.inside(loop)
    return call.ctx.function is loop


# -- the fix ------------------------------------------------------------------------------------

class BlockingH2DCopyFix(Codemod):
    rule = "TC403"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
