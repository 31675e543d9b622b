"""TC605 empty-cache-in-loop: ``torch.cuda.empty_cache()`` on every training step.

``empty_cache`` synchronizes the device and hands the caching allocator's free blocks back to the
driver; the next step allocates the same blocks again with ``cudaMalloc``, which also synchronizes.
It never gives a running script more memory for itself. Under an interval guard (``if step % 1000 ==
0``) or in an ``except`` (an OOM retry) it is left alone: the question of where a place runs every
step is tcaudit/script/steps.py's.

Fix (safe): remove the statement; declined where the call is part of a larger statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.steps import runs_every_step

EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})


@dataclass(frozen=True, eq=False)
class RemoveStatement(FixPlan):
    kind = "remove-statement"
    statement: cst.SimpleStatementLine


class EmptyCacheInLoop(ScriptRule):
    id = "TC605"
    triggers = (r"empty_cache",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.step_loops:
            return
        for call in facts.calls_to(*EMPTY_CACHE):
            if in_test_code(call.ctx) or not runs_every_step(facts, call.ctx):
                continue
            yield self.finding(
                facts, call.node,
                f"`{call.name}()` runs on every training step: it synchronizes the GPU",
                explanation="It also frees cached blocks that the next step allocates again; remove it (or run it "
                "every few hundred steps).",
                fix=self.planned_fix(FixClass.SAFE, f"remove the `{call.name}()` statement",
                                     lambda call=call: self._plan(call)),
            )

    @staticmethod
    def _plan(call: CallSite) -> RemoveStatement:
        statement = call.statement.node if call.statement is not None else None
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and statement.body[0].value is call.node
        ):
            raise DeclineFix("the call is part of a larger statement; remove it by hand")
        return RemoveStatement(statement)


class EmptyCacheInLoopFix(Codemod):
    rule = "TC605"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        for finding in findings:
            plan: RemoveStatement = finding.fix.plan
            editor.remove(plan.statement)
        return editor.apply(module)
