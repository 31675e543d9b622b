"""TC502 ddp-bucket-view: ``DistributedDataParallel(...)`` without ``gradient_as_bucket_view=True``."""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code, passes_keyword
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

KWARG = "gradient_as_bucket_view"

# Code that replaces or detaches a parameter's .grad in place: with bucket views the gradient is a view
# into DDP's communication bucket, and these break it (documented DDP caveat).
_GRAD_SURGERY = re.compile(r"\.grad\.detach_\(|\.grad\.requires_grad_\(|\.grad\s*=(?!=)")


class DdpBucketView(ScriptRule):
    id = "TC502"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        for wrap in info.wraps_of("ddp"):
            call = wrap.call
            if in_test_code(call.ctx):
                continue
            if passes_keyword(facts, call, KWARG) is not False:
                continue  # set on purpose (to True or to False), or hidden in a **kwargs dict
            surgery = _GRAD_SURGERY.search(info.text)
            anchor = {"kind": "add-keyword", "line": facts.line_of(call.node), "keyword": KWARG, "value": "True"}
            if surgery:
                fix = Fix(
                    FixClass.SAFE,
                    f"pass {KWARG}=True",
                    available=False,
                    reason=f"the script manipulates .grad in place (`{surgery.group(0).strip()}`), which bucket "
                    "views do not allow",
                    anchor=anchor,
                )
            else:
                fix = Fix(FixClass.SAFE, f"pass {KWARG}=True", anchor=anchor)
            yield self.finding(
                facts,
                call.node,
                f"DistributedDataParallel without {KWARG}=True copies every gradient into its "
                "communication buckets and back each step and keeps both copies in memory; bucket views "
                "make the gradients alias the buckets",
                fix=fix,
            )
