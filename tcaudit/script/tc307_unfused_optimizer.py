"""TC307 unfused-optimizer: Adam/AdamW/SGD on CUDA without ``fused=True`` (info)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import all_of, CUDA_TEXT, keyword_arg, literal, pipeline_facts
from tcaudit.script.rule import RuleContext, ScriptRule

FUSABLE = {
    "torch.optim.Adam": "Adam",
    "torch.optim.adam.Adam": "Adam",
    "torch.optim.AdamW": "AdamW",
    "torch.optim.adamw.AdamW": "AdamW",
    "torch.optim.SGD": "SGD",
    "torch.optim.sgd.SGD": "SGD",
}


class UnfusedOptimizer(ScriptRule):
    id = "TC307"
    triggers = (all_of(r"Adam|SGD", r"backward", CUDA_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        for call in facts.calls:
            kind = FUSABLE.get(call.qualname or "")
            if kind is None or facts.in_eval(call.ctx):
                continue
            node = call.node
            if any(arg.star for arg in node.args):
                continue  # ``**opt_kwargs`` may hold fused/foreach
            if keyword_arg(node, "fused") is not None or keyword_arg(node, "foreach") is not None:
                continue  # either way a deliberate choice (foreach=False to save memory, fused=args.fused)
            differentiable = keyword_arg(node, "differentiable")
            if differentiable is not None and literal(differentiable.value) is not False:
                continue  # fused kernels do not support differentiable=True
            yield self.finding(
                facts,
                node,
                f"`{kind}` on CUDA without `fused=True`: PyTorch defaults to the foreach (multi-tensor) "
                f"implementation; the fused kernel does the whole {kind} update in one pass per "
                "parameter group, fewer launches and memory passes",
                fix=Fix(
                    FixClass.NUMERICS,
                    "pass fused=True (every parameter must be a floating-point CUDA tensor)",
                    anchor={"kind": "add-kwarg", "key": "fused", "value": "True"},
                ),
            )
