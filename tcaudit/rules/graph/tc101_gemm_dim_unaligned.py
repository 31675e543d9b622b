"""TC101 gemm-dim-unaligned: a GEMM whose K or N is not a multiple of the 16-byte alignment.

Two halves, one rule. The model half (:class:`GemmDimUnaligned`) reads what the model audit measured of
the built model and reports every unaligned GEMM, with no fix. The script half
(:class:`HiddenWidthLiteral`) reports a hidden width the script sets as a literal that is not a
multiple of 8: a width between two ``nn.Linear``
layers that the script writes as a literal it controls (``hidden = 500``, an argparse default, a model
class's parameter default, or ``nn.Linear(784, 500)`` then ``nn.Linear(500, 10)``), found and judged
by :mod:`tcaudit.rules.graph.widths`. It runs only when asked for (``tcaudit fix --pad-dims``,
``pad-dims = true``): without that, scan and fix report and edit what they did before. Fix (numerics): the literal becomes the model audit's suggested size (the next multiple of 64 from
256 on, of 8 below), so the layers get units the model's input and output never see. Declined with
the reason where that is not certain (a checkpoint load, the width feeding anything but layer widths,
the model's input or output width, ...). One finding per width (``rules.graph.widths.one_width_finding``): a
fixable literal stands for the model audit's findings of the layers it sizes; a declined one gives
its reason to them.
"""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import CostModel, alignment_elements, suggest
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule, RuleContext
from tcaudit.rules.graph.literals import PadWidthLiterals
from tcaudit.rules.graph.model_reports import attention_core, describe_modules, group_by_site, impact_text
from tcaudit.rules.graph.widths import Width, WidthLiteral, width_layers, width_named
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.triggers import all_of


def vocab_sizes(facts: ModelFacts) -> set[int]:
    """Rows of token embeddings (512 rows or more): their GEMMs are TC104's."""
    sizes = {op.info["rows"] for op in facts.ops_of("embedding") if op.info.get("rows", 0) >= 512}
    sizes |= {
        m.attrs["num_embeddings"]
        for m in facts.modules.values()
        if m.attrs.get("role") == "embedding" and m.attrs.get("num_embeddings", 0) >= 512
    }
    return sizes


def unaligned_dims(op: OpFact, cost: CostModel, vocab: set[int]) -> list[tuple[str, int]]:
    """The GEMM's K and N that miss the alignment, as ``[("K", 10), ...]``. A vocabulary is TC104's; the
    N of a layer that produces the model's output (classes, actions, a regression's 1) is the task's,
    and so is the K of one that reads the model's input (the data's features)."""
    k, n, dtype = op.info["k"], op.info["n"], cost.dtype(op)
    fixed = {"N": bool(op.info.get("model_output")), "K": bool(op.info.get("model_input"))}
    return [(name, dim) for name, dim in (("K", k), ("N", n))
            if not cost.aligned(dim, dtype) and dim not in vocab and not fixed[name]]


def layer_widths(facts: ModelFacts) -> tuple[set[int], set[int]]:
    """The widths the model's layers produce (Linear outputs, conv and embedding channels, RNN hidden
    sizes, attention widths) and those they read: what a layer seen only from its parameters can be
    wired to."""
    produced: set[int] = set()
    consumed: set[int] = set()
    for module in facts.modules.values():
        attrs = module.attrs
        role = attrs.get("role")
        if role == "linear":
            produced.add(attrs["out_features"])
            consumed.add(attrs["in_features"])
        elif role == "conv":
            produced.add(attrs["out_channels"])
            consumed.add(attrs["in_channels"])
        elif role == "embedding":
            produced.add(attrs.get("embedding_dim", 0))
        elif role == "rnn":
            hidden = attrs.get("proj_size") or attrs.get("hidden_size", 0)
            produced.update({hidden, hidden * 2})  # bidirectional layers concatenate both directions
            consumed.add(attrs.get("input_size", 0))
        elif role == "mha":
            produced.add(attrs.get("embed_dim", 0))
            consumed.add(attrs.get("embed_dim", 0))
        elif role == "norm":  # batch norm passes its width on
            produced.add(attrs.get("num_features", 0))
            consumed.add(attrs.get("num_features", 0))
    return produced, consumed


class GemmDimUnaligned(ModelRule):
    id = "TC101"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost_model
        vocab = vocab_sizes(facts)
        flagged = []
        for op in facts.ops_of("gemm"):
            if attention_core(op):
                continue
            if unaligned_dims(op, cost, vocab):
                flagged.append(op)
        for site, ops in group_by_site(context, flagged, lambda op: (op.info["k"], op.info["n"], op.dtype)):
            yield self._report(context, site, ops, vocab)
        reached_paths = {op.module for op in facts.ops}
        head = facts.last_layer_path() if not facts.ops else None
        produced, consumed = layer_widths(facts)
        # One layer alone says nothing of what feeds it or what it feeds.
        wired = sum(m.attrs.get("role") in ("linear", "conv", "rnn", "mha", "embedding") for m in facts.modules.values()) > 1
        for module in facts.unreached("linear"):
            if module.path in reached_paths or module.attrs.get("tied_to"):
                continue
            k, n = module.attrs["in_features"], module.attrs["out_features"]
            dtype = facts.compute_dtype
            # No graph shows where the layer's input comes from or where its output goes: a width no
            # other layer produces is the data's (an observation's 4 features), one no other layer reads
            # is the task's (a detector's 3 classes, an actor's 2 actions, a critic's 1 value).
            fixed = {"K": wired and k not in produced, "N": module.path == head or (wired and n not in consumed)}
            bad = [(name, dim) for name, dim in (("K", k), ("N", n))
                   if not cost.aligned(dim, dtype) and dim not in vocab and not fixed[name]]
            if not bad or module.site is None or cost.layer_within_launch(module.attrs):
                continue
            penalty = cost.gemm_kn_penalty(k if ("K", k) in bad else 8, n if ("N", n) in bad else 8, dtype)
            estimate = cost.parameter_cost(module.attrs, penalty)
            message, explanation = self._message(
                f"`{module.path}`", f"Linear {k}→{n}", dtype, bad, penalty, context, impact_text(estimate),
                "not run by the captured graph; checked from its parameters")
            yield self.finding(
                context,
                module.site,
                message,
                explanation=explanation,
                cost=estimate,
                details={"module": module.path, "k": k, "n": n, "dtype": dtype, "impact_basis": "parameters",
                         "suggested": {name: suggest(dim, dtype) for name, dim in bad},
                         "unaligned": dict(bad)},
            )

    def _report(self, context: ModelContext, site, ops: list[OpFact], vocab: set[int]) -> Finding:
        cost = context.cost_model
        first = ops[0]
        k, n, m, dtype = first.info["k"], first.info["n"], first.info["m"], cost.dtype(first)
        bad = unaligned_dims(first, cost, vocab)
        penalty = cost.gemm_kn_penalty(k if ("K", k) in bad else 8, n if ("N", n) in bad else 8, dtype)
        estimate = cost.compute_cost(ops, penalty)
        shown, module_details = describe_modules(ops)
        layer = f"{first.module_type or first.op} {k}→{n}" if first.op == "linear" else f"{first.op} M={m} N={n} K={k}"
        details = {
            **module_details,
            "op": first.op,
            "shapes": first.shapes,
            "m": m, "n": n, "k": k,
            "dtype": dtype,
            "suggested": {name: suggest(dim, dtype) for name, dim in bad},
            "unaligned": dict(bad),  # the sizes that miss the alignment, by dimension (K, N)
        }
        message, explanation = self._message(shown, layer, dtype, bad, penalty, context, impact_text(estimate))
        return self.finding(
            context,
            site,
            message,
            explanation=explanation,
            cost=estimate,
            details=details,
        )

    @staticmethod
    def _message(shown, layer, dtype, bad, penalty, context, impact, suffix="") -> tuple[str, str]:
        """The message (what and where, the padding) and the explanation (the why and the figures)."""
        dims = " and ".join(f"{name}={dim}" for name, dim in bad)
        pads = ", ".join(f"{name} {dim}→{suggest(dim, dtype)}" for name, dim in bad)
        align = alignment_elements(dtype)
        device = context.cost_model.device_name
        multiple = "not a multiple" if len(bad) == 1 else "not multiples"
        message = f"{shown} ({layer}) runs a {short_dtype(dtype)} GEMM with {dims}, {multiple} of {align}; pad {pads}"
        explanation = (
            f"{dims} {'is not a multiple' if len(bad) == 1 else 'are not multiples'} of {align} elements (16 bytes): "
            "the GEMM misses the fast Tensor Core "
            f"kernels (~{penalty:.1f}× slower on {device})"
        )
        if impact:
            explanation += f" [{impact}]"
        if suffix:
            explanation += f"; {suffix}"
        return message, explanation + "."


# -- the script half -------------------------------------------------------------------------------


class HiddenWidthLiteral(WidthLiteral):
    id = "TC101"
    triggers = (all_of(BACKWARD_CALL, r"Linear"),)
    unit = "units"

    def describe(self, facts: ScriptFacts, width: Width, context: RuleContext) -> tuple[str, str]:
        key = "n_multiple_of_4" if width.value % 4 == 0 else "odd_n"
        cost = context.cost(self.spec, key)
        effect = f"the GEMMs of {width_layers(facts, width)} miss the fast bf16/fp16 Tensor Core kernels{cost}"
        return f"hidden width {width.value}{width_named(width)}", effect


class PadHiddenWidth(PadWidthLiterals):
    rule = "TC101"
