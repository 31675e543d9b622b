"""TC504 sampler-without-set-epoch: a shuffling DistributedSampler over several epochs, never reseeded."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import (
    EVAL_NAME,
    DistributedFacts,
    distributed_facts,
    in_test_code,
    innermost_loop,
    is_distributed_sampler,
    callee_type,
    literal_value,
    loops_of,
)
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

_EPOCH = re.compile(r"epoch", re.IGNORECASE)


def _single_pass(loop: cst.For) -> bool:
    """``for epoch in range(1)``: one epoch, nothing to reseed."""
    it = loop.iter
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "range":
        args = [a.value for a in it.args]
        if len(args) == 1 and literal_value(args[0]) in (0, 1):
            return True
    return False


def epoch_loop(facts: ScriptFacts, info: DistributedFacts) -> Frame | None:
    """A loop that repeats the training loop: a ``for epoch in ...`` loop, or a loop around a step loop."""
    candidates: list[Frame] = []
    for loop in info.step_loops.values():
        candidates += loops_of(loop.parent)[:1] if loop.parent is not None else []
    for frame in candidates:
        node = frame.node
        if info.is_step_loop(frame) or (isinstance(node, cst.For) and _single_pass(node)):
            continue  # a loop around gradient-accumulation micro-steps is not an epoch loop
        return frame
    for call in info.step_calls:
        for ctx in info.call_contexts(call.ctx, depth=3):
            for frame in loops_of(ctx):
                node = frame.node
                if isinstance(node, cst.For) and _EPOCH.search(facts.module.code_for_node(node.target)):
                    if not _single_pass(node):
                        return frame
    # ``for epoch in range(E): train(model, loader)`` where train() holds the step loop.
    for call in facts.calls:
        loop = innermost_loop(call.ctx)
        if loop is None or not isinstance(loop.node, cst.For) or _single_pass(loop.node):
            continue
        if _EPOCH.search(facts.module.code_for_node(loop.node.target)) and call.name and not facts.in_eval(call.ctx):
            short = call.name.removeprefix("self.")
            if any(fn for fn in facts.functions_by_name.get(short, []) if _holds_step_loop(info, fn)):
                return loop
    return None


def while_counter(loop: cst.CSTNode) -> str | None:
    """The epoch counter of a ``while`` epoch loop: a name its body (not a nested block) steps with
    ``n += 1``; one whose name says epoch when there are several."""
    if not isinstance(loop, cst.While) or not isinstance(loop.body, cst.IndentedBlock):
        return None
    counters = []
    for statement in loop.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.AugAssign)
                and isinstance(small.operator, cst.AddAssign)
                and isinstance(small.target, cst.Name)
                and literal_value(small.value) == 1
            ):
                counters.append(small.target.value)
    named = [c for c in counters if _EPOCH.search(c)]
    if len(named) == 1:
        return named[0]
    return counters[0] if len(counters) == 1 else None


def _holds_step_loop(info: DistributedFacts, fn: cst.FunctionDef) -> bool:
    return any(frame.function is fn for frame in info.step_loops.values())


def _shuffles(call: CallSite) -> bool:
    shuffle = call.arg("shuffle", 3)  # DistributedSampler(dataset, num_replicas, rank, shuffle, ...)
    return shuffle is None or literal_value(shuffle) is True


class SamplerWithoutSetEpoch(ScriptRule):
    id = "TC504"
    triggers = (r"DistributedSampler",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if facts.frameworks or not info.step_calls:
            return
        if facts.method_calls("set_epoch"):
            return  # reseeded somewhere (sampler, loader.sampler, a helper or a custom loader)
        samplers = [c for c in facts.calls if is_distributed_sampler(callee_type(facts, c))]
        if not samplers:
            return
        loop = epoch_loop(facts, info)
        if loop is None:
            return
        epoch_var = (
            facts.module.code_for_node(loop.node.target) if isinstance(loop.node, cst.For) else while_counter(loop.node)
        )
        for call in samplers:
            if not _shuffles(call) or facts.in_eval(call.ctx) or in_test_code(call.ctx):
                continue
            name = info.target_of(call.node) or _conditional_target(facts, call)
            owner = name or _loader_holding(info, call)
            if owner and EVAL_NAME.search(owner):
                continue
            receiver = name or (f"{owner}.sampler" if owner else None)
            anchor = {
                "kind": "insert-set-epoch",
                "line": facts.line_of(call.node),
                "sampler": receiver,
                "epoch_loop_line": facts.line_of(loop.node),
                "epoch": epoch_var,
            }
            if receiver and epoch_var and re.fullmatch(r"\w+", epoch_var) and epoch_var != "_":
                fix = Fix(FixClass.SAFE, f"call {receiver}.set_epoch({epoch_var}) at the start of each epoch", anchor=anchor)
            else:
                if epoch_var == "_":
                    reason = "the epoch loop has no counter (`for _ in ...`); name it and pass it to set_epoch"
                elif not epoch_var and isinstance(loop.node, cst.While):
                    reason = "the epoch loop is a `while` loop without an epoch counter to pass to set_epoch"
                else:
                    reason = "the sampler or the epoch counter has no name to call it with"
                fix = Fix(
                    FixClass.SAFE,
                    "call sampler.set_epoch(epoch) at the start of each epoch",
                    available=False,
                    reason=reason,
                    anchor=anchor,
                )
            yield self.finding(
                facts,
                call.node,
                "DistributedSampler shuffles with the same seed every epoch unless `set_epoch(epoch)` is "
                "called: each epoch visits the data in the same order",
                fix=fix,
            )


def _conditional_target(facts: ScriptFacts, sampler: CallSite) -> str | None:
    """``sampler = DistributedSampler(ds) if distributed else None`` → ``sampler``."""
    statement = sampler.statement.node if sampler.statement else None
    for binding in facts.bindings:
        value = binding.value
        if binding.statement is not None and binding.statement.node is statement and isinstance(value, cst.IfExp):
            if sampler.node in (value.body, value.orelse):
                return binding.target
    return None


def _loader_holding(info: DistributedFacts, sampler: CallSite) -> str | None:
    """``loader = DataLoader(ds, sampler=DistributedSampler(ds))`` → ``loader``."""
    for call in info.dataloaders:
        value = call.arg("sampler")
        if value is sampler.node:
            return info.dataloader_name(call)
    return None
