"""TC205 clip-before-unscale: clipping gradients that are still multiplied by the loss scale."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import CLIP_FUNCTIONS, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule


class ClipBeforeUnscale(ScriptRule):
    id = "TC205"
    triggers = (r"clip_grad",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        scaled = [step for step in facts.training_steps if step.scaler]
        if not scaled:
            return
        unscales = facts.method_calls("unscale_")
        for call in facts.calls:
            short = (call.qualname or call.name or "").split(".")[-1]
            if short not in CLIP_FUNCTIONS:
                continue
            function = call.ctx.function
            line = facts.line_of(call.node)
            same_function_steps = [s for s in scaled if s.function is function]
            if same_function_steps:
                if not any(facts.line_of(s.backward.node) < line for s in same_function_steps):
                    continue  # clipping before the scaled backward of this function: not scaled yet
                if any(u.ctx.function is function and facts.line_of(u.node) < line for u in unscales):
                    continue
            elif unscales:
                continue  # backward and clip in different functions, and an unscale_ somewhere: trust it
            scaler = same_function_steps[0].scaler if same_function_steps else scaled[0].scaler
            optimizer = self._optimizer_for(facts, function)
            yield self.finding(
                facts,
                call.node,
                f"gradients are clipped while still scaled by `{scaler}` (65536x at the default initial "
                f"scale), so the clip crushes every update; call `{scaler}.unscale_({optimizer})` first",
                fix=Fix(
                    FixClass.SAFE,
                    f"insert {scaler}.unscale_({optimizer}) before the clip",
                    anchor={"kind": "insert-before", "line": line, "code": f"{scaler}.unscale_({optimizer})"},
                ),
            )

    @staticmethod
    def _optimizer_for(facts: ScriptFacts, function) -> str:
        for call in facts.optimizer_steps:
            if call.ctx.function is function and call.receiver_name in facts.scalers and call.node.args:
                return facts.module.code_for_node(call.node.args[0].value)
        for call in facts.optimizer_steps:
            if call.ctx.function is function and call.receiver_name not in facts.scalers:
                return call.receiver_name or "optimizer"
        return "optimizer"
