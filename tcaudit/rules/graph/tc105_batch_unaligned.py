"""TC105 batch-unaligned: the GEMM M dimension (batch × tokens) is not a multiple of 8 (information)."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import alignment_elements
from tcaudit.model.facts import ModelFacts
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import attention_core, impact_text


class BatchUnaligned(ModelRule):
    id = "TC105"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        if facts.input.get("assumed"):
            return  # the batch (or sequence) is the audit's guess, not the script's choice
        cost = context.cost_model
        by_m: dict[int, list] = {}
        aligned_ms: set[int] = set()
        for op in facts.ops_of("gemm"):
            if attention_core(op) or op.info.get("batch", 1) != 1:
                continue
            m = op.info["m"]
            if not cost.aligned(m, cost.dtype(op)):
                by_m.setdefault(m, []).append(op)
            else:
                aligned_ms.add(m)
        for m, ops in sorted(by_m.items()):
            if any(other % m == 0 for other in aligned_ms):
                # The bulk of the GEMMs run on a multiple of these rows (batch × tokens, aligned): these are
                # a slice of the same batch, as a GPT's head on the last position only (nanoGPT's inference
                # path, which the audit traces without targets). A larger batch would not change them.
                continue
            dtype = cost.dtype(ops[0])
            align = alignment_elements(dtype)
            estimate = cost.compute_cost(ops, cost.gemm_m_penalty(m, dtype))
            shapes = facts.input.get("shapes") or []
            origin = facts.input.get("origin", "")
            padded = -(-m // align) * align
            message = f"the model's GEMMs run with M={m} rows, not a multiple of {align}"
            explanation = (
                f"The input is {', '.join('x'.join(map(str, s)) for s in shapes)}: {origin}. A small cost "
                f"(~{estimate.penalty:.2f}× on those GEMMs on {cost.device_name}); a batch that makes M a "
                f"multiple of {align} (e.g. M={padded}) avoids it"
            ) + (f" [{impact_text(estimate)}]." if estimate.flop_share else ".")
            yield self.finding(
                context,
                context.target_site(),
                message,
                explanation=explanation,
                cost=estimate,
                details={"m": m, "gemms": len(ops), "input": shapes, "dtype": dtype, "suggested": padded},
            )
