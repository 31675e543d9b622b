"""TC208 autocast-unsafe-op: ops that raise or misbehave under autocast."""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import BF16, amp_facts
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

BCE_FUNCTIONS = frozenset({"torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy"})
BCE_MODULES = frozenset({"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})
SPARSE_MM = frozenset({"torch.sparse.mm", "torch.sparse.addmm", "torch.sspaddmm", "torch.sparse.sampled_addmm"})


class AutocastUnsafeOp(ScriptRule):
    id = "TC208"
    triggers = (r"binary_cross_entropy|BCELoss|sparse",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        amp = amp_facts(facts)
        if not amp.autocast_sites and not facts.autocast_withs:
            return
        under = self._functions_called_under_autocast(facts)
        for call in facts.calls:
            if not (facts.in_autocast(call.ctx) or call.ctx.function in under):
                continue
            kind = self._unsafe_kind(facts, call)
            if kind == "bce":
                yield self.finding(
                    facts,
                    call.node,
                    "binary cross-entropy on probabilities raises a RuntimeError under autocast (fp16 and "
                    "bf16); use BCEWithLogitsLoss on the logits (drop the sigmoid), or compute this loss "
                    "outside autocast on .float() inputs",
                    fix=Fix(
                        FixClass.NUMERICS,
                        "compute the loss outside autocast in float32, or BCEWithLogits when the sigmoid "
                        "is the model's last op",
                        anchor={"kind": "bce-outside-autocast", "line": facts.line_of(call.node)},
                    ),
                )
            elif kind == "sparse" and amp.autocast_dtypes != frozenset({BF16}):
                yield self.finding(
                    facts,
                    call.node,
                    "sparse matrix multiply under fp16 autocast: there is no fp16 sparse kernel; run it "
                    "outside autocast on float32 inputs",
                    fix=Fix(FixClass.NUMERICS, "move the sparse op out of autocast", available=False,
                            reason="which inputs are sparse is not visible statically"),
                )

    @staticmethod
    def _unsafe_kind(facts: ScriptFacts, call: CallSite) -> str | None:
        qual = call.qualname or ""
        if qual in BCE_FUNCTIONS:
            return "bce"
        if qual in SPARSE_MM:
            return "sparse"
        func = call.node.func
        if isinstance(func, cst.Call) and facts.qualname(func.func) in BCE_MODULES:
            return "bce"  # nn.BCELoss()(p, y)
        if isinstance(func, (cst.Name, cst.Attribute)):
            name = get_full_name_for_node(func)
            if name and facts.bindings_of(name):
                for value in facts.binding_values(func):
                    if isinstance(value, cst.Call) and facts.qualname(value.func) in BCE_MODULES:
                        return "bce"
        return None

    @staticmethod
    def _functions_called_under_autocast(facts: ScriptFacts) -> set:
        out = set()
        for call in facts.calls:
            if facts.in_autocast(call.ctx):
                name = (call.name or "").removeprefix("self.")
                if name and "." not in name:
                    out.update(facts.functions_by_name.get(name, []))
        return out
