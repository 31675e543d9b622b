"""TC206 half-model-training: the whole model cast to fp16/bf16 and trained that way."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import amp_facts, cast_dtype
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule


class HalfModelTraining(ScriptRule):
    id = "TC206"
    triggers = (r"half|bfloat16|float16|HalfTensor",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.training_steps:
            return  # inference in half precision is the right thing to do
        amp = amp_facts(facts)
        for call in amp.half_model_casts:
            dtype = cast_dtype(facts, call)
            yield self.finding(
                facts,
                call.node,
                f"the whole model is cast to {dtype} and trained that way: weights, gradients and "
                "optimizer state lose small updates (an fp16 weight of 1.0 ignores any step below "
                "0.0005); keep fp32 weights and run the forward under torch.autocast",
                fix=Fix(
                    FixClass.NUMERICS,
                    f"drop the cast and wrap forward and loss in torch.autocast(dtype=torch.{dtype})",
                    anchor={"kind": "replace-model-cast", "line": facts.line_of(call.node), "dtype": dtype},
                ),
            )
