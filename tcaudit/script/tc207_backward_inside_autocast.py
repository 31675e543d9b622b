"""TC207 backward-inside-autocast: the backward pass sits inside the autocast block."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule


class BackwardInsideAutocast(ScriptRule):
    id = "TC207"
    triggers = (r"autocast",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for step in facts.training_steps:
            frame = facts.autocast_frame(step.ctx)
            if frame is None or frame.kind != "with":
                continue
            yield self.finding(
                facts,
                step.backward.node,
                "backward() runs inside the autocast block; autocast is meant for forward and loss: "
                "backward ops already run in the dtype their forward used, so dedent the backward",
                fix=Fix(
                    FixClass.SAFE,
                    "move the backward (and what follows it in the block) out of the autocast block",
                    anchor={"kind": "dedent-backward", "line": facts.line_of(step.backward.node),
                            "with_line": facts.line_of(frame.node)},
                ),
            )
