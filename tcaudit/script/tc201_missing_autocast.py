"""TC201 missing-autocast: a training step whose forward and loss run in fp32 on a GPU."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import amp_facts
from tcaudit.script.facts import ScriptFacts, loss_statements
from tcaudit.script.rule import RuleContext, ScriptRule


class MissingAutocast(ScriptRule):
    id = "TC201"
    triggers = (r"\.backward\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.uses_accelerator or not facts.updates_parameters:
            return  # a framework owns precision; a CPU-only script gets no AMP advice
        amp = amp_facts(facts)
        if amp.half_model_casts or amp.double_model:
            return  # TC206 covers a model cast to half; float64 models ignore autocast on purpose
        uncovered: dict[object, list] = {}
        for step in facts.training_steps:
            if not amp.step_is_covered(step):
                uncovered.setdefault(step.function, []).append(step)
        dtype, scaler, why = amp.recommended_precision(context.settings.precision)
        recipe = "bf16 autocast" if dtype == "bfloat16" else "fp16 autocast with a GradScaler"
        for function, steps in uncovered.items():
            ranges = []
            first_node = None
            for step in steps:
                statements = loss_statements(facts, step)
                if statements:
                    start = facts.line_of(statements[0].node)
                    end = facts.position(statements[-1].node).end.line
                    node = statements[0].node
                else:
                    node = step.backward.statement.node if step.backward.statement else step.backward.node
                    start = end = facts.line_of(node)
                ranges.append({"start_line": start, "end_line": end, "backward_line": facts.line_of(step.backward.node)})
                if first_node is None:
                    first_node = node
            where = f"in `{function.name.value}`" if function is not None else "at module level"
            lines = ", ".join(
                f"{r['start_line']}" if r["start_line"] == r["end_line"] else f"{r['start_line']}-{r['end_line']}"
                for r in ranges
            )
            message = (
                f"training step {where} runs forward and loss in fp32 (line {lines}): "
                f"wrap them in torch.autocast; {recipe} ({why})"
            )
            reason = None
            if amp.uses_lbfgs and scaler:
                reason = "LBFGS closures cannot use GradScaler"
            yield self.finding(
                facts,
                first_node,
                message,
                fix=Fix(
                    FixClass.NUMERICS,
                    f"wrap forward and loss in torch.autocast(device_type, dtype=torch.{dtype})"
                    + (" and scale the loss with torch.amp.GradScaler" if scaler else ""),
                    available=reason is None,
                    reason=reason,
                    anchor={"kind": "wrap-autocast", "ranges": ranges, "dtype": dtype, "scaler": scaler},
                ),
            )
