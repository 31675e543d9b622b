"""TC515 checkpoint-saved-by-every-rank: a DDP script whose ``torch.save(..., path)`` runs on every rank
with one path for all of them.

Every rank writes the same file at the same moment: N times the I/O for one checkpoint, and on a shared
filesystem writes that interleave can leave a truncated or corrupt file that a resume then fails to
load. Fix (safe): the save under ``if dist.get_rank() == 0:``. Declined where the file also loads a
checkpoint (the other ranks would need a barrier so none reads the file while rank 0 writes it), or the
save is not a statement of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_statement, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import RANK_TEST, distributed_facts, in_test_code, rank_branch
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.triggers import all_of


@dataclass(frozen=True, eq=False)
class GuardSave(FixPlan):
    kind = "rank-zero-save"
    statement: cst.SimpleStatementLine
    line: int
    test: str  # the condition written


def _rank_guarded(facts: ScriptFacts, call: CallSite, depth: int = 0) -> bool:
    """Under a rank test, after an early ``if rank != 0: return`` of its function, or in a function every
    call of which (in this file) is; a function with no call here counts as guarded (unknown)."""
    if rank_branch(facts, call.ctx) is not None:
        return True
    fn = call.ctx.function
    if fn is None:
        return False
    body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ()
    for statement in body:
        if statement is (call.statement.node if call.statement else None):
            break
        if isinstance(statement, cst.If) and RANK_TEST.search(facts.code(statement.test)) and \
                "return" in facts.code(statement.body):
            return True
    callers = callers_of(facts, fn, how="self", outside=True)
    if not callers:
        return True
    return depth < 2 and all(_rank_guarded(facts, c, depth + 1) for c in callers)


class CheckpointSavedByEveryRank(ScriptRule):
    id = "TC515"
    triggers = (all_of(r"torch\.save|\bsave\(", r"DistributedDataParallel", r"init_process_group"),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if facts.frameworks or not info.is_ddp_script or not info.init_process_group_calls:
            return
        loads = any((c.qualname or "") == "torch.load" for c in facts.calls)
        for call in facts.calls:
            if (call.qualname or "") != "torch.save" or in_test_code(call.ctx):
                continue
            path = call.arg("f", 1)
            if path is None or re.search(r"rank", facts.code(path), re.IGNORECASE):
                continue  # a path per rank
            if any(re.search(r"rank", facts.code(b.value), re.IGNORECASE)
                   for b in facts.bindings_of(facts.code(path)) if isinstance(path, (cst.Name, cst.Attribute))):
                continue
            if _rank_guarded(facts, call):
                continue

            def plan(call=call) -> GuardSave:
                statement = call.statement.node if call.statement is not None else None
                if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or not (
                        isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call.node):
                    raise DeclineFix("the save is part of a larger statement; put it under `if dist.get_rank() == "
                                     "0:` by hand")
                if any(frame.kind == "with" for frame in call.ctx.chain() if frame.node is not None) and \
                        isinstance(path, cst.Name):
                    raise DeclineFix("the save writes to a file object every rank opens; open and save on rank 0 "
                                     "only, by hand")
                if loads:
                    raise DeclineFix("the script also loads checkpoints: with the save on rank 0 only, the other "
                                     "ranks need a `dist.barrier()` after it so none reads the file while rank 0 "
                                     "writes it; add both by hand")
                dist = next((i.local for i in facts.imports if i.qualname == "torch.distributed"
                             and i.ctx is facts.module_frame), None)
                if dist is None:
                    torch = torch_import_name(facts)
                    if torch is None:
                        raise DeclineFix("the file does not import torch or torch.distributed by a name to test the "
                                         "rank with")
                    dist = f"{torch}.distributed"
                return GuardSave(statement, facts.line_of(call.node), f"{dist}.get_rank() == 0")

            yield self.finding(
                facts,
                call.node,
                "every rank saves this checkpoint to the same path",
                explanation="Each DDP process runs this `torch.save` with one path for all of them: N writes of the "
                "same file at once, which on a shared filesystem can interleave into a corrupt checkpoint. The "
                "models are identical on every rank after each step: rank 0 alone saves it.",
                fix=self.planned_fix(FixClass.SAFE, "save on rank 0 only (`if dist.get_rank() == 0:`)", plan),
            )


class GuardSaveFix(Codemod):
    rule = "TC515"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        for finding in findings:
            plan: GuardSave = finding.fix.plan
            statement = plan.statement
            guarded = parse_statement(f"if {plan.test}:\n    pass\n", module)
            assert isinstance(guarded, cst.If)
            guarded = guarded.with_changes(
                leading_lines=statement.leading_lines,
                body=guarded.body.with_changes(body=[statement.with_changes(leading_lines=[])]),
            )
            editor.replace_with(statement, [guarded])
        return editor.apply(module)
