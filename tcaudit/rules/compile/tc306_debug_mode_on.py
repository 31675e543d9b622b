"""TC306 debug-mode-on: anomaly detection, an always-on profiler, NVTX emission, gradcheck or
``CUDA_LAUNCH_BLOCKING=1`` left on around training.

Fix (safe): remove ``torch.autograd.set_detect_anomaly(True)`` and the ``CUDA_LAUNCH_BLOCKING=1``
setting, and unwrap ``with torch.autograd.detect_anomaly():`` / ``emit_nvtx()`` / ``emit_itt()``
(the body stays). A profiler (whose handle the body often uses) and gradcheck get no fix: the message
says what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.expressions import literal
from tcaudit.script.facts import Frame, ScriptFacts, Statement
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, keyword

SET_ANOMALY = frozenset(
    {"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly", "torch.set_anomaly_enabled"}
)
ANOMALY_CONTEXT = frozenset({"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"})
PROFILERS = frozenset(
    {
        "torch.profiler.profile",
        "torch.profiler.profiler.profile",
        "torch.autograd.profiler.profile",
        "torch.autograd.profiler_legacy.profile",
        "torch.autograd.profiler.emit_nvtx",
        "torch.autograd.profiler.emit_itt",
    }
)
GRADCHECK = frozenset(
    {"torch.autograd.gradcheck", "torch.autograd.gradgradcheck", "torch.autograd.gradcheck.gradcheck",
     "torch.autograd.gradcheck.gradgradcheck"}
)
ENVIRON = ("os.environ",)
# A function named like a debugging or testing facility runs its debug aid on purpose.
DEBUG_FUNCTION = re.compile(r"debug|check|anomal|diagnos|profil|trace|verify|^_*test", re.IGNORECASE)


class DebugModeOn(ScriptRule):
    id = "TC306"
    triggers = (r"anomaly|profile|nvtx|emit_itt|gradcheck|CUDA_LAUNCH_BLOCKING",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.trains:
            return
        yield from self._anomaly_calls(facts, pipeline)
        yield from self._debug_contexts(facts, pipeline)
        yield from self._gradchecks(facts, pipeline)
        yield from self._launch_blocking(facts, pipeline)

    @staticmethod
    def _deliberate(pipeline: PipelineFacts, ctx: Frame) -> bool:
        """Behind a flag, in eval code, or inside a debugging/testing function."""
        if pipeline.facts.in_eval(ctx) or pipeline.is_flag_guarded(ctx):
            return True
        return any(f.kind == "def" and DEBUG_FUNCTION.search(f.node.name.value) for f in ctx.chain())  # type: ignore[attr-defined]

    def _anomaly_calls(self, facts: ScriptFacts, pipeline: PipelineFacts) -> Iterator[Finding]:
        for call in facts.calls:
            if call.qualname not in SET_ANOMALY:
                continue
            if literal(call.arg("mode", 0)) is not True:
                continue  # False, or a flag (set_detect_anomaly(args.debug)): deliberate
            if self._deliberate(pipeline, call.ctx):
                continue
            if "lightning" in facts.frameworks and call.ctx.class_def is None:
                # Trainer.fit runs its loop inside set_detect_anomaly(trainer's detect_anomaly, False by
                # default): the global switch never reaches training_step (checked on an H200).
                message = "anomaly detection set here is off in Lightning's fit: use `Trainer(detect_anomaly=True)`"
                explanation = ("Lightning's Trainer wraps fit in `torch.autograd.set_detect_anomaly(detect_anomaly)`, "
                               "False by default, so this call costs nothing and checks nothing while training.")
                severity = Severity.INFO
            else:
                message = "autograd anomaly detection is on for every step; enable it only behind a debug flag"
                explanation = "Each backward op records a traceback and checks its outputs for NaN, several times slower."
                severity = None
            yield self.finding(
                facts,
                call.node,
                message,
                severity=severity,
                explanation=explanation,
                fix=self.planned_fix(
                    FixClass.SAFE, "remove the call", lambda call=call: _removal(facts, call.statement, call.node)
                ),
            )

    def _debug_contexts(self, facts: ScriptFacts, pipeline: PipelineFacts) -> Iterator[Finding]:
        for node, ctx in facts.withs:
            for item in node.items:
                call = self._unconditional_call(facts, pipeline, item.item)
                if call is None:
                    continue
                qual = facts.qualname(call.func) or ""
                if qual in ANOMALY_CONTEXT:
                    what = "autograd anomaly detection wraps training"
                    why = "Every backward op records a traceback and checks for NaN."
                elif qual in PROFILERS:
                    if keyword(call, "schedule") is not None:
                        continue  # profiles a window of steps, the intended use
                    enabled = keyword(call, "enabled")
                    if enabled is not None and literal(enabled.value) is not True:
                        continue  # enabled=args.profile: deliberate
                    if qual.endswith(("emit_nvtx", "emit_itt")):
                        what = f"`{qual.split('.')[-1]}` wraps training"
                        why = "Every op goes through the autograd profiler's range annotations."
                    else:
                        what = "a profiler without `schedule=` records every op of every training step"
                        why = ""
                else:
                    continue
                if self._deliberate(pipeline, ctx) or not pipeline.body_trains(node):
                    continue
                fix = None  # a profiler's handle (``as prof``) is often used in the body and after it
                if qual not in PROFILERS or qual.endswith(("emit_nvtx", "emit_itt")):
                    fix = self.planned_fix(
                        FixClass.SAFE, "unwrap the block", lambda node=node, item=item: _unwrap(facts, node, item)
                    )
                yield self.finding(
                    facts,
                    item.item,
                    f"{what}; keep it behind a debug flag",
                    explanation=(f"{why} " if why else "")
                    + "Keep it behind a debug flag (a profiler: `schedule=torch.profiler.schedule(...)` over a few steps).",
                    fix=fix,
                )

    @staticmethod
    def _unconditional_call(facts: ScriptFacts, pipeline: PipelineFacts, expr: cst.BaseExpression) -> cst.Call | None:
        """The debug call a ``with`` item stands for, unless a conditional expression chooses it
        (``detect_anomaly() if args.debug else nullcontext()``) or it is bound behind a flag."""
        if isinstance(expr, cst.Call):
            return expr
        dotted = full_name(expr)
        bindings = facts.bindings_of(dotted) if dotted else []
        if not bindings or any(pipeline.is_flag_guarded(b.ctx) for b in bindings):
            return None
        values = facts.binding_values(expr)
        if any(isinstance(v, (cst.IfExp, cst.BooleanOperation)) for v in values):
            return None
        calls = [v for v in values if isinstance(v, cst.Call)]
        return calls[0] if len(calls) == 1 else None

    def _gradchecks(self, facts: ScriptFacts, pipeline: PipelineFacts) -> Iterator[Finding]:
        for call in facts.calls:
            if call.qualname not in GRADCHECK or self._deliberate(pipeline, call.ctx):
                continue
            loop = call.ctx.nearest("loop")
            function = call.ctx.function
            in_training = (loop is not None and pipeline.body_trains(loop.node)) or (
                function is not None and function in pipeline.step_functions
            )
            if not in_training:
                continue
            yield self.finding(
                facts,
                call.node,
                f"`{call.qualname.split('.')[-1]}` runs inside the training loop; run it once in a test, not every step",
                explanation="It evaluates the function once per input element in float64.",
                fix=None,  # where the check belongs (a test) is the user's decision
            )

    def _launch_blocking(self, facts: ScriptFacts, pipeline: PipelineFacts) -> Iterator[Finding]:
        for binding in facts.bindings:
            if (facts.resolve(binding.target) or binding.target) not in ENVIRON:
                continue
            statement = binding.statement.node if binding.statement else None
            if statement is None or "CUDA_LAUNCH_BLOCKING" not in facts.code(statement):
                continue
            if str(literal(binding.value)) != "1" or self._deliberate(pipeline, binding.ctx):
                continue
            yield self._blocking_finding(facts, statement, binding.statement, binding.value)
        for call in facts.calls:
            if call.method != "setdefault" or (facts.resolve(call.receiver_name) or call.receiver_name) not in ENVIRON:
                continue
            args = call.node.args
            if len(args) == 2 and literal(args[0].value) == "CUDA_LAUNCH_BLOCKING" and str(literal(args[1].value)) == "1":
                if not self._deliberate(pipeline, call.ctx):
                    yield self._blocking_finding(facts, call.node, call.statement, call.node)

    def _blocking_finding(
        self, facts: ScriptFacts, node: cst.CSTNode, statement: Statement | None, value: cst.BaseExpression
    ) -> Finding:
        return self.finding(
            facts,
            node,
            "`CUDA_LAUNCH_BLOCKING=1` makes every kernel launch wait for the GPU; use it only to locate a CUDA error",
            explanation="Every kernel launch waits for the GPU to finish: the host can no longer run ahead.",
            fix=self.planned_fix(FixClass.SAFE, "remove the setting", lambda: _removal(facts, statement, value)),
        )


# -- the plans ----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RemoveStatement(FixPlan):
    kind = "remove-statement"
    statement: cst.SimpleStatementLine
    line: int


@dataclass(frozen=True, eq=False)
class UnwrapWith(FixPlan):
    kind = "unwrap-with"
    node: cst.With
    line: int


def _removal(facts: ScriptFacts, statement: Statement | None, value: cst.BaseExpression) -> RemoveStatement:
    """Remove the statement whose only work is ``value`` (an expression statement or one assignment)."""
    line = statement.node if statement is not None else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        raise DeclineFix("the setting shares its line with other statements; remove it by hand")
    small = line.body[0]
    if not (isinstance(small, (cst.Expr, cst.Assign)) and small.value is value):
        raise DeclineFix("the setting is part of a larger statement; remove it by hand")
    return RemoveStatement(line, facts.line_of(line))


def _unwrap(facts: ScriptFacts, node: cst.With, item: cst.WithItem) -> UnwrapWith:
    if len(node.items) != 1 or item.asname is not None or node.asynchronous is not None:
        raise DeclineFix("the `with` holds other context managers or names the debug context; edit it by hand")
    if not isinstance(item.item, cst.Call):
        raise DeclineFix("the debug context is bound to a name before the `with`; edit it by hand")
    if not isinstance(node.body, cst.IndentedBlock):
        raise DeclineFix("the `with` body is on its line; split the line first")
    return UnwrapWith(node, facts.line_of(node))


# -- the fix ------------------------------------------------------------------------------------------


class DebugModeOffFix(Codemod):
    rule = "TC306"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _DebugEditor()
        for finding in findings:
            plan = finding.fix.plan
            if isinstance(plan, UnwrapWith):
                editor.unwrap.add(id(plan.node))
            else:
                editor.remove.add(id(plan.statement))
        return module.visit(editor)


class _DebugEditor(cst.CSTTransformer):
    """Removes statements and unwraps ``with`` blocks found by identity, keeping the blank lines and
    comments above them; a block left empty gets ``pass``."""

    def __init__(self) -> None:
        super().__init__()
        self.remove: set[int] = set()
        self.unwrap: set[int] = set()

    def _rebuild(self, original_body, updated_body) -> list:
        out: list = []
        carried: list[cst.EmptyLine] = []
        for original, updated in zip(original_body, updated_body):
            if id(original) in self.remove:
                carried.extend(updated.leading_lines)
                continue
            produced = list(updated.body.body) if id(original) in self.unwrap else [updated]
            lead = [*carried, *(updated.leading_lines if id(original) in self.unwrap else [])]
            if lead:
                produced[0] = produced[0].with_changes(leading_lines=[*lead, *produced[0].leading_lines])
                carried = []
            out.extend(produced)
        return out

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._rebuild(original_node.body, updated_node.body))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rebuild(original_node.body, updated_node.body)
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])
