"""Gradient accumulation written as a modulo guard: the loop runs ``backward()`` on every iteration and
``optimizer.step()`` only under ``if (i + 1) % N == 0:`` (TC214; TC507 reads the same name pattern).

Only the plain shape counts, on evidence: the step and the backward are in one loop of one function,
the guard is ``<counter> % N == ...`` (``not <counter> % N``) with the counter the loop's target or a
name the loop increments, N a name or an integer above 1 (a module constant 1 is not accumulation),
optionally or-ed with an end-of-epoch test (``or (i + 1) == len(loader)``) and and-ed with anything;
the guard may be a name bound to such a test in the loop (``last = (i + 1) % N == 0``). The gradients
must really accumulate: every ``zero_grad()`` of the loop runs under a modulo guard by the same N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from tcaudit.script.distributed import innermost_loop, literal_value
from tcaudit.script.expressions import attribute_chain, numeric_constant
from tcaudit.script.facts import CallSite, Frame, ScriptFacts, TrainingStep
from tcaudit.source.syntax import nodes_of, target_names

# Names that say "number of micro-steps per optimizer step".
ACCUMULATION_NAME = re.compile(r"accum|update_freq|grad_acc|micro", re.IGNORECASE)


@dataclass(frozen=True)
class AccumulationLoop:
    """One loop whose optimizer step waits for every N-th iteration."""

    loop: Frame
    guard: Frame  # the ``if`` frame around the step
    test: cst.BaseExpression  # the guard's test, through a name it is bound to
    divisor: cst.BaseExpression  # N
    divisor_code: str
    last_batch: cst.BaseExpression | None  # the ``or (i + 1) == len(loader)`` clause, if any
    steps: tuple[CallSite, ...]
    backwards: tuple[TrainingStep, ...]


def _disjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        return _disjuncts(node.left) + _disjuncts(node.right)
    return [node]


def _conjuncts(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


def modulo_clause(node: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """``(i + 1) % N == 0`` / ``0 == i % N`` / ``i % N == N - 1`` / ``not i % N`` → (counter, N)."""
    modulo: cst.BaseExpression | None = None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        modulo = node.expression
    elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        target = node.comparisons[0]
        if isinstance(target.operator, cst.Equal):
            sides = [s for s in (node.left, target.comparator) if isinstance(s, cst.BinaryOperation)
                     and isinstance(s.operator, cst.Modulo)]
            modulo = sides[0] if len(sides) == 1 else None
    if not (isinstance(modulo, cst.BinaryOperation) and isinstance(modulo.operator, cst.Modulo)):
        return None
    counter = _counter(modulo.left)
    divisor = modulo.right
    if counter is None or not isinstance(divisor, (cst.Name, cst.Attribute, cst.Integer)):
        return None
    return counter, divisor


def _counter(node: cst.BaseExpression) -> str | None:
    """``i``, ``self.step``, ``(i + 1)``, ``step - 1`` → the counter's dotted name."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        if isinstance(node.right, cst.Integer):
            return attribute_chain(node.left)
        if isinstance(node.left, cst.Integer) and isinstance(node.operator, cst.Add):
            return attribute_chain(node.right)
        return None
    return attribute_chain(node)


def _mentions_len(facts: ScriptFacts, node: cst.BaseExpression) -> bool:
    if "len(" in facts.code(node):
        return True
    dotted = attribute_chain(node)
    return bool(dotted) and any("len(" in facts.code(b.value) for b in facts.bindings_of(dotted))


def is_end_of_epoch(facts: ScriptFacts, node: cst.BaseExpression) -> bool:
    """``(i + 1) == len(loader)``, ``step == len(dl) - 1``, ``i + 1 == num_batches`` (bound to a len)."""
    if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
        return False
    target = node.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.GreaterThanEqual)):
        return False
    return _mentions_len(facts, target.comparator) or _mentions_len(facts, node.left)


def guard_parts(
    facts: ScriptFacts, test: cst.BaseExpression
) -> tuple[tuple[str, cst.BaseExpression], cst.BaseExpression | None] | None:
    """((counter, N), the end-of-epoch clause or None) for an accumulation guard's test, else None.
    Every alternative of an ``or`` must be the modulo or an end-of-epoch test; ``and`` adds conditions."""
    for conjunct in _conjuncts(test):
        clauses = _disjuncts(conjunct)
        modulos = [m for m in (modulo_clause(c) for c in clauses) if m is not None]
        if not modulos:
            continue
        codes = {(m[0], facts.code(m[1])) for m in modulos}
        if len(codes) != 1:
            return None
        others = [c for c in clauses if modulo_clause(c) is None]
        if not all(is_end_of_epoch(facts, c) for c in others):
            return None
        return modulos[0], (others[0] if others else None)
    return None


def _resolved_test(facts: ScriptFacts, test: cst.BaseExpression, loop: Frame) -> cst.BaseExpression:
    """``if last:`` with ``last = (i + 1) % N == 0 or ...`` bound once in the loop: that expression."""
    dotted = attribute_chain(test)
    if dotted is None:
        return test
    bindings = [b for b in facts.bindings_of(dotted) if b.ctx.inside(loop.node)]
    if len(bindings) == 1:
        return bindings[0].value
    return test


def _counts_iterations(facts: ScriptFacts, counter: str, loop: Frame, guard: cst.CSTNode) -> bool:
    """The counter is the loop's target, or incremented in the loop body outside the guard."""
    node = loop.node
    if isinstance(node, cst.For) and counter in target_names(node.target):
        return True
    for aug in nodes_of(node.body, cst.AugAssign):  # type: ignore[attr-defined]
        if attribute_chain(aug.target) == counter and isinstance(aug.operator, cst.AddAssign):
            if not any(aug is inner for inner in nodes_of(guard, cst.AugAssign)):
                return True
    return False


def _n_above_one(facts: ScriptFacts, divisor: cst.BaseExpression) -> bool:
    value = literal_value(divisor) if isinstance(divisor, cst.Integer) else numeric_constant(facts, divisor)
    if value is ... or value is None:
        return True  # a setting: accumulation whenever it is above 1
    return isinstance(value, (int, float)) and value > 1


def _guard_of(facts: ScriptFacts, step: CallSite, loop: Frame):
    for frame in step.ctx.chain():
        if frame.node is loop.node:
            return None
        if frame.kind != "if":
            continue
        test = _resolved_test(facts, frame.node.test, loop)  # type: ignore[attr-defined]
        parts = guard_parts(facts, test)
        if parts is None:
            continue
        (counter, divisor), last = parts
        if _counts_iterations(facts, counter, loop, frame.node) and _n_above_one(facts, divisor):
            return frame, test, divisor, last
    return None


def _under_guard(facts: ScriptFacts, ctx: Frame, loop: Frame, divisor_code: str) -> bool:
    """Whether ``ctx`` runs only under a modulo guard by N within ``loop``."""
    for frame in ctx.chain():
        if frame.node is loop.node:
            return False
        if frame.kind == "if":
            parts = guard_parts(facts, _resolved_test(facts, frame.node.test, loop))  # type: ignore[attr-defined]
            if parts is not None and facts.code(parts[0][1]) == divisor_code:
                return True
    return False


def _grads_accumulate(facts: ScriptFacts, loop: Frame, divisor_code: str) -> bool:
    """Every ``zero_grad()`` and every optimizer step of the loop (and there is a ``zero_grad()``) runs
    under a modulo guard by N, and no ``p.grad = None`` / ``p.grad.zero_()`` clears gradients in it."""
    clears = [c for c in facts.method_calls("zero_grad") if _in_loop(c.ctx, loop)]
    if not clears:
        return False
    steps = [c for c in facts.optimizer_steps if _in_loop(c.ctx, loop)]
    if not all(_under_guard(facts, c.ctx, loop, divisor_code) for c in (*clears, *steps)):
        return False
    body = loop.node.body  # type: ignore[attr-defined]
    if any(attribute_chain(c.func.value).endswith(".grad") for c in nodes_of(body, cst.Call)
           if isinstance(c.func, cst.Attribute) and c.func.attr.value == "zero_" and attribute_chain(c.func.value)):
        return False
    for assign in nodes_of(body, cst.Assign):
        if any((attribute_chain(t.target) or "").endswith(".grad") for t in assign.targets):
            return False
    return True


def _in_loop(ctx: Frame, loop: Frame) -> bool:
    """Directly in ``loop``: no inner loop or function between."""
    inner = innermost_loop(ctx)
    return inner is not None and inner.node is loop.node


def accumulation_loops(facts: ScriptFacts) -> list[AccumulationLoop]:
    """The loops of the file that accumulate gradients behind a modulo guard on the optimizer step."""
    found: dict[int, AccumulationLoop] = {}
    for step in facts.optimizer_steps:
        loop = innermost_loop(step.ctx)
        if loop is None or id(loop.node) in found:
            continue
        guarded = _guard_of(facts, step, loop)
        if guarded is None:
            continue
        guard, test, divisor, last = guarded
        divisor_code = facts.code(divisor)
        backwards = tuple(
            s for s in facts.training_steps if _in_loop(s.ctx, loop) and not s.ctx.inside(guard.node)
        )
        if not backwards or not _grads_accumulate(facts, loop, divisor_code):
            continue
        steps = tuple(s for s in facts.optimizer_steps if s.ctx.inside(guard.node))
        found[id(loop.node)] = AccumulationLoop(loop, guard, test, divisor, divisor_code, last, steps, backwards)
    return list(found.values())
