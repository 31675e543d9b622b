"""Which names share storage, what an expression is built on, and where a tensor is written in place.

* **Chains.** What an expression is built on (:func:`expression_chain`, :func:`based_on`) and where it
  starts: the node at its root (:func:`chain_root`: ``x`` of ``x.transpose(1, 2)[0]``), or the dotted
  name of the memory a method works on (:func:`receiver_root`: ``buf`` of ``buf[:n].view(-1)``).
* **In-place writes.** torch's in-place naming (:func:`is_in_place_name`), the statements that write
  through a target rather than bind a name (:func:`assignment_targets`), and the writes that reach a
  tensor through a view or a name bound to it (:func:`written_through`, :func:`in_place_write`).

TC303 asks whether a view's storage sharing matters, TC408 whether host tensors are written in place,
TC409 which name a ``copy_`` fills, TC601 what a synced value is read from.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.metadata import CodePosition

from tcaudit.script.expressions import attribute_chain
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.model_classes import init_value
from tcaudit.source.syntax import full_name, keyword

# -- chains -----------------------------------------------------------------------------------------------


def expression_chain(node: cst.BaseExpression | None) -> Iterator[cst.BaseExpression]:
    """What an expression is built on, outermost first: ``a.b(c)[0].d`` → itself, ``a.b(c)[0]``,
    ``a.b(c)``, ``a.b``, ``a`` (through calls, attributes and subscripts)."""
    while node is not None:
        yield node
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        else:
            node = None


def chain_root(expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """The innermost node of ``expr``'s chain: ``x`` of ``x.transpose(1, 2).view(-1)``, ``self`` of
    ``self.conv(x)``, ``torch`` of ``torch.relu(x)``; None for None."""
    root = None
    for root in expression_chain(expr):
        pass
    return root


def based_on(expr: cst.BaseExpression | None, node: cst.CSTNode) -> bool:
    """Whether ``node`` (by identity) is ``expr`` or part of its chain (``v`` in ``v[0].add_``)."""
    return any(part is node for part in expression_chain(expr))


def receiver_root(expr: cst.BaseExpression) -> str | None:
    """The dotted name a chain of subscripts, attributes and method calls starts from (``buf`` of
    ``buf[:n].view(-1)``); None where it starts from anything else. Unlike :func:`chain_root` it stops at
    the first plain dotted name (``self.buf`` of ``self.buf[0]``, not ``self``) and skips a method's own
    name (``buf`` of ``buf.view(-1)``, not ``buf.view``)."""
    while True:
        dotted = attribute_chain(expr)
        if dotted is not None:
            return dotted
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        else:
            return full_name(expr) if isinstance(expr, cst.Name) else None


# -- in-place writes --------------------------------------------------------------------------------------


def is_in_place_name(name: str | None) -> bool:
    """``add_``, ``masked_fill_``, ``torch.nn.init.normal_``, ``torch._foreach_add_``: torch's in-place
    naming (a trailing underscore), dunders such as ``__init__`` aside."""
    last = (name or "").split(".")[-1]
    return last.endswith("_") and not last.endswith("__")


def inplace_keyword(call: cst.Call) -> bool:
    """Whether ``call`` passes ``inplace=True`` (``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``)."""
    arg = keyword(call, "inplace")
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "True"


def assignment_targets(scope: cst.CSTNode | None) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
    """(target, statement) of ``x[i] = ...``, ``x.data = ...`` and ``x += ...`` under ``scope`` (a
    function, a class, the module; nested ones included), in the order they are written; none for None.
    A name rebound by ``=`` is no write to its tensor."""
    if scope is None:
        return []
    targets: list[tuple[cst.BaseExpression, cst.CSTNode]] = []

    class _Targets(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            targets.extend((t.target, node) for t in node.targets if not isinstance(t.target, cst.Name))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets.append((node.target, node))

    scope.visit(_Targets())
    return targets


def written_through(facts: ScriptFacts, function: cst.FunctionDef | None, node: cst.CSTNode) -> bool:
    """Whether an expression built on ``node`` is, in ``function``, the receiver of an in-place method
    (``v[0].add_(1)``) or an assignment target (``v[0] = 1``)."""
    for call in facts.calls_in(function):
        if is_in_place_name(call.method) and based_on(call.receiver, node):
            return True
    return any(based_on(target, node) for target, _ in assignment_targets(function))


def in_place_write(
    facts: ScriptFacts,
    function: cst.FunctionDef | None,
    name: str,
    after: CodePosition,
) -> cst.CSTNode | None:
    """The first write to ``name``'s tensor after position ``after`` in the function, or None: an
    in-place method or function (``x.add_()``, ``torch.relu_(x)``), ``inplace=True`` or ``out=x``, a layer
    built with ``inplace=True`` (``self.relu(x)``, the layer its class builds:
    :func:`~tcaudit.script.model_classes.init_value`), or ``x[...] = ...`` / ``x += ...``. Returns the call or the statement."""

    def later(node: cst.CSTNode) -> bool:
        start = facts.position(node).start
        return (start.line, start.column) > (after.line, after.column)

    for call in facts.calls_in(function):
        if not later(call.node):
            continue
        root = chain_root(call.receiver)
        if is_in_place_name(call.method) and isinstance(root, cst.Name) and root.value == name:
            return call.node
        passed = [a for a in call.node.args if full_name(a.value) == name]
        if not passed:
            continue
        if any(a.keyword is not None and a.keyword.value == "out" for a in passed):
            return call.node
        if is_in_place_name(call.name) or inplace_keyword(call.node):
            return call.node
        cls = call.ctx.class_def
        if cls is not None and (call.name or "").startswith("self."):
            layer = init_value(facts, cls, call.name)
            if isinstance(layer, cst.Call) and inplace_keyword(layer):
                return call.node
    for target, statement in assignment_targets(function):
        root = chain_root(target)
        if isinstance(root, cst.Name) and root.value == name and later(target):
            return statement
    return None
