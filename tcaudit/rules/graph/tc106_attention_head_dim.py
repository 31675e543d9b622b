"""TC106 attention-head-dim: an attention head dim that flash attention refuses (not a multiple of 8,
or over 256)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import ModelFacts
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, impact_text

MAX_HEAD_DIM = 256


def suggested_head_dim(head_dim: int) -> int:
    if head_dim > MAX_HEAD_DIM:
        return MAX_HEAD_DIM
    return -(-head_dim // 8) * 8


class AttentionHeadDim(ModelRule):
    id = "TC106"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost_model
        groups: dict[tuple, list] = {}
        for op in facts.ops_of("sdpa"):
            head = op.info["head_dim"]
            if not cost.head_dim_unsupported(head):
                continue
            site = self._site(context, op)
            groups.setdefault((site.path, site.line, site.column, head), []).append(op)
        for (_, _, _, head), ops in groups.items():
            first = ops[0]
            estimate = cost.compute_cost(ops, cost.sdpa_penalty())
            shown, module_details = describe_modules(ops)
            heads = first.info.get("heads")
            call_site = first.site
            details = {**module_details, "head_dim": head, "heads": heads, "shapes": first.shapes,
                       "suggested": suggested_head_dim(head)}
            if call_site is not None:
                details["call_line"] = call_site.line
            message, explanation = self._message(shown, head, heads, context, impact_text(estimate))
            yield self.finding(
                context,
                self._site(context, first),
                message,
                cost=estimate,
                details=details,
                explanation=explanation,
            )
        for module in facts.unreached("mha"):
            head = module.attrs["head_dim"]
            if not cost.head_dim_unsupported(head) or module.site is None:
                continue
            estimate = cost.parameter_cost(module.attrs, cost.sdpa_penalty())
            message, explanation = self._message(f"`{module.path}`", head, module.attrs["num_heads"], context,
                                                 impact_text(estimate), "checked from its parameters")
            yield self.finding(
                context,
                module.site,
                message,
                cost=estimate,
                details={"module": module.path, "head_dim": head, "heads": module.attrs["num_heads"],
                         "suggested": suggested_head_dim(head), "impact_basis": "parameters"},
                explanation=explanation,
            )

    @staticmethod
    def _site(context: ModelContext, op):
        """The attention layer's construction; the SDPA call line when it runs in the root module."""
        if op.module:
            site = context.module_site(op.module)
            if site is not None:
                return site
        return op.site or context.target_site()

    @staticmethod
    def _message(shown, head, heads, context, impact, suffix="") -> tuple[str, str]:
        """The message (what and where, the head dim to use) and the explanation (why, the figures)."""
        reason = "over 256" if head > MAX_HEAD_DIM else "not a multiple of 8"
        message = f"attention in {shown} has head dim {head}, {reason}; use {suggested_head_dim(head)}"
        width = f" ({heads} heads × {head})" if heads else ""
        explanation = (
            f"Head dim {head}{width} is {reason}: the flash-attention kernels refuse it and "
            f"scaled_dot_product_attention falls back to a slower kernel (~{context.cost_model.sdpa_penalty():.1f}× slower "
            f"on {context.cost_model.device_name}); use a head dim of {suggested_head_dim(head)} (fewer, wider heads, "
            f"or pad the head dim)"
        )
        if impact:
            explanation += f" [{impact}]"
        if suffix:
            explanation += f"; {suffix}"
        return message, explanation + "."
