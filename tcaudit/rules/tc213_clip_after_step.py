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
from tcaudit.script.facts import CLIP_FUNCTIONS, CallSite, ScriptFacts
from tcaudit.script.guards import exclusive


def clipped_after_step(facts: ScriptFacts, clip: CallSite) -> CallSite | None:
    """The optimizer step that runs before ``clip`` on its path, after a backward and with no backward
    between them (the clip then clips gradients the step already used), or None."""
    function = clip.ctx.function
    line = facts.line_of(clip.node)

    def before_on_path(call: CallSite) -> bool:
        return call.ctx.function is function and facts.line_of(call.node) < line and not exclusive(call.ctx, clip.ctx)

    backwards = [facts.line_of(s.backward.node) for s in facts.training_steps if before_on_path(s.backward)]
    steps = [c for c in facts.optimizer_steps if before_on_path(c)]
    for step in sorted(steps, key=lambda c: facts.line_of(c.node), reverse=True):
        step_line = facts.line_of(step.node)
        if any(b < step_line for b in backwards) and not any(step_line < b for b in backwards):
            return step
    return None


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
                f"gradients are clipped after `{facts.module.code_for_node(step.node)}` has used them: the update "
                "was not clipped; clip before the step (after `scaler.unscale_(optimizer)` under AMP)",
            )
