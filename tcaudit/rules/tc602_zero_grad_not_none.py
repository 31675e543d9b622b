"""TC602 zero-grad-not-none: ``zero_grad(set_to_none=False)`` writes zeros into every gradient each step."""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code, literal_value
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rules.base import Codemod
from tcaudit.rewrite.edits import CallEditor, replace_argument
from tcaudit.script.distributed import literal_value
from tcaudit.script.facts import CallSite, ScriptFacts

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


# -- the fix ------------------------------------------------------------------------------------

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
