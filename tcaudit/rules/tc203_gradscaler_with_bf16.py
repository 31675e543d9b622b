"""TC203 gradscaler-with-bf16: a GradScaler beside bf16 autocast scales for nothing."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import BF16, amp_facts
from tcaudit.script.facts import GRADSCALER_SUFFIXES, ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
from libcst.helpers import get_full_name_for_node
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor
from tcaudit.rules.base import Codemod


class GradScalerWithBf16(ScriptRule):
    id = "TC203"
    triggers = (r"Scaler",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        amp = amp_facts(facts)
        # Every training autocast must be bf16 for sure; a dtype chosen at run time may be fp16.
        if not amp.training_autocast_sites or amp.autocast_dtypes != frozenset({BF16}):
            return
        if any(c.method in ("half",) for c in amp.half_model_casts):
            return
        for call in facts.calls:
            qual = call.qualname or call.name or ""
            if not qual.endswith(GRADSCALER_SUFFIXES):
                continue
            enabled = call.arg("enabled")
            if enabled is not None and not (isinstance(enabled, cst.Name) and enabled.value == "True"):
                continue  # ``enabled=(dtype == torch.float16)`` or ``enabled=False``: deliberate
            yield self.finding(
                facts,
                call.node,
                "GradScaler with bf16 autocast: bf16 has fp32's exponent range, so loss scaling only "
                "adds a scale, an unscale and an inf check to every step; remove the scaler",
                fix=Fix(
                    FixClass.SAFE,
                    "remove the GradScaler and call backward/step directly",
                    anchor={"kind": "remove-scaler", "line": facts.line_of(call.node)},
                ),
            )


# -- the fix ------------------------------------------------------------------------------------

_SCALER_METHODS = frozenset({"scale", "step", "update", "unscale_"})


class _Unscale(StatementEditor):
    def __init__(self, scaler: str) -> None:
        super().__init__()
        self.scaler = scaler

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if not isinstance(func, cst.Attribute) or get_full_name_for_node(func.value) != self.scaler:
            return updated_node
        if func.attr.value == "scale" and len(updated_node.args) == 1:
            return updated_node.args[0].value  # scaler.scale(loss) → loss
        if func.attr.value == "step" and updated_node.args:
            optimizer = updated_node.args[0].value
            rest = list(updated_node.args[1:])
            return cst.Call(func=cst.Attribute(value=optimizer, attr=cst.Name("step")), args=rest)
        return updated_node


class GradScalerWithBf16Fix(Codemod):
    rule = "TC203"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        lines = {f.fix.anchor["line"] for f in findings}
        result = module
        for binding in facts.bindings:
            if binding.statement is None or facts.line_of(binding.statement.node) not in lines:
                continue
            if not isinstance(binding.value, cst.Call):
                raise DeclineFix("the scaler is created conditionally; remove it by hand")
            scaler = binding.target
            uses = [c for c in facts.calls if c.receiver_name == scaler]
            other = sorted({c.method for c in uses} - _SCALER_METHODS)
            if other:
                raise DeclineFix(f"the scaler is also used for {', '.join(other)} (e.g. a checkpoint)")
            if "." in scaler:  # self.scaler: count attribute chains that start with it
                mentions = [r for _, r, _ in facts._raw_references if r == scaler or r.startswith(scaler + ".")]
            else:  # every use of a plain name shows up as one Name node
                mentions = [r for _, r, _ in facts._raw_references if r == scaler]
            if len(mentions) > len(uses) + 1:
                raise DeclineFix("the scaler is passed around or tested; remove it by hand")
            editor = _Unscale(scaler)
            editor.remove(binding.statement.node)
            for call in uses:
                if call.method in ("update", "unscale_"):
                    statement = call.statement.node if call.statement else None
                    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                        raise DeclineFix(f"`{scaler}.{call.method}()` shares its line with other code")
                    editor.remove(statement)
            result = result.visit(editor)
            break
        return result
