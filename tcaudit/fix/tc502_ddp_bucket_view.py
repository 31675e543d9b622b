"""TC502 fix: ``gradient_as_bucket_view=True`` on a ``DistributedDataParallel(...)`` call.

The rule only flags calls whose callee resolves to DDP by type (``from torch.nn import DataParallel as
DDP`` is a DataParallel, where the keyword would be a TypeError), that do not pass the keyword
already (an explicit ``False`` is respected, a ``**kwargs`` dict that may hold it is left alone), and
declines scripts that replace or detach ``.grad`` in place. Here we only add the keyword, keeping the
call's layout; a call whose positional arguments could already reach the parameter is declined.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, parse_expression
from tcaudit.fix.edits import CallEditor, add_keyword, call_at, keyword
from tcaudit.script.tc502_ddp_bucket_view import KWARG

# DistributedDataParallel(module, device_ids, output_device, dim, broadcast_buffers, [init_sync,]
# process_group, bucket_cap_mb, find_unused_parameters, check_reduction, gradient_as_bucket_view, ...):
# from this many positional arguments on, one of them may be gradient_as_bucket_view (PyTorch < 2.6
# has no init_sync, so it is the tenth there).
_POSITIONAL_LIMIT = 10


class DdpBucketViewFix(Codemod):
    rule = "TC502"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = CallEditor()
        for finding in findings:
            call = call_at(facts, finding)
            if call is None:
                raise DeclineFix("the DistributedDataParallel call could not be located")
            node = call.node
            if keyword(node, KWARG) is not None:
                raise DeclineFix(f"the call already passes {KWARG}=")
            if any(a.star == "*" for a in node.args):
                raise DeclineFix(f"the call passes *args, which may already reach {KWARG}")
            if sum(1 for a in node.args if a.keyword is None and not a.star) >= _POSITIONAL_LIMIT:
                raise DeclineFix(f"the call passes so many positional arguments that one may be {KWARG}")
            value = parse_expression(finding.fix.anchor.get("value", "True"), module)
            editor.rewrite_call(node, lambda n, v=value: add_keyword(n, KWARG, v))
        return module.visit(editor)
