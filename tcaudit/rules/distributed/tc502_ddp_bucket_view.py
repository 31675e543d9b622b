"""TC502 ddp-bucket-view: ``DistributedDataParallel(...)`` without ``gradient_as_bucket_view=True``.

Fix (safe): pass ``gradient_as_bucket_view=True`` to the call. Declined when the script manipulates
``.grad`` in place (bucket views do not allow it) or when a ``*args`` or a long positional list may
already reach the keyword.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression
from tcaudit.rewrite.edits import CallEditor, add_keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code, passes_keyword
from tcaudit.script.facts import CallSite, ScriptFacts

KWARG = "gradient_as_bucket_view"

# Code that replaces or detaches a parameter's .grad in place: with bucket views the gradient is a view
# into DDP's communication bucket, and these break it (documented DDP caveat).
_GRAD_SURGERY = re.compile(r"\.grad\.detach_\(|\.grad\.requires_grad_\(|\.grad\s*=(?!=)")

# DistributedDataParallel(module, device_ids, output_device, dim, broadcast_buffers, [init_sync,]
# process_group, bucket_cap_mb, find_unused_parameters, check_reduction, gradient_as_bucket_view, ...):
# from this many positional arguments on, one of them may be gradient_as_bucket_view (PyTorch < 2.6
# has no init_sync, so it is the tenth there).
_POSITIONAL_LIMIT = 10


@dataclass(frozen=True, eq=False)
class AddKeyword(FixPlan):
    kind = "add-keyword"
    call: cst.Call  # the DistributedDataParallel(...) call
    line: int
    keyword: str
    value: str


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

            def plan(call=call, surgery=surgery) -> AddKeyword:
                return _plan(facts, call, surgery)

            yield self.finding(
                facts,
                call.node,
                f"DistributedDataParallel without `{KWARG}=True` copies every gradient each step",
                explanation="Each gradient is copied into the communication buckets and back, with both copies "
                "kept in memory; bucket views make the gradients alias the buckets.",
                fix=self.planned_fix(FixClass.SAFE, f"pass {KWARG}=True", plan),
            )


def _plan(facts: ScriptFacts, call: CallSite, surgery: re.Match | None) -> AddKeyword:
    if surgery:
        raise DeclineFix(
            f"the script manipulates .grad in place (`{surgery.group(0).strip()}`), which bucket views do not allow"
        )
    node = call.node
    if any(a.star == "*" for a in node.args):
        raise DeclineFix(f"the call passes *args, which may already reach {KWARG}")
    if sum(1 for a in node.args if a.keyword is None and not a.star) >= _POSITIONAL_LIMIT:
        raise DeclineFix(f"the call passes so many positional arguments that one may be {KWARG}")
    return AddKeyword(node, facts.line_of(node), KWARG, "True")


class DdpBucketViewFix(Codemod):
    rule = "TC502"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: AddKeyword = finding.fix.plan
            value = parse_expression(plan.value, module)
            editor.rewrite_call(plan.call, lambda n, v=value: add_keyword(n, KWARG, v))
        return editor.apply(module)
