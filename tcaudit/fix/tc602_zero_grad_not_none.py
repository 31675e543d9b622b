"""TC602 fix: drop ``set_to_none=False`` from ``zero_grad`` calls (``True`` is the default since
PyTorch 2.0 for optimizers and modules).

Where dropping would not give True, the argument is set to ``True`` instead: the file defines its own
``zero_grad`` (whose default may be False), or a comment sits inside the call's parentheses (removing
the argument would lose it). Scripts that read or update ``.grad`` in place are declined by the rule.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext
from tcaudit.fix.edits import CallEditor, replace_argument
from tcaudit.script.distributed import literal_value
from tcaudit.script.facts import CallSite, ScriptFacts


def _argument_at(facts: ScriptFacts, finding: Finding) -> tuple[CallSite, int] | None:
    loc = finding.location
    wanted = (loc.line, loc.column, loc.end_line, loc.end_column)
    for call in facts.method_calls("zero_grad"):
        for index, arg in enumerate(call.node.args):
            pos = facts.position(arg.value)
            if (pos.start.line, pos.start.column + 1, pos.end.line, pos.end.column + 1) == wanted:
                return call, index
    return None


def _drop_argument(call: cst.Call, index: int) -> cst.Call:
    """``f(a, x=1)`` → ``f(a)``; the last remaining argument takes over the dropped one's comma, so a
    trailing comma stays trailing and no comma is left dangling."""
    args = list(call.args)
    removed = args.pop(index)
    if not args:
        return call.with_changes(args=[], whitespace_before_args=cst.SimpleWhitespace(""))
    if index == len(args):  # the dropped argument was the last one
        args[-1] = args[-1].with_changes(comma=removed.comma, whitespace_after_arg=removed.whitespace_after_arg)
    return call.with_changes(args=args)


class ZeroGradNotNoneFix(Codemod):
    rule = "TC602"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        own_zero_grad = "zero_grad" in facts.functions_by_name
        editor = CallEditor()
        for finding in findings:
            found = _argument_at(facts, finding)
            if found is None:
                raise DeclineFix("the zero_grad call could not be located")
            call, index = found
            arg = call.node.args[index]
            if arg.star or literal_value(arg.value) is not False:
                raise DeclineFix("set_to_none is not a literal False")
            has_comment = any(isinstance(n, cst.Comment) for n in _walk(call.node))
            if own_zero_grad or has_comment or len(call.node.args) > 1:
                true = cst.Name("True")
                editor.rewrite_call(call.node, lambda node, i=index, v=true: replace_argument(node, i, v))
            else:
                editor.rewrite_call(call.node, lambda node, i=index: _drop_argument(node, i))
        return module.visit(editor)


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)
