"""TC403 fix: ``non_blocking=True`` on the copy of a DataLoader batch to the GPU.

The rule only reports default-collated tensor batches (no ``collate_fn``: a NestedTensor or a
BatchEncoding may not take ``non_blocking``) copied with ``.cuda()`` or ``.to(device)`` in a training
loop; the copy is queued on the current stream, so every later use of the tensor still sees it.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, parse_expression
from tcaudit.fix.edits import CallEditor, add_keyword, call_at, keyword


class BlockingH2DCopyFix(Codemod):
    rule = "TC403"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = CallEditor()
        for finding in findings:
            call = call_at(facts, finding)
            if call is None:
                raise DeclineFix("the copy moved; run fix again")
            if keyword(call.node, "non_blocking") is not None or any(a.star for a in call.node.args):
                raise DeclineFix("the call may already pass non_blocking=")
            editor.rewrite_call(call.node, lambda node: add_keyword(node, "non_blocking", parse_expression("True", module)))
        return module.visit(editor)
