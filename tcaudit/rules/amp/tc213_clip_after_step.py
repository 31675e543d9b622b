"""TC213 clip-after-step: gradients clipped after the optimizer step has already used them.

``clip_grad_norm_`` after ``optimizer.step()`` (or ``scaler.step(optimizer)``), with no backward in
between, changes gradients the step has consumed: the update was not clipped at all, and the next
``zero_grad`` drops the clipped values. Common where clipping was added after the AMP branches
(``if args.amp: ...scaler.step(opt)... else: ...opt.step()`` then ``if args.clip: clip(...)``). No
automatic fix: the clip belongs before the step (after ``scaler.unscale_`` under AMP), and moving it
across the branches is the author's call.
"""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.facts import CLIP_FUNCTIONS, ScriptFacts
from tcaudit.script.steps import clipped_after_step


class ClipAfterStep(ScriptRule):
    id = "TC213"
    triggers = (r"clip_grad",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.optimizer_steps:
            return
        for call in facts.calls:
            short = (call.qualname or call.name or "").split(".")[-1]
            if short not in CLIP_FUNCTIONS:
                continue
            step = clipped_after_step(facts, call)
            if step is None:
                continue
            yield self.finding(
                facts,
                call.node,
                f"gradients are clipped after `{facts.code(step.node)}` has used them; clip before the step",
                explanation=("The update was made with the unclipped gradients, so the clip has no effect on "
                             "training; clip before the step (after `scaler.unscale_(optimizer)` under AMP)."),
            )
