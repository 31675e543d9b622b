"""TC212 double-optimizer-step: one optimizer stepped twice on one path of a training step.

``scaler.step(optimizer)`` already calls ``optimizer.step()`` (when the gradients are finite); a
second ``optimizer.step()`` after it, or two plain ``optimizer.step()`` calls between two backward
passes, applies the same gradients twice: momentum and Adam's moments advance twice per batch and
the effective learning rate doubles. Steps in exclusive branches (``if args.amp: scaler.step(opt)
else: opt.step()``), behind an early ``continue``, under interval (accumulation) guards, of
different optimizers (GANs) or separated by another backward are separate updates and not reported.
No automatic fix: which of the two calls is the intended one is the author's to say.
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.steps import is_interval_guard
from tcaudit.source.syntax import full_name

_SCALER_NAME = re.compile(r"scaler$", re.IGNORECASE)
_EXITS = (cst.Continue, cst.Return, cst.Break, cst.Raise)


class DoubleOptimizerStep(ScriptRule):
    id = "TC212"
    triggers = (r"\.step\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        groups: dict[tuple[int, str], list[CallSite]] = {}
        for call in self._steps(facts):
            optimizer = self._optimizer_of(facts, call)
            if optimizer is not None:
                groups.setdefault((id(call.ctx.function), optimizer), []).append(call)
        for (_, optimizer), calls in groups.items():
            calls.sort(key=lambda c: facts.line_of(c.node))
            for index, later in enumerate(calls):
                earlier = next((c for c in calls[:index] if self._same_path(facts, c, later)), None)
                if earlier is None:
                    continue
                first = facts.code(earlier.node)
                yield self.finding(
                    facts, later.node,
                    f"`{optimizer}` is stepped again after `{first}` (line {facts.line_of(earlier.node)}) with the "
                    "same gradients",
                    explanation="The parameters (and the optimizer's moments) are updated twice per step.",
                )

    @staticmethod
    def _steps(facts: ScriptFacts) -> list[CallSite]:
        """The file's optimizer steps, and ``scaler.step(opt)`` where the scaler is a parameter."""
        known = {id(c.node) for c in facts.optimizer_steps}
        extra = [
            c for c in facts.method_calls("step")
            if id(c.node) not in known and _SCALER_NAME.search(c.receiver_name or "") and len(c.node.args) == 1
            and facts.is_optimizer_name(full_name(c.node.args[0].value)) and not facts.in_eval(c.ctx)
        ]
        return [*facts.optimizer_steps, *extra]

    @staticmethod
    def _optimizer_of(facts: ScriptFacts, call: CallSite) -> str | None:
        if call.receiver_name in facts.scalers or _SCALER_NAME.search(call.receiver_name or ""):
            return facts.code(call.node.args[0].value) if call.node.args else None
        if any(a.keyword is None for a in call.node.args):
            return None  # step(closure): LBFGS re-evaluates, a different shape
        return call.receiver_name

    def _same_path(self, facts: ScriptFacts, earlier: CallSite, later: CallSite) -> bool:
        start, end = facts.line_of(earlier.node), facts.line_of(later.node)
        function = earlier.ctx.function
        if any(
            step.function is function and start < facts.line_of(step.backward.node) < end
            and not _exclusive(*_paths(earlier.ctx, step.ctx))
            for step in facts.training_steps
        ):
            return False  # another backward in between: two updates with two sets of gradients
        earlier_path, later_path = _paths(earlier.ctx, later.ctx)
        if _exclusive(earlier_path, later_path):
            return False
        for frame in (*earlier_path, *later_path):
            if frame.kind in ("loop", "except", "def", "class", "lambda"):
                return False
            if frame.kind in ("if", "else") and is_interval_guard(facts, frame.node.test):  # type: ignore[attr-defined]
                return False
        for frame in earlier_path:
            if frame.kind in ("if", "else") and _branch_exits(frame):
                return False  # ``if amp: scaler.step(opt); continue`` then ``opt.step()``
        return True


def _paths(a: Frame, b: Frame) -> tuple[list[Frame], list[Frame]]:
    """The frames of ``a`` and of ``b`` below their innermost common frame."""
    b_frames = list(b.chain())
    common = next(f for f in a.chain() if any(f is g for g in b_frames))
    return _frames_below(a, common), _frames_below(b, common)


def _exclusive(a_path: list[Frame], b_path: list[Frame]) -> bool:
    """One in the body of an ``if``, the other in its ``else``: never both on one path."""
    return any(a.node is b.node and {a.kind, b.kind} == {"if", "else"} for a in a_path for b in b_path)


def _frames_below(ctx: Frame, common: Frame) -> list[Frame]:
    out = []
    for frame in ctx.chain():
        if frame is common:
            break
        out.append(frame)
    return out


def _branch_exits(frame: Frame) -> bool:
    node = frame.node
    assert isinstance(node, cst.If)
    suite = node.body if frame.kind == "if" else node.orelse
    if isinstance(suite, cst.Else):
        suite = suite.body
    if suite is None or isinstance(suite, cst.If):
        return False
    body = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
    for statement in body:
        smalls = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else []
        if any(isinstance(s, _EXITS) for s in smalls):
            return True
    return False
