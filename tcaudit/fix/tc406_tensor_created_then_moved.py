"""TC406 fix: ``torch.zeros(n).cuda()`` → ``torch.zeros(n, device="cuda")``; ``.to(device)`` →
``device=device``.

Only a plain move is folded into the factory: a ``.to`` that also changes the dtype or memory format
is left alone, and so is a factory with ``requires_grad=True`` (the moved tensor is a non-leaf, the one
created on the device a leaf: in-place writes to it would start to raise).
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext, parse_expression
from tcaudit.fix.edits import CallEditor, add_keyword, call_at, keyword

_MOVE_ARGUMENTS = {"cuda": ("device", "non_blocking"), "to": ("device", "non_blocking")}


class TensorCreatedThenMovedFix(Codemod):
    rule = "TC406"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = CallEditor()
        reasons: list[str] = []
        for finding in findings:
            call = call_at(facts, finding)
            factory = call.receiver if call is not None else None
            if call is None or not isinstance(factory, cst.Call):
                raise DeclineFix("the call moved; run fix again")
            reason = _why_not(call.node, factory, call.method or "")
            if reason is not None:
                reasons.append(reason)
                continue
            device = parse_expression(finding.fix.anchor["device"], module)

            def fold(node: cst.Call, device=device) -> cst.BaseExpression:
                inner = node.func.value  # type: ignore[attr-defined]
                return add_keyword(inner, "device", device).with_changes(lpar=node.lpar, rpar=node.rpar)

            editor.rewrite_call(call.node, fold)
        if not editor.calls:
            raise DeclineFix(reasons[0])
        return module.visit(editor)


def _why_not(move: cst.Call, factory: cst.Call, method: str) -> str | None:
    allowed = _MOVE_ARGUMENTS.get(method, ())
    positional = [a for a in move.args if a.keyword is None]
    if any(a.star for a in move.args) or len(positional) > 1:
        return f"`.{method}()` passes more than the device; fold it by hand"
    if any(a.keyword is not None and a.keyword.value not in allowed for a in move.args):
        return f"`.{method}()` also changes the dtype or layout; fold it by hand"
    requires_grad = keyword(factory, "requires_grad")
    if requires_grad is not None:
        return ("the tensor requires grad: created on the device it becomes a leaf, and in-place writes "
                "that work on the moved copy would raise")
    return None
