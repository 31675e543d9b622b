"""TC103 stem-conv-channels: a 1- or 3-channel input convolution (information, not a defect)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import ModelFacts
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, group_by_site, impact_text


class StemConvChannels(ModelRule):
    id = "TC103"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        stems = [op for op in facts.ops_of("conv") if op.info["c_in"] in (1, 3) and op.info.get("groups", 1) == 1
                 and not op.info.get("transposed")]
        for site, ops in group_by_site(context, stems, lambda op: (op.info["c_in"], op.info["c_out"])):
            first = ops[0]
            estimate = context.cost_model.compute_cost(ops, 1.0)
            shown, module_details = describe_modules(ops)
            yield self.finding(
                context,
                site,
                self._message(shown, first.module_type or first.op, first.info["c_in"], first.info["c_out"]),
                cost=estimate,
                explanation=self.EXPLANATION.removesuffix(".")
                + (f" [{impact_text(estimate)}]." if estimate.flop_share else "."),
                details={**module_details, "shapes": first.shapes, "c_in": first.info["c_in"],
                         "c_out": first.info["c_out"], "suggested": {"in": 4}},
            )
        for module in facts.unreached("conv"):
            attrs = module.attrs
            if attrs["in_channels"] not in (1, 3) or attrs["groups"] != 1 or attrs.get("transposed") or module.site is None:
                continue
            yield self.finding(
                context,
                module.site,
                self._message(f"`{module.path}`", module.type, attrs["in_channels"], attrs["out_channels"]),
                explanation=self.EXPLANATION,
                details={"module": module.path, "c_in": attrs["in_channels"], "c_out": attrs["out_channels"],
                         "suggested": {"in": 4}, "impact_basis": "parameters"},
            )

    EXPLANATION = (
        "With channels_last, cuDNN's fastest NHWC kernels want 4 input channels; padding the input (and the "
        "weight) with a zero channel is an option when the stem shows up in a profile."
    )

    @staticmethod
    def _message(shown, layer, c_in, c_out) -> str:
        return f"{shown} ({layer} {c_in}→{c_out}) is a {c_in}-channel stem"
