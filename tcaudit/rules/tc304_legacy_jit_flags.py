"""TC304 legacy-jit-flags: private TorchScript executor flags set in an eager training script."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor
from tcaudit.rules.base import Codemod

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


class LegacyJitFlags(ScriptRule):
    id = "TC304"
    triggers = (r"_jit_|graph_executor_optimize",)  # and a training step, checked below

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not (facts.training_steps or facts.optimizer_steps):
            return  # a training-script rule: library code that implements the fusers is not its target
        if any((r.qualname or "").startswith("torch.jit.") for r in facts.references):
            return  # the script does use TorchScript: the flags are deliberate
        for call in facts.calls:
            qual = call.qualname or ""
            if qual not in JIT_FLAGS:
                continue
            statement = call.statement.node if call.statement else call.node
            yield self.finding(
                facts,
                call.node,
                f"`{qual.removeprefix('torch._C.')}` is a private TorchScript executor flag: it does nothing "
                "for an eager or torch.compile training step and may vanish in any release; remove it",
                fix=Fix(FixClass.SAFE, "delete the call", anchor={"kind": "delete-statement",
                                                                  "line": facts.line_of(statement)}),
            )


# -- the fix ------------------------------------------------------------------------------------

class LegacyJitFlagsFix(Codemod):
    rule = "TC304"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        lines = {(f.location.line, f.location.column) for f in findings}
        editor = StatementEditor()
        for call in facts.calls:
            pos = facts.position(call.node)
            if (pos.start.line, pos.start.column + 1) not in lines or call.statement is None:
                continue
            statement = call.statement.node
            if not isinstance(statement, cst.SimpleStatementLine):
                raise DeclineFix("the flag call is part of a larger statement")
            kept = [s for s in statement.body if not (isinstance(s, cst.Expr) and s.value is call.node)]
            if len(kept) == len(statement.body):
                raise DeclineFix("the flag call's result is used; remove it by hand")
            if kept:
                kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                editor.replace_with(statement, [statement.with_changes(body=kept)])
            else:
                editor.remove(statement)
        return module.visit(editor)
