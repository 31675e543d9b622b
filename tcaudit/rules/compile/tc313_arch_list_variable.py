"""TC313 arch-list-variable: ``TORCH_CUDA_ARCH_LIST = "..."`` assigned as a Python variable.

PyTorch's extension builder (``torch.utils.cpp_extension``) reads ``TORCH_CUDA_ARCH_LIST`` from the
environment; a module-level variable of that name does nothing, and extensions are then built for
every architecture the build machine guesses (slow builds, or missing the GPU it runs on).

Fix (safe, a plain bug fixed): ``os.environ["TORCH_CUDA_ARCH_LIST"] = ...`` in its place. Declined
where the file also reads the variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_statement
from tcaudit.rewrite.edits import add_stdlib_import
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import ScriptFacts

NAME = "TORCH_CUDA_ARCH_LIST"


@dataclass(frozen=True, eq=False)
class SetEnvironment(FixPlan):
    kind = "set-environment"
    statement: cst.SimpleStatementLine
    code: str


class ArchListVariable(ScriptRule):
    id = "TC313"
    triggers = (NAME,)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        reads = [r for r in facts.references if r.dotted == NAME]
        for binding in facts.bindings_of(NAME):
            if binding.ctx is not facts.module_frame or binding.statement is None:
                continue
            statement = binding.statement.node
            value = binding.value

            def plan(statement=statement, value=value) -> SetEnvironment:
                if reads:
                    raise DeclineFix(f"the file reads `{NAME}` as a variable too; set the environment by hand")
                if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
                    raise DeclineFix("the assignment shares its line with other statements")
                return SetEnvironment(statement, f"os.environ[{NAME!r}] = {facts.code(value)}")

            yield self.finding(
                facts, statement,
                f"`{NAME}` assigned as a Python variable has no effect; set `os.environ[\"{NAME}\"]`",
                explanation="The extension builder reads it from the environment, never from a variable.",
                fix=self.planned_fix(FixClass.SAFE, f"set os.environ[{NAME!r}] instead", plan),
            )


class ArchListVariableFix(Codemod):
    rule = "TC313"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = StatementEditor()
        for finding in findings:
            plan: SetEnvironment = finding.fix.plan
            new = parse_statement(plan.code, module).with_changes(leading_lines=plan.statement.leading_lines)
            editor.replace_with(plan.statement, [new])
        return add_stdlib_import(editor.apply(module), "os")
