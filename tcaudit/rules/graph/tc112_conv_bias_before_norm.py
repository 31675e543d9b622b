"""TC112 conv-bias-before-norm: a convolution with a bias that feeds BatchNorm directly."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import DTYPE_BYTES, ModelFacts
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, group_by_site, impact_text


class ConvBiasBeforeNorm(ModelRule):
    id = "TC112"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        ops = {op.index: op for op in facts.ops}
        pairs = {}
        for norm in facts.ops_of("norm"):
            before = ops.get(norm.info.get("after")) if norm.info.get("after") is not None else None
            if before is not None and before.kind == "conv" and before.info.get("bias"):
                pairs[before.index] = (before, norm)
        convs = [conv for conv, _ in pairs.values()]
        norm_of = {conv.index: norm for conv, norm in pairs.values()}
        for site, group in group_by_site(context, convs):
            first = group[0]
            norm = norm_of[first.index]
            size = DTYPE_BYTES.get(context.cost_model.dtype(first), 2)
            estimate = context.cost_model.memory_cost(sum(2 * size * conv.info.get("out_numel", 0) for conv in group))
            shown, module_details = describe_modules(group)
            message, explanation = self._message(shown, first.module_type or first.op, norm.module, impact_text(estimate))
            yield self.finding(
                context,
                site,
                message,
                cost=estimate,
                details={**module_details, "norm": norm.module, "shapes": first.shapes},
                explanation=explanation,
            )
        reached = {op.module for op in facts.ops}
        for module in facts.unreached("conv"):
            following = facts.module(module.attrs.get("next"))
            if (
                module.attrs.get("bias")
                and following is not None
                and following.attrs.get("role") == "norm"
                and module.site is not None
                and module.path not in reached
            ):
                message, explanation = self._message(f"`{module.path}`", module.type, following.path, "",
                                                     "checked from its parameters")
                yield self.finding(
                    context,
                    module.site,
                    message,
                    details={"module": module.path, "norm": following.path, "impact_basis": "parameters"},
                    explanation=explanation,
                )

    @staticmethod
    def _message(shown, layer, norm, impact, suffix="") -> tuple[str, str]:
        """The message (what and where, the fix) and the explanation (why, the cost)."""
        message = f"{shown} ({layer}, bias=True) feeds BatchNorm `{norm}`; construct it with bias=False"
        explanation = (
            "The norm subtracts the per-channel mean, so the bias has no effect but costs an extra pass "
            "over the output and a parameter"
        )
        if impact:
            explanation += f" [{impact}, memory-bound]"
        if suffix:
            explanation += f"; {suffix}"
        return message, explanation + "."
