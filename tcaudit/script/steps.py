"""Whether a place in a training script runs on every training step, or only now and then.

The idea is TC601's (tcaudit/rules/tc601_per_step_sync.py, ``_StepScope``): walk out from a call
through its frames; an ``if`` on an interval (``step % 100 == 0``, ``i == 0``, a time check) or an
``except`` means "not every step", a step loop means "every step", and a function is followed to its
callers (not through eval functions) a couple of levels up. Kept here as public functions so rules
other than TC601 can ask the same question.
"""

from __future__ import annotations

import re

import libcst as cst

from tcaudit.script.distributed import distributed_facts, has_modulo, names_in
from tcaudit.script.facts import Frame, ScriptFacts

_TIME_CALL = re.compile(r"\btime\b|perf_counter|monotonic")
MAX_CALL_DEPTH = 2


def comparisons(test: cst.BaseExpression) -> list[cst.Comparison]:
    out: list[cst.Comparison] = []

    class _Comparisons(cst.CSTVisitor):
        def visit_Comparison(self, node: cst.Comparison) -> None:
            out.append(node)

    test.visit(_Comparisons())
    return out


def is_interval_guard(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    """``i % log_interval == 0``, ``it % eval_interval == 0 and master_process``, ``log_now`` bound to
    a modulo, ``i == 0``, ``i == len(loader) - 1``, a time-based ``time.time() - t0 > 10``."""
    if has_modulo(test):
        return True
    for name in names_in(test):
        if _TIME_CALL.search(name):
            return True
        if any(has_modulo(binding.value) for binding in facts.bindings_of(name)):
            return True
    for node in comparisons(test):
        for target in node.comparisons:
            if isinstance(target.operator, cst.Equal):
                sides = (node.left, target.comparator)
                if any(isinstance(s, cst.Integer) for s in sides) or any(
                    "len(" in facts.module.code_for_node(s) for s in sides
                ):
                    return True
    return False


def runs_every_step(facts: ScriptFacts, ctx: Frame, depth: int = MAX_CALL_DEPTH) -> bool:
    """True when code at ``ctx`` runs once per training step: inside a step loop (or a function
    called from one), under no interval guard, ``except`` handler or eval function."""
    info = distributed_facts(facts)
    for frame in ctx.chain():
        kind = frame.kind
        if kind == "if" and is_interval_guard(facts, frame.node.test):  # type: ignore[attr-defined]
            return False
        if kind == "except":
            return False
        if kind == "loop":
            if id(frame.node) in info.env_step_loops:
                return False  # RL interaction: the loop steps an environment, not an optimizer
            if info.is_step_loop(frame):
                return True
        if kind == "def":
            fn = frame.node
            assert isinstance(fn, cst.FunctionDef)
            if facts.function_is_eval(fn) or depth <= 0:
                return False
            callers = [c for c in facts.callers(fn) if not c.ctx.inside(fn)]
            return any(runs_every_step(facts, c.ctx, depth - 1) for c in callers)
        if kind in ("class", "lambda"):
            return False
    return False
