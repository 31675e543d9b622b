"""TC319 mha-causal-hint: ``nn.MultiheadAttention`` given the causal mask without ``is_causal=True``.

With ``need_weights=False``, ``F.multi_head_attention_forward`` calls
``F.scaled_dot_product_attention``. Given only an ``attn_mask`` tensor, that runs the
memory-efficient kernel with the mask read from memory (the flash kernel takes no mask); told
``is_causal=True`` (a hint that the mask is the causal one), it drops the tensor and runs the flash
kernel with the causal mask built in. Reported where the mask passed is provably the T x T top-left
causal mask of a self-attention call: built in the same function from a shape's T as
``nn.Transformer.generate_square_subsequent_mask(T)``, ``torch.triu(torch.full((T, T), -inf),
diagonal=1)`` or a boolean ``torch.triu(torch.ones(T, T), diagonal=1)``.

Fix (numerics: another kernel, the same attention): add ``is_causal=True``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits, keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.attention import causal_construction, is_boolean_mask, mha_bindings
from tcaudit.script.facts import CallSite, ScriptFacts


class MhaCausalHint(ScriptRule):
    id = "TC319"
    triggers = (r"MultiheadAttention",)
    after = ("TC314",)  # the hint counts once need_weights=False, which TC314's fix passes

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        bound = mha_bindings(facts)
        if not bound:
            return
        code = facts.module.code_for_node
        # The calls TC314 passes need_weights=False to (its fix comes first: ``after``).
        without_weights = {(f.location.line, f.location.column) for f in context.findings_of("TC314", facts)}
        for call in facts.calls:
            if call.name is None or call.ctx.function is None:
                continue
            owner = call.ctx.class_def if call.name.startswith("self.") else None
            if call.name not in bound.get(owner, ()):
                continue
            start = facts.position(call.node).start
            mask = _causal_mask_argument(facts, call, (start.line, start.column + 1) in without_weights)
            if mask is None:
                continue
            yield self.finding(
                facts,
                call.node,
                f"`{call.name}(...)` gets the causal mask `{code(mask)}` without `is_causal=True`: "
                "no flash kernel",
                explanation="Told is_causal=True (with need_weights=False), nn.MultiheadAttention calls "
                "scaled_dot_product_attention with the causal mask built in, which the flash kernel runs; "
                "given the mask as a tensor it runs the memory-efficient kernel, reading the mask.",
                fix=self.planned_fix(FixClass.NUMERICS, "pass is_causal=True",
                                     lambda node=call.node: AddKeyword(node, "is_causal", "True")),
            )


def _causal_mask_argument(facts: ScriptFacts, call: CallSite, weights_dropped: bool) -> cst.Name | None:
    """The ``attn_mask=`` name of a self-attention call that can take the hint (``need_weights=False``
    written, or ``weights_dropped``: TC314's fix writes it), where that name is the causal mask built
    in the same function; None otherwise."""
    node = call.node
    if call.has_star_kwargs or keyword(node, "is_causal") is not None:
        return None
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    if len(positional) > 3 or keyword(node, "key_padding_mask") is not None:
        return None  # with a padding mask the hint is dropped: the masks are merged
    need_weights = keyword(node, "need_weights")
    written = need_weights is not None and isinstance(need_weights.value, cst.Name) and need_weights.value.value == "False"
    if not (written or weights_dropped):
        return None  # with the weights, the attention is computed explicitly: no kernel to choose
    code = facts.module.code_for_node
    if len(positional) < 2 or code(positional[0]) != code(positional[1]):
        return None  # not self-attention: a T x T mask need not be the query's and key's
    mask = keyword(node, "attn_mask")
    if mask is None or not isinstance(mask.value, cst.Name):
        return None
    value = _single_assignment(call.ctx.function, mask.value.value, facts.line_of(call.statement.node)
                               if call.statement is not None else None, facts)
    if value is None:
        return None
    kind = causal_construction(facts, call.ctx.function, value)
    if kind == "additive" or (kind == "filled" and is_boolean_mask(value)):
        return mask.value
    return None


def _single_assignment(function: cst.FunctionDef, name: str, before: int | None,
                       facts: ScriptFacts) -> cst.BaseExpression | None:
    """The value of the one plain assignment of ``name`` in the function, above line ``before``."""
    found: list[tuple[int, cst.BaseExpression]] = []
    others = [0]

    class Visitor(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if isinstance(target.target, cst.Name) and target.target.value == name:
                    if len(node.targets) == 1:
                        found.append((facts.line_of(node), node.value))
                    else:
                        others[0] += 1
                elif name in _target_names(target.target):
                    others[0] += 1

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if name in _target_names(node.target):
                others[0] += 1

        def visit_For(self, node: cst.For) -> None:
            if name in _target_names(node.target):
                others[0] += 1

    function.body.visit(Visitor())
    if len(found) != 1 or others[0] or before is None or found[0][0] >= before:
        return None
    return found[0][1]


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in target.elements)) if target.elements else set()
    return set()


class MhaCausalHintFix(Codemod):
    rule = "TC319"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
