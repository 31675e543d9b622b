"""TC111 fp32-gemm: a GEMM, convolution or attention that still runs in fp32/fp64 under the
configured mixed precision."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import ModelFacts, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, group_by_site, impact_text

WIDE = {"float32", "float64"}


class Fp32Gemm(ModelRule):
    id = "TC111"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost_model
        target = facts.compute_dtype if facts.compute_dtype in ("bfloat16", "float16") else "bfloat16"
        wide = [op for op in facts.ops_of("gemm", "conv", "sdpa") if cost.dtype(op) in WIDE and op.flops > 0]
        for site, ops in group_by_site(context, wide, lambda op: (op.dtype, op.op)):
            first = ops[0]
            dtype = cost.dtype(first)
            estimate = cost.dtype_cost(ops)
            shown, module_details = describe_modules(ops)
            if dtype == "float64":
                why = "its tensors are float64, which autocast never lowers"
            elif facts.autocast:
                why = "autocast does not reach it (an autocast-disabled region, or an op autocast does not cover)"
            else:
                why = f"the model's parameters are {short_dtype(facts.param_dtype)}"
            message = f"{shown} runs its {first.op} in {short_dtype(dtype)}, not the {short_dtype(target)} training uses"
            explanation = (
                f"It stays {short_dtype(dtype)} because {why}; ~{estimate.penalty:.1f}× slower than "
                f"{short_dtype(target)} on {cost.device_name}"
            )
            impact = impact_text(estimate)
            if impact:
                explanation += f" [{impact}]"
            yield self.finding(
                context,
                site,
                message,
                cost=estimate,
                details={**module_details, "op": first.op, "dtype": dtype, "precision": target, "shapes": first.shapes},
                explanation=explanation + ".",
            )
