"""TC314 mha-need-weights: an ``nn.MultiheadAttention`` call that computes attention weights nobody reads.

``need_weights`` defaults to True. With it, ``F.multi_head_attention_forward`` computes the attention
explicitly (a batched matmul, a softmax over the full L x S matrix, a second matmul) to return the
averaged weights; with ``need_weights=False`` it calls ``F.scaled_dot_product_attention``, which runs
the fused flash / memory-efficient kernels on CUDA. Reported where the module's call discards the
weights: ``out, _ = self.attn(q, k, v)``, ``self.attn(q, k, v)[0]``, or a second target never read.

Fix (numerics: SDPA's fused kernels round differently from the explicit softmax): pass
``need_weights=False``, or replace a written ``need_weights=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, KeywordPlan, ReplaceArgument, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.compile.attention import mha_bindings
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import keyword


@dataclass(frozen=True)
class _Use:
    """How one call's result is used: only its output (``[0]`` or a discarded second target)."""

    call: cst.Call
    form: str  # "[0]" or "a, _ ="


class _OutputOnly(cst.CSTVisitor):
    """Calls of the attention modules in one function whose weights are provably discarded."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.uses: list[_Use] = []
        self.unpacked: list[tuple[cst.Call, str]] = []  # (call, name of the weights' target)
        self.loads: dict[str, int] = {}

    def _is_attention_call(self, node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Call):
            return False
        func = node.func
        dotted = None
        if isinstance(func, cst.Name):
            dotted = func.value
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            dotted = f"{func.value.value}.{func.attr.value}"
        return dotted in self.names

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if self._is_attention_call(node.value) and len(node.slice) == 1:
            index = node.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0":
                self.uses.append(_Use(node.value, "[0]"))  # type: ignore[arg-type]

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not self._is_attention_call(node.value):
            return
        target = node.targets[0].target
        if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
            second = target.elements[1].value
            if isinstance(second, cst.Name) and not isinstance(target.elements[0], cst.StarredElement):
                self.unpacked.append((node.value, second.value))  # type: ignore[arg-type]

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        # Names written by an assignment are not reads; their subscripts/attributes are walked below.
        target = node.target
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                if not isinstance(element.value, cst.Name):
                    element.value.visit(self)
            return False
        return not isinstance(target, cst.Name)

    def visit_Name(self, node: cst.Name) -> None:
        self.loads[node.value] = self.loads.get(node.value, 0) + 1

    def discarded(self) -> list[_Use]:
        found = list(self.uses)
        for call, name in self.unpacked:
            if name == "_" or self.loads.get(name, 0) == 0:
                found.append(_Use(call, "a, _ ="))
        return found


class MhaNeedWeights(ScriptRule):
    id = "TC314"
    triggers = (r"MultiheadAttention",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        bound = mha_bindings(facts)
        if not bound:
            return
        functions: dict[cst.FunctionDef, set[str]] = {}
        for call in facts.calls:
            if call.name is None:
                continue
            owner = call.ctx.class_def if call.name.startswith("self.") else None
            if call.name in bound.get(owner, ()) and call.ctx.function is not None:
                functions.setdefault(call.ctx.function, set()).add(call.name)
        by_node: dict[int, CallSite] = {id(call.node): call for call in facts.calls}
        reported: set[int] = set()
        for function, names in functions.items():
            visitor = _OutputOnly(names)
            function.body.visit(visitor)
            for use in visitor.discarded():
                site = by_node.get(id(use.call))
                if site is None or id(use.call) in reported:
                    continue
                plan = _plan(site)
                if plan is None:
                    continue  # need_weights=False already, or a value the user controls
                reported.add(id(use.call))
                how = "`[0]` keeps only the output" if use.form == "[0]" else "the weights are unpacked and never read"
                yield self.finding(
                    facts,
                    use.call,
                    f"`{site.name}(...)` computes attention weights nobody reads ({how})",
                    explanation="With `need_weights=True` (the default) nn.MultiheadAttention builds the full "
                    "attention matrix instead of calling the fused scaled_dot_product_attention kernels: pass "
                    "`need_weights=False`.",
                    fix=self.planned_fix(FixClass.NUMERICS, "pass need_weights=False", lambda plan=plan: plan),
                )


def _plan(site: CallSite) -> KeywordPlan | None:
    if site.has_star_kwargs:
        return None  # need_weights may come from the dict
    written = keyword(site.node, "need_weights", 4)  # query, key, value, key_padding_mask, need_weights
    if written is None:
        return AddKeyword(site.node, "need_weights", "False")
    value = written.value
    if isinstance(value, cst.Name) and value.value == "True":
        return ReplaceArgument(site.node, written, "need_weights", "False")
    return None


class MhaNeedWeightsFix(Codemod):
    rule = "TC314"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
