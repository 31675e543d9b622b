"""TC311 compile-in-loop: ``torch.compile`` (or ``module.compile()``) called on every training step.

Each call builds a new compiled wrapper and re-runs Dynamo's guards and cache lookups; a call on a
fresh closure or module recompiles outright, so the "compiled" loop can be slower than eager. The
model is compiled once, before the loop. No automatic fix: which objects are loop-invariant is the
author's knowledge.
"""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, loops_of
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.triggers import all_of

COMPILE = {"torch.compile"}


class CompileInLoop(ScriptRule):
    id = "TC311"
    triggers = (all_of(r"compile\(", r"\.backward\("),)  # it needs a training step

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not facts.training_steps:
            return
        for call in facts.calls:
            is_compile = call.qualname in COMPILE or (
                call.method == "compile" and call.qualname is None and call.receiver_name is not None
                and not call.node.args
            )
            if not is_compile:
                continue
            if not any(info.is_step_loop(frame) for frame in loops_of(call.ctx)):
                continue
            yield self.finding(
                facts, call.node,
                f"`{call.name}(...)` runs on every training step; compile once, before the loop",
                explanation=("Each call wraps and guards the model anew (and recompiles a new closure), so "
                             "the step pays for it every time."),
            )
