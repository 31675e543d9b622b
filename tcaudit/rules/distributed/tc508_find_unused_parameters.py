"""TC508 find-unused-parameters: ``DistributedDataParallel(..., find_unused_parameters=True)`` where
every parameter gets a gradient.

With the flag, DDP walks the autograd graph from the outputs after every forward to find parameters
that will get no gradient, and marks them ready at once. A model whose every parameter is used pays
that traversal each step for nothing (and DDP then also cannot overlap as well). Whether every
parameter is used is a fact of the run, not of the text: ``tcaudit verify --health`` records the
parameters that never received a gradient (tcaudit/runtime_facts.py reads that record for the same
script text).

Fix (safe, only with that evidence): remove the keyword. Without a verify run of this very text the
finding is `info` and the fix is declined with the command that provides the evidence; where the run
saw a parameter without gradient, the flag is needed and nothing is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit import runtime_facts
from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import exclusive
from tcaudit.source.syntax import keyword

KEYWORD = "find_unused_parameters"


@dataclass(frozen=True, eq=False)
class RemoveKeyword(FixPlan):
    kind = "remove-keyword"
    call: cst.Call
    argument: cst.Arg
    keyword: str
    evidence: str  # the verify results that showed every parameter getting a gradient


class FindUnusedParameters(ScriptRule):
    id = "TC508"
    triggers = (r"find_unused_parameters",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        measured = None
        measured_looked_up = False
        for wrap in info.wraps_of("ddp"):
            if in_test_code(wrap.call.ctx):
                continue
            argument = keyword(wrap.call.node, KEYWORD)
            if argument is None or not (isinstance(argument.value, cst.Name) and argument.value.value == "True"):
                continue
            if not measured_looked_up:
                measured = runtime_facts.measured_run(facts.source.path, facts.source.text, context.settings.root)
                measured_looked_up = True
            if measured is not None and measured.unused_parameters:
                continue  # the run saw parameters without a gradient: the flag is needed
            # Another wrap without the flag on the other arm of an ``if`` (``if args.freeze_backbone:``):
            # the author needs it on this path only, and one measured run may not have taken it.
            per_path = any(
                exclusive(wrap.call.ctx, other.call.ctx) for other in info.wraps_of("ddp") if other is not wrap
            )
            yield self._finding(facts, wrap.call.node, argument, measured, per_path)

    def _finding(self, facts, call: cst.Call, argument: cst.Arg, measured, per_path: bool = False) -> Finding:
        evidence = None
        if measured is not None and measured.unused_parameters == ():
            evidence = (f"`tcaudit verify --health` ({measured.results}) saw every parameter get a gradient "
                        f"in each of {measured.rounds} round(s) of {measured.steps} steps")

        def plan() -> RemoveKeyword:
            if per_path:
                raise DeclineFix(
                    f"the other arm of the `if` wraps the model without `{KEYWORD}`: the flag is chosen per "
                    "path, and a measured run shows only the path it took"
                )
            if evidence is None:
                raise DeclineFix(
                    "whether every parameter gets a gradient is a fact of the run: `tcaudit verify "
                    "<script> --health` records it, and then this fix removes the flag"
                )
            return RemoveKeyword(call, argument, KEYWORD, evidence)

        why = (f"`{KEYWORD}=True` makes DDP traverse the autograd graph after every forward; it is only "
               "needed when some parameter gets no gradient in a step")
        if evidence is None:
            message = f"`{KEYWORD}=True` makes DDP traverse the autograd graph after every forward"
            severity = Severity.INFO
        else:
            message = f"`{KEYWORD}=True` costs a graph traversal every step, and no parameter needs it: remove it"
            why += f"; {evidence}"
            severity = None
        return self.finding(
            facts, argument, message, severity=severity, explanation=why + ".",
            fix=self.planned_fix(FixClass.SAFE, f"remove {KEYWORD}=True", plan),
        )


class FindUnusedParametersFix(Codemod):
    rule = "TC508"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[RemoveKeyword] = [f.fix.plan for f in findings]
        return module.visit(_DropArgument({id(p.call): p.argument for p in plans}))


class _DropArgument(cst.CSTTransformer):
    def __init__(self, targets: dict[int, cst.Arg]) -> None:
        super().__init__()
        self.targets = targets

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        argument = self.targets.get(id(original_node))
        if argument is None:
            return updated_node
        index = next(i for i, a in enumerate(original_node.args) if a is argument)
        args = list(updated_node.args)
        del args[index]
        if args and index == len(args):  # removed the last one: the new last keeps the old last's comma
            args[-1] = args[-1].with_changes(comma=updated_node.args[index].comma)
        return updated_node.with_changes(args=args)
