"""TC507 ddp-accumulation-sync: gradient accumulation on a DDP model that all-reduces every micro-step."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import (
    DistributedFacts,
    distributed_facts,
    has_modulo,
    in_test_code,
    innermost_loop,
    loops_of,
    names_in,
)
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

_ACCUMULATION_NAME = re.compile(r"accum|update_freq|grad_acc|micro", re.IGNORECASE)
_SYNC_CONTROL = re.compile(r"no_sync|require_backward_grad_sync|set_requires_gradient_sync")


def _is_accumulation_test(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    """``(i + 1) % accum == 0``, ``step_now`` bound to such an expression, or a name saying so."""
    if has_modulo(test):
        return True
    for name in names_in(test):
        if _ACCUMULATION_NAME.search(name):
            return True
        for binding in facts.bindings_of(name):
            if has_modulo(binding.value):
                return True
    return False


def _conditional_steps(facts: ScriptFacts, info: DistributedFacts) -> list[tuple[Frame, Frame]]:
    """(loop, if-frame) for optimizer steps that run only every few iterations of their loop."""
    out = []
    for step in facts.optimizer_steps:
        for ctx in info.call_contexts(step.ctx):
            loop = innermost_loop(ctx)
            if loop is None:
                continue
            for frame in ctx.chain():
                if frame is loop:
                    break
                if frame.kind == "if" and _is_accumulation_test(facts, frame.node.test):  # type: ignore[attr-defined]
                    out.append((loop, frame))
                    break
    return out


def accumulating_backwards(facts: ScriptFacts, info: DistributedFacts) -> list[tuple[CallSite, str]]:
    """Backward calls that run on micro-steps between two optimizer steps, with how we know."""
    found: dict[int, tuple[CallSite, str]] = {}
    conditional = _conditional_steps(facts, info)
    step_loops = {}
    for step in facts.optimizer_steps:
        for ctx in info.call_contexts(step.ctx):
            loop = innermost_loop(ctx)
            if loop is not None:
                step_loops[id(loop.node)] = loop
    for training in facts.training_steps:
        backward = training.backward
        for ctx in info.call_contexts(backward.ctx):
            loop = innermost_loop(ctx)
            if loop is None:
                continue
            for step_loop, guard in conditional:
                if step_loop.node is loop.node and not ctx.inside(guard.node):
                    found.setdefault(id(backward.node), (backward, "the optimizer steps only under `if "
                                     + facts.module.code_for_node(guard.node.test) + "`"))  # type: ignore[attr-defined]
            if id(loop.node) in step_loops:
                continue
            outer = loops_of(loop.parent)[:1] if loop.parent is not None else []
            if outer and id(outer[0].node) in step_loops:
                found.setdefault(id(backward.node), (backward, "backward runs in an inner micro-step loop and "
                                 "the optimizer steps once after it"))
    return list(found.values())


class DdpAccumulationSync(ScriptRule):
    id = "TC507"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        ddp = info.wraps_of("ddp")
        if not ddp or facts.frameworks or _SYNC_CONTROL.search(info.text):
            return
        model = next((w.target for w in ddp if w.target), None)
        for backward, how in accumulating_backwards(facts, info):
            if in_test_code(backward.ctx):
                continue
            anchor = {"kind": "wrap-no-sync", "line": facts.line_of(backward.node), "model": model}
            if model:
                fix = Fix(FixClass.SAFE, f"run the forward and backward of non-final micro-steps under `{model}.no_sync()`", anchor=anchor)
            else:
                fix = Fix(
                    FixClass.SAFE,
                    "run the forward and backward of non-final micro-steps under `model.no_sync()`",
                    available=False,
                    reason="the DDP-wrapped model is not bound to a name",
                    anchor=anchor,
                )
            yield self.finding(
                facts,
                backward.node,
                f"gradient accumulation on a DDP model ({how}), but every backward all-reduces the "
                "gradients; skip the sync on non-final micro-steps with `no_sync()` (or "
                "`require_backward_grad_sync = False`)",
                fix=fix,
            )
