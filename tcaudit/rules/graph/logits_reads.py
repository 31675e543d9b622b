"""Where a script samples or decodes from a model's output: each ``torch.multinomial``, ``argmax`` or
``topk`` call followed back, through names, softmax, temperature, indexing and views, to the model
output it reads. A rule that widens the output's last dimension (TC104's padded vocabulary) bounds it
there, so the sampler never sees the extra columns.

The trace is deliberately narrow: a name is followed to its assignments before the read in the same
function (the last one that encloses the read, and the ones in branches after it), into a helper of
the file whose every ``return`` is the model's output whole, and only through operations that keep
the vocabulary as the last dimension. Anything else (a parameter, another helper's result, a view that
may merge the last dimension) is :class:`Untraceable`, with the line, so the rule can decline instead
of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import libcst as cst

from tcaudit.script.expressions import function_returns
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.model_classes import class_of
from tcaudit.source.syntax import enclosing_function, parent_map

SAMPLERS = frozenset({"multinomial", "argmax", "topk"})
_SOFTMAX = frozenset({"softmax", "log_softmax"})
# Methods that return the same values with the vocabulary still last (the trace goes through them).
_SAME_VALUES = frozenset({
    "float", "double", "half", "bfloat16", "detach", "cpu", "cuda", "to", "clone", "contiguous", "numpy", "tolist",
})
# Calls that make a tensor from nothing the model computed: a sampler over one reads no logits.
_FACTORIES = frozenset({
    "tensor", "as_tensor", "from_numpy", "ones", "zeros", "full", "empty", "rand", "randn", "randint",
    "arange", "linspace", "ones_like", "zeros_like", "full_like", "rand_like", "randn_like", "eye",
})
_ARITHMETIC = (cst.Divide, cst.Multiply, cst.Add, cst.Subtract)

ModelOutput = Callable[[cst.Call, "cst.FunctionDef | None"], bool]
IsSize = Callable[[cst.BaseExpression], bool]


class Untraceable(Exception):
    """A sampler's input that cannot be followed to the model's output or shown not to be it; the
    message names the expression, its line and why (```scores` (line 12) is not assigned ...``)."""


@dataclass(frozen=True)
class LogitsRead:
    """The model's output as a sampler reads it: ``node`` is the output after its indexing and views
    (``logits[:, -1, :]``, ``model(x)[0]``), still with the vocabulary last; ``bound`` is the upper
    bound of the script's own slice of that last dimension on the way (``logits[..., :V]``), if any."""

    node: cst.BaseExpression
    bound: cst.BaseExpression | None


def sampler_calls(facts: ScriptFacts) -> list[CallSite]:
    """``torch.multinomial(p, 1)``, ``torch.argmax(x, -1)``, ``x.argmax(-1)``, ``torch.topk(x, k)``,
    ``np.argmax(p)``: whatever module the function comes from, a sampler reads values it may emit."""
    return [
        call for call in facts.calls
        if call.method in SAMPLERS or (call.qualname or call.name or "").rsplit(".", 1)[-1] in SAMPLERS
    ]


def sampler_input(call: CallSite) -> cst.BaseExpression | None:
    """The tensor a sampler reads: the first argument of a module's function (``torch.argmax(x)``,
    ``np.argmax(x)``, a name resolved through an import), else the receiver of the method (``x.argmax()``)."""
    if call.qualname is not None or call.receiver is None:
        return call.arg("input", 0)
    return call.receiver


def size_reads(expr: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tensors whose last dimension ``expr`` reads as a number: ``x.size(-1)``, ``x.shape[-1]``; not
    inside a ``view``/``reshape`` (``x.view(-1, x.size(-1))`` keeps whatever width ``x`` has)."""
    found: list[cst.BaseExpression] = []

    class _V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "size" and len(node.args) == 1:
                if _is_minus_one(node.args[0].value):
                    found.append(func.value)
            return not (isinstance(func, cst.Attribute) and func.attr.value in ("view", "reshape"))

        def visit_Subscript(self, node: cst.Subscript) -> None:
            value = node.value
            if isinstance(value, cst.Attribute) and value.attr.value == "shape" and len(node.slice) == 1:
                index = node.slice[0].slice
                if isinstance(index, cst.Index) and _is_minus_one(index.value):
                    found.append(value.value)

    expr.visit(_V())
    return found


def _is_minus_one(expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer) and expr.expression.value == "1"
    )


def trace_logits(
    facts: ScriptFacts, expr: cst.BaseExpression, model_output: ModelOutput, is_size: IsSize
) -> list[LogitsRead]:
    """The reads of the model's output that ``expr`` (a sampler's input) is computed from; [] where it
    is computed from none (a tensor factory, a number). Raises :class:`Untraceable` naming the
    expression and line where the trace stops."""
    return _Tracer(facts, model_output, is_size).reads(expr)


@dataclass(frozen=True)
class _Assignment:
    value: cst.BaseExpression | None  # None: a ``for`` target or ``with ... as`` name (not followed)
    element: bool  # the name is one element of the value unpacked (``logits, loss = model(x)``)
    statement: cst.CSTNode
    blocks: tuple[int, ...]  # ids of the blocks around it, outermost first


class _Tracer:
    def __init__(self, facts: ScriptFacts, model_output: ModelOutput, is_size: IsSize) -> None:
        self.facts = facts
        self.model_output = model_output
        self.is_size = is_size
        self.depth = 0
        self.following: set[int] = set()  # helpers whose returns are being followed (no recursion)

    def reads(self, expr: cst.BaseExpression) -> list[LogitsRead]:
        scope = enclosing_function(expr, parent_map(self.facts.module))
        return self._trace(expr, expr, None, scope)

    # ``outer`` is the outermost expression that is ``expr`` indexed or viewed (the model's output as
    # read); ``bound`` the script's own slice of the last dimension among those steps.
    def _trace(
        self, expr: cst.BaseExpression, outer: cst.BaseExpression, bound: cst.BaseExpression | None,
        scope: cst.FunctionDef | None,
    ) -> list[LogitsRead]:
        self.depth += 1
        if self.depth > 60:
            raise self._stop(expr)
        if isinstance(expr, (cst.Integer, cst.Float)):
            return []
        if isinstance(expr, cst.Call):
            return self._trace_call(expr, outer, bound, scope)
        if isinstance(expr, cst.Subscript):
            last = expr.slice[-1].slice if expr.slice else None
            if isinstance(last, cst.Slice) and last.upper is not None and last.step is None and self.is_size(last.upper):
                bound = last.upper
            return self._trace(expr.value, outer, bound, scope)
        if isinstance(expr, cst.Attribute) and expr.attr.value == "logits":  # ``outputs.logits``
            return self._trace(expr.value, outer, bound, scope)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ARITHMETIC):
            # ``logits / temperature``: the tensor is the left operand (the right one when the left is a number)
            side = expr.right if isinstance(expr.left, (cst.Integer, cst.Float)) else expr.left
            return self._trace(side, side, None, scope)
        if isinstance(expr, cst.UnaryOperation):
            return self._trace(expr.expression, expr.expression, None, scope)
        if isinstance(expr, cst.Name):
            return self._trace_name(expr, outer, bound, scope)
        raise self._stop(expr)

    def _trace_call(
        self, call: cst.Call, outer: cst.BaseExpression, bound: cst.BaseExpression | None,
        scope: cst.FunctionDef | None,
    ) -> list[LogitsRead]:
        if self.model_output(call, scope):
            return [LogitsRead(outer, bound)]
        qual = self.facts.qualname(call.func) or ""
        short = qual.rsplit(".", 1)[-1]
        func = call.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        if qual.startswith("torch.") and short in _FACTORIES:
            return []
        if qual.startswith("torch.") and short in _SOFTMAX and call.args:
            return self._trace(call.args[0].value, call.args[0].value, None, scope)
        if isinstance(func, cst.Name) and self._returns_the_output(func.value):
            return [LogitsRead(outer, bound)]  # ``logits = forward_step(model, x)``: read at the call
        if isinstance(func, cst.Attribute):
            receiver = func.value
            if method in _SOFTMAX or method in _SAME_VALUES:
                return self._trace(receiver, receiver, None, scope)
            if method in ("view", "reshape") and call.args and not any(a.star for a in call.args):
                last = call.args[-1].value
                # ``view(-1, V)``, ``view(-1, x.size(-1))``: the vocabulary stays the last dimension
                if self.is_size(last) or size_reads(last):
                    return self._trace(receiver, outer, bound, scope)
        raise self._stop(call)

    def _returns_the_output(self, name: str) -> bool:
        """Whether ``name`` is the file's one module-level function of that name and each of its ``return``
        values is the model's output whole (``return model(x)``), so its call stands for the output."""
        helpers = [fn for fn, ctx in self.facts.functions if fn.name.value == name]
        if len(helpers) != 1 or id(helpers[0]) in self.following:
            return False
        helper = helpers[0]
        if class_of(self.facts, helper) is not None:
            return False
        returns = function_returns(helper)
        self.following.add(id(helper))

        def whole(value: cst.BaseExpression) -> bool:
            found = self._trace(value, value, None, helper)
            return len(found) == 1 and found[0].node is value and found[0].bound is None

        try:
            return bool(returns) and all(whole(value) for value in returns)
        except Untraceable:
            return False
        finally:
            self.following.discard(id(helper))

    def _trace_name(
        self, name: cst.Name, outer: cst.BaseExpression, bound: cst.BaseExpression | None,
        scope: cst.FunctionDef | None,
    ) -> list[LogitsRead]:
        assignments = self._reaching(name, scope)
        if not assignments:
            raise self._stop(name, "is not assigned before it in the same function")
        out: list[LogitsRead] = []
        for assignment in assignments:
            value = assignment.value
            if value is None:
                raise self._stop(name, "comes from a loop or a context manager")
            if assignment.element:
                if isinstance(value, cst.Call) and self.model_output(value, scope):
                    out.append(LogitsRead(outer, bound))
                    continue
                raise self._stop(name, "is unpacked from something other than the model's output")
            if isinstance(value, cst.Call) and self.model_output(value, scope):
                out.append(LogitsRead(outer, bound))  # ``out = model(x)``: the read is ``out`` as indexed here
                continue
            flattened = isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in (
                "view", "reshape")
            for read in self._trace(value, value, None, scope):
                # ``output = model(x).view(-1, V)`` is the output flattened for the loss, which keeps the
                # padded logits: the sampler's read is its reference to it. Indexing (``logits[:, -1, :]``)
                # picks what is sampled, and is bounded where it is written.
                moved = flattened and read.node is value
                out.append(LogitsRead(outer, read.bound or bound) if moved else read)
        return out

    def _stop(self, expr: cst.CSTNode, why: str = "cannot be followed to the model's output") -> Untraceable:
        code = self.facts.code(expr).strip()
        code = code if len(code) <= 40 else code[:37] + "..."
        return Untraceable(f"`{code}` (line {self.facts.line_of(expr)}) {why}")

    # -- assignments --------------------------------------------------------------------------------

    def _reaching(self, name: cst.Name, scope: cst.FunctionDef | None) -> list[_Assignment]:
        """The assignments of ``name`` in ``scope`` before the read: the last one whose blocks enclose
        the read, and those after it in branches the read is not in (either may have run)."""
        assignments, blocks = _assignments(self.facts, scope, name.value)
        if scope is not None and not assignments:
            module_level, _ = _assignments(self.facts, None, name.value)
            if module_level and not is_parameter(scope, name.value):
                return module_level  # a global: any of its assignments may be the one read
        read = self.facts.position(name).start
        around = self._blocks_around(name, blocks)
        before = [a for a in assignments if _before(self.facts.position(a.statement).end, read)]
        out: list[_Assignment] = []
        for assignment in reversed(before):
            out.append(assignment)
            if set(assignment.blocks) <= set(around):
                break  # it encloses the read: nothing earlier reaches it
        return out

    def _blocks_around(self, node: cst.CSTNode, blocks: list[cst.CSTNode]) -> tuple[int, ...]:
        where = self.facts.position(node).start
        out = []
        for block in blocks:
            span = self.facts.position(block)
            if (span.start.line, span.start.column) <= (where.line, where.column) <= (span.end.line, span.end.column):
                out.append(id(block))
        return tuple(out)


def _before(end, start) -> bool:
    return (end.line, end.column) <= (start.line, start.column)


def binds(facts: ScriptFacts, scope: cst.FunctionDef | None, name: str) -> bool:
    """Whether ``scope`` (None: module level) assigns ``name`` itself or takes it as a parameter."""
    return bool(_assignments(facts, scope, name)[0]) or (scope is not None and is_parameter(scope, name))


def is_parameter(fn: cst.FunctionDef, name: str) -> bool:
    """Whether ``name`` is one of ``fn``'s parameters."""
    params = fn.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return any(p.name.value == name for p in every)


def _assignments(facts: ScriptFacts, scope: cst.FunctionDef | None, target: str) -> tuple[list[_Assignment], list[cst.CSTNode]]:
    """Every assignment of the plain name ``target`` directly in ``scope`` (not in functions or classes
    nested in it), and every block of ``scope``. A ``for`` target or a ``with ... as`` name is
    recorded with itself as the value (it cannot be followed)."""
    found: list[_Assignment] = []
    blocks: list[cst.CSTNode] = []
    stack: list[int] = []
    root = scope if scope is not None else facts.module

    def names_in(t: cst.BaseExpression) -> Iterator[tuple[str, bool]]:
        if isinstance(t, cst.Name):
            yield t.value, False
        elif isinstance(t, (cst.Tuple, cst.List)):
            for element in t.elements:
                for name, _ in names_in(element.value):
                    yield name, True

    class _V(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.statement: cst.CSTNode | None = None

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is root

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            blocks.append(node)
            stack.append(id(node))

        def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
            stack.pop()

        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                for name, element in names_in(t.target):
                    if name == target:
                        found.append(_Assignment(node.value, element, node, tuple(stack)))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if node.value is not None and isinstance(node.target, cst.Name) and node.target.value == target:
                found.append(_Assignment(node.value, False, node, tuple(stack)))

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            if isinstance(node.target, cst.Name) and node.target.value == target:
                found.append(_Assignment(node.value, False, node, tuple(stack)))

        def visit_For(self, node: cst.For) -> None:
            if any(name == target for name, _ in names_in(node.target)):
                found.append(_Assignment(None, False, node.target, tuple(stack)))

        def visit_WithItem(self, node: cst.WithItem) -> None:
            if node.asname is not None and any(name == target for name, _ in names_in(node.asname.name)):
                found.append(_Assignment(None, False, node.asname, tuple(stack)))

    root.visit(_V())
    return found, blocks
