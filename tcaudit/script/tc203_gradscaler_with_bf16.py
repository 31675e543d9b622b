"""TC203 gradscaler-with-bf16: a GradScaler beside bf16 autocast scales for nothing."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import BF16, amp_facts
from tcaudit.script.facts import GRADSCALER_SUFFIXES, ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule


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
