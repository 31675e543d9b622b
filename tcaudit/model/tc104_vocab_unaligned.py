"""TC104 vocab-unaligned: a token embedding (and the LM head that shares its size) whose vocabulary
is not a multiple of 64. Only where a softmax ranges over the embedding's rows: a GEMM producing that
many outputs from vectors of the embedding's width, or a linear layer tied to it."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Severity
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.model.rules import ModelContext, ModelRule, impact_text

VOCAB_MULTIPLE = 64
MIN_VOCAB = 512  # smaller tables (class or label embeddings) are lookups with no GEMM behind them
ALIGNED_VOCAB = 8  # a multiple of 8 is 16-byte aligned: 64 gains ~1% more (rules/TC104.toml), so info


class VocabUnaligned(ModelRule):
    id = "TC104"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        embeddings: dict[int, list[str]] = {}
        widths: dict[int, set[int]] = {}  # rows → the embedding dims of the tables of that many rows
        for op in facts.ops_of("embedding"):
            rows = op.info["rows"]
            if rows >= MIN_VOCAB and rows % VOCAB_MULTIPLE and op.module is not None:
                embeddings.setdefault(rows, [])
                widths.setdefault(rows, set()).add(op.info["dim"])
                if op.module not in embeddings[rows]:
                    embeddings[rows].append(op.module)
        reached = {op.module for op in facts.ops}
        for module in facts.modules.values():
            rows = module.attrs.get("num_embeddings", 0)
            if module.attrs.get("role") == "embedding" and rows >= MIN_VOCAB and rows % VOCAB_MULTIPLE:
                if module.path not in reached or facts.capture.method == "parameters":
                    embeddings.setdefault(rows, [])
                    widths.setdefault(rows, set()).add(module.attrs.get("embedding_dim"))
                    if module.path not in embeddings[rows]:
                        embeddings[rows].append(module.path)
        for rows, paths in sorted(embeddings.items()):
            # Only a table whose rows a softmax ranges over: a GEMM that produces `rows` logits from
            # vectors of the embedding's width (an LM head, tied or not, or F.linear(h, emb.weight)).
            # A user, position or class table has no GEMM over its rows and nothing to pad.
            heads = [op for op in facts.ops_of("gemm") if op.info["n"] == rows and op.info["k"] in widths[rows]]
            tied = [m.path for m in facts.modules.values() if m.attrs.get("tied_to") in paths]
            untraced = [
                m.path for m in facts.modules.values()
                if m.attrs.get("role") == "linear" and m.attrs.get("out_features") == rows
                and m.attrs.get("in_features") in widths[rows]
            ] if facts.capture.method == "parameters" or not facts.ops_of("gemm") else []
            if heads or tied or untraced:
                yield self._report(context, rows, paths, heads)

    def _report(self, context: ModelContext, rows: int, embedding_paths: list[str], heads: list[OpFact]) -> Finding:
        cost = context.cost
        facts = context.facts
        dtype = cost.dtype(heads[0]) if heads else facts.compute_dtype
        padded = -(-rows // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        head_paths = []
        for op in heads:
            if op.module is not None and op.module not in head_paths:
                head_paths.append(op.module)
        if not heads:
            head_paths = [m.path for m in facts.modules.values()
                          if m.attrs.get("role") == "linear" and m.attrs["out_features"] == rows]
        tied = any(facts.modules.get(path) and facts.modules[path].attrs.get("tied_to") for path in head_paths)
        if heads:
            first = heads[0]
            penalty = cost.gemm_kn_penalty(first.info["k"], first.info["n"], dtype)
            if penalty == 1.0:
                penalty = cost.not_64_penalty()
            estimate = cost.compute_cost(heads, penalty)
            site = context.op_site(first)
        else:
            head_module = facts.modules.get(head_paths[0]) if head_paths else None
            if head_module is not None and head_module.site is not None:
                penalty = cost.gemm_kn_penalty(head_module.attrs["in_features"], head_module.attrs["out_features"], dtype)
                estimate = cost.parameter_cost(head_module.attrs, penalty if penalty > 1 else cost.not_64_penalty())
                site = head_module.site
            else:
                estimate = None
                site = context.module_site(embedding_paths[0]) or context.target_site()
        parts = [f"embedding `{embedding_paths[0]}`"]
        if head_paths:
            parts.append(f"LM head `{head_paths[0]}`" + (" (tied)" if tied else ""))
        message = (
            f"vocabulary size {rows} ({', '.join(parts)}) is not a multiple of {VOCAB_MULTIPLE}: "
            f"pad it to {padded}"
        )
        explanation = ""
        if estimate is not None and heads:
            explanation = (
                f"The {short_dtype(dtype)} LM-head GEMM with N={rows} runs ~{estimate.penalty:.1f}× slower "
                f"on {cost.device_name} [{impact_text(estimate)}]."
            )
        elif estimate is None:
            explanation = "The lookup itself is cheap, but any GEMM over this vocabulary will be unaligned."
        details = {
            "module": embedding_paths[0],
            "embeddings": embedding_paths,
            "heads": head_paths,
            "tied": tied,
            "vocab_size": rows,
            "suggested": padded,
            "dtype": dtype,
        }
        if heads:
            details["shapes"] = heads[0].shapes
        severity = None
        if rows % ALIGNED_VOCAB == 0:
            message += " (already a multiple of 8: ~1% to gain)"
            severity = Severity.INFO
        return self.finding(context, site, message, severity=severity, cost=estimate, details=details,
                            explanation=explanation)
