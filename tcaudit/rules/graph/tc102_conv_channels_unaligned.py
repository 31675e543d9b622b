"""TC102 conv-channels-unaligned: a convolution whose channel counts miss the 16-byte alignment.

Two halves, one rule. The model half reads what the model audit measured of the built model and
reports every unaligned convolution, with no fix. The script half reports a channel count the script
sets as a literal that is not a multiple of 8: a channel count out of
one convolution and into the next (``BatchNorm2d(C)``/``LayerNorm(C)``/``GroupNorm(g, C)`` in between
taking the same size, or a ``nn.Linear(C, ...)`` after global pooling) that the script writes as a
literal it controls (a constant, an argparse default, a model class's parameter default, or
``nn.Conv2d(32, 30, 3)`` then ``nn.Conv2d(30, 64, 1)``), found and judged by
:mod:`tcaudit.rules.graph.widths`. It runs only when asked for (``tcaudit fix --pad-dims``, ``pad-dims =
true``), as TC101's script half. Fix (numerics): the literal becomes the model audit's suggested count (30 → 32). Declined with the reason
where that is not certain (a checkpoint load, a grouped convolution, a GroupNorm whose groups would
not divide the padded count, the count feeding anything but layer widths, ...). One finding per
count (``rules.graph.widths.one_width_finding``), as TC101's script half.
"""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import CostModel, alignment_elements, suggest
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule, RuleContext
from tcaudit.rules.graph.literals import PadWidthLiterals
from tcaudit.rules.graph.model_reports import describe_modules, group_by_site, impact_text
from tcaudit.rules.graph.widths import Width, WidthLiteral, width_layers, width_named
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.triggers import all_of

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
        cost = context.cost_model
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
            f"(~{context.cost_model.conv_penalty():.1f}× slower on {context.cost_model.device_name})"
        )
        return message, explanation + (f" [{impact}]" if impact else "") + "."


# -- the script half -------------------------------------------------------------------------------


class ChannelWidthLiteral(WidthLiteral):
    id = "TC102"
    triggers = (all_of(BACKWARD_CALL, r"Conv[123]d"),)
    unit = "channels"

    def describe(self, facts: ScriptFacts, width: Width, context: RuleContext) -> tuple[str, str]:
        cost = context.cost(self.spec, "channels")
        effect = f"cuDNN cannot use its fast bf16/fp16 Tensor Core kernels for {width_layers(facts, width)}{cost}"
        return f"channel count {width.value}{width_named(width)}", effect


class PadChannelWidth(PadWidthLiterals):
    rule = "TC102"
