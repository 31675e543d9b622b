"""TC304 legacy-jit-flags: private TorchScript executor flags set in an eager training script.

Detects calls such as ``torch._C._jit_set_profiling_executor(False)`` in a training script that does
not use TorchScript. Fix (safe): delete the call's statement (the other statements of a
``a(); b()`` line stay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, ScriptFacts

JIT_FLAGS = (
    "torch._C._jit_set_profiling_executor",
    "torch._C._jit_set_profiling_mode",
    "torch._C._jit_override_can_fuse_on_cpu",
    "torch._C._jit_override_can_fuse_on_gpu",
    "torch._C._jit_set_texpr_fuser_enabled",
    "torch._C._jit_set_nvfuser_enabled",
    "torch._C._jit_set_bailout_depth",
    "torch._C._get_graph_executor_optimize",
    "torch._C._set_graph_executor_optimize",
)


@dataclass(frozen=True, eq=False)
class DeleteFlagCall(FixPlan):
    kind = "delete-statement"
    statement: cst.SimpleStatementLine  # the line holding the call
    call: cst.Call
    line: int


def reported_flag_calls(facts: ScriptFacts) -> list[CallSite]:
    """The flag calls TC304 reports: in a training script that does not use TorchScript."""
    if not (facts.training_steps or facts.optimizer_steps):
        return []  # a training-script rule: library code that implements the fusers is not its target
    if any((r.qualname or "").startswith("torch.jit.") for r in facts.references):
        return []  # the script does use TorchScript: the flags are deliberate
    return [call for call in facts.calls if (call.qualname or "") in JIT_FLAGS]


def deletion_plan(facts: ScriptFacts, call: CallSite) -> DeleteFlagCall:
    """How TC304's fix deletes this flag call, or :class:`DeclineFix` when it cannot."""
    statement = call.statement.node if call.statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine):
        raise DeclineFix("the flag call is part of a larger statement")
    if not any(isinstance(s, cst.Expr) and s.value is call.node for s in statement.body):
        raise DeclineFix("the flag call's result is used; remove it by hand")
    if len(call.statement.block) == 1 and len(statement.body) == 1:
        raise DeclineFix("the flag call is the only statement of its block; remove the block by hand")
    return DeleteFlagCall(statement, call.node, facts.line_of(statement))


class LegacyJitFlags(ScriptRule):
    id = "TC304"
    triggers = (r"_jit_|graph_executor_optimize",)  # and a training step, checked below

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for call in reported_flag_calls(facts):
            qual = call.qualname or ""
            yield self.finding(
                facts,
                call.node,
                f"`{qual.removeprefix('torch._C.')}` is a private TorchScript executor flag; remove it",
                explanation="It does nothing for an eager or torch.compile training step and may vanish in any "
                "release.",
                fix=self.planned_fix(FixClass.SAFE, "delete the call", lambda call=call: deletion_plan(facts, call)),
            )


class LegacyJitFlagsFix(Codemod):
    rule = "TC304"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        by_statement: dict[int, tuple[cst.SimpleStatementLine, set[int]]] = {}
        for finding in findings:
            plan: DeleteFlagCall = finding.fix.plan
            by_statement.setdefault(id(plan.statement), (plan.statement, set()))[1].add(id(plan.call))
        editor = StatementEditor()
        for statement, calls in by_statement.values():
            kept = [s for s in statement.body if not (isinstance(s, cst.Expr) and id(s.value) in calls)]
            if kept:
                kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                editor.replace_with(statement, [statement.with_changes(body=kept)])
            else:
                editor.remove(statement)
        return editor.apply(module)
