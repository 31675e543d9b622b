"""TC102 conv-channels-unaligned: a convolution whose channel counts miss the 16-byte alignment."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import alignment_elements, suggest
from tcaudit.model.facts import ModelFacts, short_dtype
from tcaudit.model.rules import ModelContext, ModelRule, describe_modules, group_by_site, impact_text

NAMES = {"c_in": "in", "c_out": "out"}


class ConvChannelsUnaligned(ModelRule):
    id = "TC102"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost
        flagged = [op for op in facts.ops_of("conv") if cost.conv_unaligned(op.info, cost.dtype(op))]
        for site, ops in group_by_site(context, flagged, lambda op: (op.info["c_in"], op.info["c_out"], op.dtype)):
            first = ops[0]
            dtype = cost.dtype(first)
            bad = cost.conv_unaligned(first.info, dtype)
            estimate = cost.compute_cost(ops, cost.conv_penalty())
            shown, module_details = describe_modules(ops)
            message, explanation = self._message(
                shown, first.module_type or first.op, first.info, bad, dtype, context, impact_text(estimate))
            yield self.finding(
                context,
                site,
                message,
                explanation=explanation,
                cost=estimate,
                details={**module_details, "shapes": first.shapes, "c_in": first.info["c_in"],
                         "c_out": first.info["c_out"], "dtype": dtype,
                         "suggested": {NAMES[key]: suggest(first.info[key], dtype) for key in bad},
                         "unaligned": {NAMES[key]: first.info[key] for key in bad}},
            )
        for module in facts.unreached("conv"):
            attrs = module.attrs
            info = {"c_in": attrs["in_channels"], "c_out": attrs["out_channels"], "groups": attrs["groups"]}
            dtype = facts.compute_dtype
            bad = cost.conv_unaligned(info, dtype)
            if not bad or module.site is None:
                continue
            estimate = cost.parameter_cost(attrs, cost.conv_penalty())
            message, explanation = self._message(
                f"`{module.path}`", module.type, info, bad, dtype, context, impact_text(estimate))
            yield self.finding(
                context,
                module.site,
                message,
                explanation=explanation.removesuffix(".") + "; checked from its parameters.",
                cost=estimate,
                details={"module": module.path, "c_in": info["c_in"], "c_out": info["c_out"], "dtype": dtype,
                         "impact_basis": "parameters",
                         "suggested": {NAMES[key]: suggest(info[key], dtype) for key in bad},
                         "unaligned": {NAMES[key]: info[key] for key in bad}},
            )

    @staticmethod
    def _message(shown, layer, info, bad, dtype, context, impact) -> tuple[str, str]:
        """The message (what and where, the padding) and the explanation (the why and the figures)."""
        counts = " and ".join(f"{NAMES[key]} channels {info[key]}" for key in bad)
        pads = ", ".join(f"{info[key]}→{suggest(info[key], dtype)}" for key in bad)
        align = alignment_elements(dtype)
        message = f"{shown} ({layer} {info['c_in']}→{info['c_out']}) has {counts}, not a multiple of {align}; pad {pads}"
        explanation = (
            f"cuDNN cannot use its fast {short_dtype(dtype)} Tensor Core kernels "
            f"(~{context.cost.conv_penalty():.1f}× slower on {context.cost.device_name})"
        )
        return message, explanation + (f" [{impact}]" if impact else "") + "."
