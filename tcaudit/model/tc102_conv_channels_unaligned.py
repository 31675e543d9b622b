"""TC102 conv-channels-unaligned: a convolution whose channel counts miss the 16-byte alignment."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import CostModel, alignment_elements, suggest
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.model.rules import ModelContext, ModelRule, describe_modules, group_by_site, impact_text

NAMES = {"c_in": "in", "c_out": "out"}


def reported_channels(op: OpFact, cost: CostModel) -> list[str]:
    """The conv's unaligned channel counts, less the out channels of a conv that produces the model's
    output (a segmentation head's classes are the task's) and the in channels of one that reads the
    model's input (the data's bands)."""
    bad = cost.conv_unaligned(op.info, cost.dtype(op))
    fixed = {"c_out": bool(op.info.get("model_output")), "c_in": bool(op.info.get("model_input"))}
    return [key for key in bad if not fixed[key]]


class ConvChannelsUnaligned(ModelRule):
    id = "TC102"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost
        flagged = [op for op in facts.ops_of("conv") if reported_channels(op, cost)]
        for site, ops in group_by_site(context, flagged, lambda op: (op.info["c_in"], op.info["c_out"], op.dtype)):
            first = ops[0]
            dtype = cost.dtype(first)
            bad = reported_channels(first, cost)
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
        head = facts.last_layer_path() if not facts.ops else None
        for module in facts.unreached("conv"):
            attrs = module.attrs
            info = {"c_in": attrs["in_channels"], "c_out": attrs["out_channels"], "groups": attrs["groups"]}
            dtype = facts.compute_dtype
            bad = [key for key in cost.conv_unaligned(info, dtype) if not (key == "c_out" and module.path == head)]
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
