"""TC409 d2h-non-blocking-read: a device-to-host copy with ``non_blocking=True`` read on the host
before any synchronisation.

``t.to("cpu", non_blocking=True)`` and ``host_buf.copy_(gpu_t, non_blocking=True)`` return as soon
as the copy is queued; the host memory is written when the stream gets there. A read in between
(``.numpy()``, ``.item()``, ``float()``, ``print``, an ``if`` on it, ``np.*``) sees what the memory
held before: wrong values, silently.

Reported in a file that imports torch and may use CUDA, for a copy whose target is certainly the host
(``"cpu"``, ``torch.device("cpu")``, a pinned or CPU buffer) and whose source is not, when a read of the
result follows in the same function body in straight-line order with no sync in between
(``torch.cuda.synchronize()``, ``stream``/``event.synchronize()``, an event wait, a blocking ``.item()``,
``.tolist()`` or ``.cpu()`` of another tensor, a call of a function of this file that syncs). Reads
in a branch count; anything a branch or a loop body may sync ends the search, and so do a rebinding of
the result, ``return``, ``break`` and ``continue``. A result only stored, passed to another call or
moved back to the GPU is not a read.

Fix (numerics: the copy becomes synchronous, and the values read become the result): drop the
``non_blocking=True`` argument. Declined where the flag is not the literal ``True`` at the call (a
constant, a ``**kwargs`` dict). A flag passed by position (``.to("cpu", None, True)``) is not looked
for: the rule's trigger is the keyword.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import CallEditor, contains
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.aliasing import receiver_root
from tcaudit.script.evidence import CUDA_EVIDENCE
from tcaudit.script.expressions import REPORTING_CALL, attribute_chain, literal
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.host_sync import SYNCHRONIZE, WAIT_METHODS, is_host_tensor, names_host_device
from tcaudit.source.syntax import full_name, keyword, target_names
from tcaudit.source.triggers import all_of

KEYWORD = "non_blocking"
# Methods that give a host tensor's values to Python.
_READ_METHODS = frozenset({"numpy", "tolist", "item", "__array__"})
# Built-ins that turn a tensor into a Python value (or text) by reading it.
_READ_BUILTINS = frozenset({"float", "int", "bool", "complex", "str", "repr", "format", "round", "abs", "sum", "max", "min", "sorted"})
# Methods of a tensor that say nothing of its values (metadata) or that move it back to a GPU.
_NOT_VALUES = frozenset({
    "size", "dim", "numel", "stride", "data_ptr", "element_size", "is_pinned", "is_contiguous", "nelement",
    "storage_offset", "type", "get_device", "to", "cuda", "pin_memory", "copy_", "record_stream",
})
# Attributes that are views of the same memory; other attributes (``shape``, ``dtype``) are metadata.
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
# A Python container a tensor may index (``classes[pred]`` calls ``pred.__index__()``).
_CONTAINERS = (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.DictComp, cst.Set)


@dataclass(frozen=True, eq=False)
class DropKeyword(FixPlan):
    """Remove ``argument`` (``non_blocking=True``) from ``call``."""

    kind = "drop-kwarg"
    call: cst.Call
    argument: cst.Arg
    key: str


@dataclass(frozen=True)
class _Copy:
    call: CallSite
    argument: cst.Arg | None  # the argument that passes non_blocking=True at the call; None for **kwargs
    flag: str  # how the flag is passed: "literal", "name" (a constant), "kwargs"


@dataclass
class _Read:
    node: cst.CSTNode
    what: str


@dataclass
class _Flow:
    """Follows one function body in execution order from a copy: the names holding its result, and
    the first host read of them before any sync."""

    facts: ScriptFacts
    copy: _Copy
    started: bool = False
    stopped: bool = False
    names: set[str] = field(default_factory=set)
    read: _Read | None = None
    depth: int = 0

    # -- statements ---------------------------------------------------------------------------------
    def block(self, statements: Sequence[cst.CSTNode]) -> None:
        for statement in statements:
            if self.stopped:
                return
            self.statement(statement)

    def statement(self, node: cst.CSTNode) -> None:
        if not self.started:
            if contains(node, self.copy.call.node):
                self._enter(node)
            return
        if isinstance(node, cst.SimpleStatementLine):
            self.block(node.body)
        elif isinstance(node, cst.BaseSmallStatement):
            self._small(node)
        elif isinstance(node, cst.If):
            self._if(node)
        elif isinstance(node, (cst.For, cst.While)):
            self._loop(node)
        elif isinstance(node, cst.With):
            for item in node.items:
                self._expression(item.item)
                if item.asname is not None:
                    self._rebind(item.asname.name)
            if not self.stopped:
                self.block(_body(node.body))
        elif isinstance(node, cst.Try):
            self.block(_body(node.body))
            for handler in node.handlers:
                self.block(_body(handler.body))
            if node.orelse is not None:
                self.block(_body(node.orelse.body))
            if node.finalbody is not None:
                self.block(_body(node.finalbody.body))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self._rebind(node.name)
        else:
            self.stopped = True  # ``match`` and anything newer: not followed

    def _enter(self, node: cst.CSTNode) -> None:
        """The statement holding the copy: go down to it, then follow what runs after it."""
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if self.stopped:
                    return
                if self.started:
                    self._small(small)
                elif contains(small, self.copy.call.node):
                    self._start(small)
            return
        if isinstance(node, cst.BaseSmallStatement):
            self._start(node)
            return
        if not isinstance(node, (cst.If, cst.For, cst.While, cst.With, cst.Try)):
            self.stopped = True
            return
        for header in _headers(node):
            if contains(header, self.copy.call.node):
                # ``if x.to("cpu", non_blocking=True)[0] > 0:``: only what the header itself reads
                self.read = self._reads_of(header, roots_only=True)
                self.stopped = True
                return
        for kind, body in _bodies(node):
            if not any(contains(s, self.copy.call.node) for s in body):
                continue
            self.block(body)
            if self.stopped or not self.started:
                return
            # What runs next in this statement: a loop's ``else``, a ``try``'s ``else`` and ``finally``.
            following = {"loop": ("orelse",), "try": ("orelse", "finally"), "handler": ("finally",)}.get(kind, ())
            for later_kind, later in _bodies(node):
                if later_kind in following:
                    self.block(later)
            return

    def _start(self, small: cst.BaseSmallStatement) -> None:
        copy = self.copy.call.node
        self.read = self._reads_of(small, roots_only=True)
        if self.read is not None:
            self.stopped = True
            return
        self.started = True
        if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            for target in targets:
                self.names |= _names_holding(target, small.value, copy, self._rooted_at_copy)
        if self.copy.call.method == "copy_":
            dotted = receiver_root(self.copy.call.receiver) if self.copy.call.receiver is not None else None
            if dotted is not None and not _rebinds(small, dotted):
                self.names.add(dotted)
        if not self.names:
            self.stopped = True

    def _small(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, (cst.Return, cst.Raise, cst.Break, cst.Continue)):
            value = getattr(small, "value", None) or getattr(small, "exc", None)
            if value is not None:
                self._expression(value)
            self.stopped = True
            return
        self._expression(small)
        if self.stopped:
            return
        if isinstance(small, cst.Assign):
            for target in small.targets:
                self._rebind(target.target)
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            self._rebind(small.target)
        elif isinstance(small, cst.Del):
            self._rebind(small.target)

    def _if(self, node: cst.If) -> None:
        self._expression(node.test, test="an `if` test")
        if self.stopped:
            return
        before = set(self.names)
        self.block(_body(node.body))
        if self.stopped:
            return  # a read in the branch, or a sync that may have run
        after_body = self.names
        self.names = set(before)
        if isinstance(node.orelse, cst.If):
            self._if(node.orelse)
        elif node.orelse is not None:
            self.block(_body(node.orelse.body))
        if not self.stopped:
            self.names &= after_body  # a branch that rebinds the name may have run
            self.stopped = not self.names

    def _loop(self, node: cst.For | cst.While) -> None:
        if isinstance(node, cst.For):
            self._expression(node.iter)
            if self.stopped:
                return
            self._rebind(node.target)
        else:
            self._expression(node.test, test="a `while` test")
        if not self.stopped:
            self.block(_body(node.body))
        if not self.stopped and node.orelse is not None:
            self.block(_body(node.orelse.body))

    def _rebind(self, target: cst.CSTNode) -> None:
        bound = target_names(target) if isinstance(target, cst.BaseExpression) else set()
        if isinstance(target, cst.Name):
            bound.add(target.value)
        if isinstance(target, (cst.Tuple, cst.List)) or bound:
            self.names -= {n for n in self.names if any(n == b or n.startswith(b + ".") for b in bound)}
        if not self.names:
            self.stopped = True

    # -- expressions --------------------------------------------------------------------------------
    def _expression(self, node: cst.CSTNode, *, test: str = "") -> None:
        """A read stops the search with a finding, a sync without one (both in one statement: the
        sync may run first, so no finding)."""
        if self._syncs(node):
            self.stopped = True
            return
        read = self._reads_of(node, test=test)
        if read is not None:
            self.read = read
            self.stopped = True

    def _rooted(self, expr: cst.BaseExpression) -> bool:
        """``expr`` is the copy's result or host memory made from it: ``r``, ``r[0]``, ``r.sum()``,
        ``r.T`` (not ``r.shape``, ``r.size()`` or ``r.cuda()``)."""
        while True:
            if expr is self.copy.call.node:
                return True
            dotted = attribute_chain(expr)
            if dotted is not None and dotted in self.names:
                return True
            if isinstance(expr, cst.Subscript):
                expr = expr.value
            elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
                if expr.func.attr.value in _NOT_VALUES or expr.func.attr.value in _READ_METHODS:
                    return False
                expr = expr.func.value
            elif isinstance(expr, cst.Attribute) and expr.attr.value in _VIEW_ATTRIBUTES:
                expr = expr.value
            else:
                return False

    def _mentions(self, expr: cst.BaseExpression) -> bool:
        """Whether the copy's result is read anywhere in ``expr`` (``np.asarray(host).tolist()``):
        a ``.tolist()`` or ``float()`` of it is host work, not a wait for another tensor."""
        found = False
        flow = self

        class _Find(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                nonlocal found
                if not found and isinstance(node, cst.BaseExpression) and flow._rooted(node):
                    found = True
                return not found

        expr.visit(_Find())
        return found

    def _rooted_at_copy(self, expr: cst.BaseExpression) -> bool:
        names, self.names = self.names, set()
        try:
            return self._rooted(expr)
        finally:
            self.names = names

    def _reads_of(self, node: cst.CSTNode, *, test: str = "", roots_only: bool = False) -> _Read | None:
        """The first host read of the copy's result in ``node`` (``roots_only``: of the copy call
        itself, in its own statement)."""
        rooted = self._rooted_at_copy if roots_only else self._rooted
        facts = self.facts
        found: list[_Read] = []

        def add(at: cst.CSTNode, what: str) -> None:
            if not found:
                found.append(_Read(at, what))

        def test_reads(expr: cst.BaseExpression, where: str) -> None:
            if isinstance(expr, cst.BooleanOperation):
                test_reads(expr.left, where)
                test_reads(expr.right, where)
            elif isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
                test_reads(expr.expression, where)
            elif isinstance(expr, cst.Comparison):
                if all(isinstance(c.operator, (cst.Is, cst.IsNot)) for c in expr.comparisons):
                    return  # ``host is not None`` reads no value
                if rooted(expr.left) or any(rooted(c.comparator) for c in expr.comparisons):
                    add(expr, where)
            elif rooted(expr):
                add(expr, where)

        class _Reads(cst.CSTVisitor):
            def visit_Lambda(self, n: cst.Lambda) -> bool:
                return False  # runs later, if at all

            def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
                return False

            def visit_Call(self, n: cst.Call) -> None:
                func = n.func
                if isinstance(func, cst.Attribute) and func.attr.value in _READ_METHODS and rooted(func.value):
                    add(n, f"`.{func.attr.value}()`")
                    return
                name = full_name(func) or ""
                values = [a.value for a in n.args if not a.star]
                qual = facts.qualname(func) or ""
                if isinstance(func, cst.Name) and name in _READ_BUILTINS and values and rooted(values[0]):
                    add(n, f"`{name}()`")
                elif (qual.startswith("numpy.") or qual == "torch.save") and any(rooted(v) for v in values):
                    add(n, f"`{name}(...)`")
                elif REPORTING_CALL.search(name) and any(
                    rooted(v) or (isinstance(v, cst.Dict) and any(
                        isinstance(e, cst.DictElement) and rooted(e.value) for e in v.elements))
                    for v in values
                ):
                    add(n, f"`{name}(...)`")
                elif (
                    isinstance(func, cst.Attribute) and func.attr.value == "format"
                    and isinstance(func.value, (cst.SimpleString, cst.ConcatenatedString))
                    and any(rooted(v) for v in values)
                ):
                    add(n, "formatting")

            def visit_FormattedStringExpression(self, n: cst.FormattedStringExpression) -> None:
                if rooted(n.expression):
                    add(n, "an f-string")

            def visit_BinaryOperation(self, n: cst.BinaryOperation) -> None:
                if isinstance(n.operator, cst.Modulo) and isinstance(
                    n.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
                ):
                    values = [e.value for e in n.right.elements] if isinstance(n.right, cst.Tuple) else [n.right]
                    if any(rooted(v) for v in values):
                        add(n, "`%` formatting")

            def visit_Subscript(self, n: cst.Subscript) -> None:
                container = attribute_chain(n.value)
                if container is None or rooted(n.value):
                    return
                indexes = [e.slice.value for e in n.slice if isinstance(e.slice, cst.Index)]
                if not any(rooted(i) for i in indexes):
                    return
                values = [b.value for b in facts.bindings_of(container) if not b.is_item_write]
                if values and all(isinstance(v, _CONTAINERS) for v in values):
                    add(n, f"indexing `{container}`")

            def visit_IfExp(self, n: cst.IfExp) -> None:
                test_reads(n.test, "a conditional expression")

            def visit_CompIf(self, n: cst.CompIf) -> None:
                test_reads(n.test, "a comprehension's `if`")

            def visit_Assert(self, n: cst.Assert) -> None:
                test_reads(n.test, "an `assert`")

        if test and isinstance(node, cst.BaseExpression):
            test_reads(node, test)
        node.visit(_Reads())
        return found[0] if found else None

    def _syncs(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` makes the host wait for the device (a sync of a tensor other than the
        copy's result, a stream or event wait, a call of a function of this file that syncs)."""
        facts = self.facts
        flow = self
        synced = False

        class _Syncs(cst.CSTVisitor):
            def visit_Lambda(self, n: cst.Lambda) -> bool:
                return False

            def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
                return False

            def visit_Call(self, n: cst.Call) -> None:
                nonlocal synced
                if n is flow.copy.call.node:
                    return
                if _call_syncs(facts, n, flow._mentions) or flow._calls_syncing_function(n):
                    synced = True

        node.visit(_Syncs())
        return synced

    def _calls_syncing_function(self, call: cst.Call) -> bool:
        if self.depth >= 2:
            return False
        func = call.func
        name = func.value if isinstance(func, cst.Name) else (
            func.attr.value if isinstance(func, cst.Attribute) and attribute_chain(func.value) in ("self", "cls") else None
        )
        if name is None:
            return False
        for fn in self.facts.functions_by_name.get(name, []):
            inner = _Flow(self.facts, self.copy, depth=self.depth + 1)
            if any(_call_syncs(self.facts, c.node, lambda expr: False) or inner._calls_syncing_function(c.node)
                   for c in self.facts.calls_in(fn)):
                return True
        return False


def _call_syncs(facts: ScriptFacts, call: cst.Call, mentions_result) -> bool:
    """Whether a call makes the host wait for the device; ``mentions_result(expr)`` says whether
    ``expr`` reads the copy's own result (host work on it is no wait)."""
    func = call.func
    qual = facts.qualname(func) or ""
    if SYNCHRONIZE.match(qual) or qual.endswith("distributed.barrier"):
        return True
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method in WAIT_METHODS:
            return True
        if method not in ("item", "tolist", "cpu", "to"):
            return False
        if mentions_result(func.value) or is_host_tensor(facts, func.value):
            return False  # host work on host memory (``host_buf.tolist()``): no wait
        if method in ("item", "tolist", "cpu"):
            return True
        if method == "to":
            device = keyword(call, "device")
            first = device.value if device is not None else next((a.value for a in call.args if a.keyword is None), None)
            if names_host_device(facts, first, None):
                return not _passes_non_blocking(call)
    if isinstance(func, cst.Name) and func.value in ("float", "int", "bool") and call.args:
        value = call.args[0].value
        if not mentions_result(value) and literal(value) is ... and not (
            isinstance(value, cst.Call) and full_name(value.func) == "len"
        ):
            return True  # ``float(loss)`` of a CUDA tensor waits for it
    return False


def _passes_non_blocking(call: cst.Call) -> bool:
    """``non_blocking=`` anything but ``False``, ``**kwargs``, or a third positional argument of
    ``.to(device, dtype, non_blocking)`` that is not ``False``: the copy may not wait."""
    flag = keyword(call, KEYWORD)
    if flag is not None:
        return literal(flag.value) is not False
    if any(arg.star == "**" for arg in call.args):
        return True
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return len(positional) > 2 and literal(positional[2].value) is not False


def _body(block: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return block.body  # IndentedBlock: statements; SimpleStatementSuite: small statements


def _headers(node: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(node, cst.If):
        return [node.test]
    if isinstance(node, cst.For):
        return [node.target, node.iter]
    if isinstance(node, cst.While):
        return [node.test]
    if isinstance(node, cst.With):
        return list(node.items)
    return []


def _bodies(node: cst.CSTNode) -> list[tuple[str, Sequence[cst.CSTNode]]]:
    if isinstance(node, cst.If):
        out = [("if", _body(node.body))]
        if node.orelse is not None:
            out.append(("else", [node.orelse] if isinstance(node.orelse, cst.If) else _body(node.orelse.body)))
        return out
    if isinstance(node, (cst.For, cst.While)):
        out = [("loop", _body(node.body))]
        if node.orelse is not None:
            out.append(("orelse", _body(node.orelse.body)))
        return out
    if isinstance(node, cst.With):
        return [("with", _body(node.body))]
    if isinstance(node, cst.Try):
        out = [("try", _body(node.body))]
        out += [("handler", _body(h.body)) for h in node.handlers]
        if node.orelse is not None:
            out.append(("orelse", _body(node.orelse.body)))
        if node.finalbody is not None:
            out.append(("finally", _body(node.finalbody.body)))
        return out
    return []


def _names_holding(target: cst.BaseExpression, value: cst.BaseExpression, copy: cst.Call, rooted) -> set[str]:
    """The names an assignment binds to the copy's result (or a view of it): ``host = x.to(...)``,
    ``a, b = x.to(...), y``; a tuple unpacked from one call is not followed."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return set()
        out: set[str] = set()
        for t, v in zip(target.elements, value.elements):
            out |= _names_holding(t.value, v.value, copy, rooted)
        return out
    dotted = attribute_chain(target)
    return {dotted} if dotted is not None and rooted(value) else set()


def _rebinds(small: cst.BaseSmallStatement, dotted: str) -> bool:
    if isinstance(small, cst.Assign):
        return any(dotted in target_names(t.target) for t in small.targets)
    return False


def _enclosing_body(facts: ScriptFacts, call: CallSite) -> Sequence[cst.CSTNode] | None:
    """The statements of the function (or module) whose body runs the copy; None inside a lambda or
    a class body."""
    for frame in call.ctx.chain():
        if frame.kind == "lambda" or frame.kind == "class":
            return None
        if frame.kind == "def":
            return _body(frame.node.body)  # type: ignore[attr-defined]
        if frame.kind == "module":
            return frame.node.body  # type: ignore[attr-defined]
    return None


def _flag(facts: ScriptFacts, call: CallSite) -> _Copy | None:
    """How ``non_blocking=True`` reaches the call; None when it does not, or may not. (A flag passed
    by position, ``.to("cpu", None, True)``, is not looked for: the rule's trigger is the keyword.)"""
    argument = keyword(call.node, KEYWORD)
    if argument is not None:
        value = literal(argument.value)
        if value is True:
            return _Copy(call, argument, "literal")
        if value is not ... or not isinstance(argument.value, (cst.Name, cst.Attribute)):
            return None
        dotted = attribute_chain(argument.value)
        bindings = facts.bindings_of(dotted) if dotted else []
        if bindings and all(literal(b.value) is True for b in bindings) and dotted not in _parameters(call):
            return _Copy(call, argument, "name")  # ``NON_BLOCKING = True``
        return None
    for arg in call.node.args:
        if arg.star == "**" and _dict_passes_true(facts, arg.value):
            return _Copy(call, None, "kwargs")
    return None


def _parameters(call: CallSite) -> set[str]:
    fn = call.ctx.function
    if fn is None:
        return set()
    params = fn.params
    return {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}


def _dict_passes_true(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    """``**kw`` where every visible value of ``kw`` is a dict literal or ``dict(...)`` passing
    ``non_blocking=True``."""
    dotted = attribute_chain(expr)
    values = [b.value for b in facts.bindings_of(dotted)] if dotted else []
    if not values:
        return False
    for value in values:
        if isinstance(value, cst.Dict):
            entries = [e for e in value.elements if isinstance(e, cst.DictElement) and literal(e.key) == KEYWORD]
            if len(entries) != 1 or literal(entries[0].value) is not True:
                return False
        elif isinstance(value, cst.Call) and full_name(value.func) == "dict":
            entry = keyword(value, KEYWORD)
            if entry is None or literal(entry.value) is not True:
                return False
        else:
            return False
    return True


def d2h_copy(facts: ScriptFacts, call: CallSite) -> _Copy | None:
    """A copy into host memory that passes ``non_blocking=True``, from a tensor not known to be on
    the host already."""
    fn = call.ctx.function
    receiver = call.receiver
    if receiver is None:
        return None
    if call.method == "to":
        device = call.arg("device", 0)
        if not names_host_device(facts, device, fn) or is_host_tensor(facts, receiver, fn):
            return None
        return _flag(facts, call)
    if call.method == "copy_":
        source = call.arg("src", 0)
        if source is None or not is_host_tensor(facts, receiver, fn) or is_host_tensor(facts, source, fn):
            return None
        return _flag(facts, call)
    return None


class D2HNonBlockingRead(ScriptRule):
    id = "TC409"
    triggers = (all_of(r"non_blocking", r"\.\s*(?:to|copy_)\b", CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if "torch" not in facts.imported_roots() or not facts.uses_cuda:
            return
        cost = context.cost(self.spec, "wrong_reads")
        for call in facts.calls:
            if call.method not in ("to", "copy_"):
                continue
            copy = d2h_copy(facts, call)
            if copy is None:
                continue
            body = _enclosing_body(facts, call)
            if body is None:
                continue
            flow = _Flow(facts, copy)
            flow.block(body)
            if flow.read is None:
                continue
            line = facts.line_of(flow.read.node)
            yield self.finding(
                facts,
                call.node,
                f"non-blocking copy to the host is read by {flow.read.what} (line {line}) before any sync: "
                "values may be stale",
                explanation="`non_blocking=True` returns before the device-to-host copy has landed: the host "
                f"reads whatever the memory held{cost}. Drop `non_blocking=True`, or synchronize "
                "(`torch.cuda.synchronize()`, an event's `synchronize()`) before the read.",
                details={"read_line": line},
                fix=self.planned_fix(FixClass.NUMERICS, "drop non_blocking=True", lambda copy=copy: _plan(facts, copy)),
            )


def _plan(facts: ScriptFacts, copy: _Copy) -> DropKeyword:
    call = copy.call.node
    if copy.flag == "kwargs":
        raise DeclineFix("non_blocking=True comes from a **kwargs dict; drop it there, or synchronize before the read")
    assert copy.argument is not None
    if copy.flag == "name":
        name = facts.code(copy.argument.value)
        raise DeclineFix(f"non_blocking is `{name}`, not a literal: make this copy blocking by hand, or synchronize before the read")
    return DropKeyword(call, copy.argument, KEYWORD)


# -- the fix ------------------------------------------------------------------------------------


def _drop_argument(call: cst.Call, index: int) -> cst.Call:
    """``f(a, k=v)`` without its argument at ``index``, keeping the call's layout: the new last
    argument takes the removed one's comma (a trailing comma stays trailing)."""
    args = list(call.args)
    removed = args.pop(index)
    if args and index == len(args):
        args[-1] = args[-1].with_changes(comma=removed.comma, whitespace_after_arg=removed.whitespace_after_arg)
    return call.with_changes(args=args)


class D2HNonBlockingReadFix(Codemod):
    rule = "TC409"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: DropKeyword = finding.fix.plan  # type: ignore[assignment]
            index = next(i for i, a in enumerate(plan.call.args) if a is plan.argument)
            editor.rewrite_call(plan.call, lambda node, i=index: _drop_argument(node, i))
        return editor.apply(module)
