"""TC602 zero-grad-not-none: ``zero_grad(set_to_none=False)`` writes zeros into every gradient each step."""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code, literal_value
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

# Code that reads or updates .grad in place after zero_grad, expecting a tensor: with None gradients
# (parameters that got no gradient this step) it raises AttributeError/TypeError.
_READS_GRAD = re.compile(r"\.grad\.(?:data|add_|copy_|mul_|zero_|sub_|div_|clamp_|norm|sum|abs)|\.grad\s*[+\-*/]=|\.grad\[")


class ZeroGradNotNone(ScriptRule):
    id = "TC602"
    triggers = (r"set_to_none\s*=\s*False|zero_grad\(\s*False",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        for call in facts.method_calls("zero_grad"):
            value = call.arg("set_to_none", 0)
            if value is None or literal_value(value) is not False or facts.in_eval(call.ctx) or in_test_code(call.ctx):
                continue
            anchor = {"kind": "replace-argument", "line": facts.line_of(value), "old": "False", "new": "True"}
            grad_use = _READS_GRAD.search(info.text)
            if grad_use:
                fix = Fix(
                    FixClass.SAFE,
                    "drop set_to_none=False",
                    available=False,
                    reason=f"the script uses .grad in place (`{grad_use.group(0)}`); with set_to_none=True a "
                    "parameter without a gradient this step has grad None",
                    anchor=anchor,
                )
            else:
                fix = Fix(FixClass.SAFE, "drop set_to_none=False (None is the default since PyTorch 2.0)", anchor=anchor)
            yield self.finding(
                facts,
                value,
                f"`{call.name}(set_to_none=False)` launches a kernel per gradient to write zeros and makes the "
                "next backward accumulate into them; set_to_none=True (the default) skips both",
                fix=fix,
            )
