"""TC602 zero-grad-not-none: ``zero_grad(set_to_none=False)`` writes zeros into every gradient each step.

Fix (safe): drop ``set_to_none=False`` (``True`` is the default since PyTorch 2.0), or write
``set_to_none=True`` where dropping it would change more than the argument (other arguments, a
comment inside the call, a ``zero_grad`` of the file's own); declined when the script uses ``.grad``
in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import CallEditor, replace_argument
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import DistributedFacts, distributed_facts, in_test_code, literal_value
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
            grad_use = _READS_GRAD.search(info.text)
            description = "drop set_to_none=False" if grad_use else "drop set_to_none=False (None is the default since PyTorch 2.0)"
            fix = self.planned_fix(
                FixClass.SAFE, description, lambda call=call, value=value: _argument_plan(facts, info, call, value)
            )
            yield self.finding(
                facts,
                value,
                f"`{call.name}(set_to_none=False)` launches a kernel per gradient to write zeros",
                explanation="It also makes the next backward accumulate into the zeros; set_to_none=True (the "
                "default) skips both.",
                fix=fix,
            )


@dataclass(frozen=True, eq=False)
class SetToNoneTrue(FixPlan):
    kind = "replace-argument"
    call: cst.Call  # the zero_grad call
    index: int  # of the set_to_none argument in the call's arguments
    drop: bool  # drop the argument; else write True
    line: int
    old: str = "False"
    new: str = "True"


def _argument_plan(facts: ScriptFacts, info: DistributedFacts, call: CallSite, value: cst.BaseExpression) -> SetToNoneTrue:
    grad_use = _READS_GRAD.search(info.text)
    if grad_use:
        raise DeclineFix(
            f"the script uses .grad in place (`{grad_use.group(0)}`); with set_to_none=True a "
            "parameter without a gradient this step has grad None"
        )
    index = next((i for i, arg in enumerate(call.node.args) if arg.value is value), None)
    if index is None or call.node.args[index].star:
        raise DeclineFix("set_to_none is not a literal False")
    own_zero_grad = "zero_grad" in facts.functions_by_name
    has_comment = any(isinstance(n, cst.Comment) for n in _walk(call.node))
    drop = not (own_zero_grad or has_comment or len(call.node.args) > 1)
    return SetToNoneTrue(call.node, index, drop, facts.line_of(value))


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


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)


# -- the fix ------------------------------------------------------------------------------------------


class ZeroGradNotNoneFix(Codemod):
    rule = "TC602"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: SetToNoneTrue = finding.fix.plan
            if plan.drop:
                editor.rewrite_call(plan.call, lambda node, i=plan.index: _drop_argument(node, i))
            else:
                editor.rewrite_call(plan.call, lambda node, i=plan.index: replace_argument(node, i, cst.Name("True")))
        return editor.apply(module)
