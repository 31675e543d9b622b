"""TC110 redundant-cast: a cast to the dtype a tensor already has, or a round trip a→b→a."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Severity
from tcaudit.model.facts import DTYPE_BYTES, ModelFacts, OpFact, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, impact_text


class RedundantCast(ModelRule):
    id = "TC110"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        casts = {op.index: op for op in facts.ops_of("cast")}
        round_trips: dict[tuple, list[tuple[OpFact, OpFact]]] = {}
        no_ops: dict[tuple, list[OpFact]] = {}
        for op in casts.values():
            info = op.info
            before = casts.get(info.get("after")) if info.get("after") is not None else None
            if (
                before is not None
                and before.info["src"] == info["dst"]
                and before.info["src"] != before.info["dst"]
                and before.info.get("users", 1) == 1
            ):
                site = context.op_site(op)
                key = (site.path, site.line, info["dst"], before.info["dst"])
                round_trips.setdefault(key, []).append((before, op))
            elif info["src"] == info["dst"] and info.get("explicit") and (
                not info.get("input_is_graph_input") or info.get("input_is_parameter")
            ):
                site = context.op_site(op)
                no_ops.setdefault((site.path, site.line, info["dst"]), []).append(op)
        for (_, _, start, middle), pairs in round_trips.items():
            second = pairs[0][1]
            bytes_moved = sum(
                2 * b.info["numel"] * (DTYPE_BYTES.get(start, 4) + DTYPE_BYTES.get(middle, 4)) for _, b in pairs
            )
            estimate = context.cost_model.memory_cost(bytes_moved)
            shown, module_details = describe_modules([second for _, second in pairs])
            wider = DTYPE_BYTES.get(middle, 4) > DTYPE_BYTES.get(start, 4)
            effect = "gives back the same values" if wider else f"can only lose precision through {short_dtype(middle)}"
            message = (
                f"round-trip cast {short_dtype(start)} → {short_dtype(middle)} → {short_dtype(start)} in {shown}; "
                f"drop both casts"
            )
            explanation = (
                f"Both casts copy the tensor ({'x'.join(map(str, second.shapes[-1])) if second.shapes else '?'}) "
                f"and the round trip {effect}"
            )
            if estimate.time_share:
                explanation += f" [{impact_text(estimate)}, memory-bound]"
            yield self.finding(
                context,
                context.op_site(second),
                message,
                cost=estimate,
                details={**module_details, "dtypes": [start, middle, start], "shapes": second.shapes,
                         "count": len(pairs)},
                explanation=explanation + ".",
            )
        for (_, _, dtype), ops in no_ops.items():
            shown, module_details = describe_modules(ops)
            yield self.finding(
                context,
                context.op_site(ops[0]),
                f"cast to {short_dtype(dtype)} in {shown} does nothing: the tensor is already {short_dtype(dtype)}",
                severity=Severity.INFO,
                details={**module_details, "dtype": dtype, "shapes": ops[0].shapes},
                explanation=(f"The tensor is already {short_dtype(dtype)} at the configured precision; remove the "
                             "cast, or keep it only if the code must also run in another dtype."),
            )
