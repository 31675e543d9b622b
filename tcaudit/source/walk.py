"""Walk a LibCST tree with a read-only visitor without rebuilding it.

``node.visit(visitor)`` reconstructs every node it passes through, even for a :class:`CSTVisitor`
that changes nothing (LibCST's own TODO: "provide traversal where children are not replaced"), and
that reconstruction costs more than the visitor's own work. :func:`walk` makes the same calls in
the same order (``on_visit``, then for each child attribute in source order ``on_visit_attribute``,
the children, ``on_leave_attribute``, and finally ``on_leave``) by reading the child attributes
directly.

Which attributes a node class visits, and in what order, is learnt from LibCST itself: the first
node of each class is visited one level deep with a recorder. A class whose
``_visit_and_replace_children`` has a branch (its attributes could depend on the node's values,
as for ``FormattedStringExpression.format_spec``) is handed to LibCST's own traversal instead, so
the result never depends on which instance was seen first.
"""

from __future__ import annotations

import dis
import types
from typing import Callable, Iterable, Mapping, NamedTuple, Optional

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

# None: LibCST walks this class itself. A tuple: the child attributes in visiting order.
_CHILD_ATTRIBUTES: dict[type, Optional[tuple[str, ...]]] = {}


class _AttributeRecorder(cst.CSTVisitor):
    """Records the attributes LibCST visits on one node, without descending into its children."""

    def __init__(self, node: cst.CSTNode) -> None:
        super().__init__()
        self.node = node
        self.attributes: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        return None

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.node:
            self.attributes.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None


def _has_branches(function: object) -> bool:
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType):
        return True
    if any(isinstance(const, types.CodeType) for const in code.co_consts):
        return True  # a comprehension or lambda: it may visit a variable set of children
    return any("JUMP" in ins.opname or ins.opname == "FOR_ITER" for ins in dis.get_instructions(code))


def child_attributes(node: cst.CSTNode) -> Optional[tuple[str, ...]]:
    """The attributes LibCST visits on nodes of this class, in order; None when it may vary."""
    cls = type(node)
    try:
        return _CHILD_ATTRIBUTES[cls]
    except KeyError:
        pass
    attributes: Optional[tuple[str, ...]]
    if _has_branches(cls._visit_and_replace_children):
        attributes = None
    else:
        recorder = _AttributeRecorder(node)
        node._visit_and_replace_children(recorder)
        attributes = tuple(recorder.attributes)
    _CHILD_ATTRIBUTES[cls] = attributes
    return attributes


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``node.visit(visitor)`` for a visitor that only reads: the same callbacks in the same order."""
    cls = type(visitor)
    if (
        cls.on_visit_attribute is cst.CSTVisitor.on_visit_attribute
        and cls.on_leave_attribute is cst.CSTVisitor.on_leave_attribute
    ):
        plans = _PLANS.get(cls)
        if plans is None:
            plans = _PLANS[cls] = {}
        _walk_planned(node, visitor, plans)
    else:
        _walk(node, visitor)


def attribute_nodes(value: object) -> "tuple[cst.CSTNode, ...] | list[cst.CSTNode]":
    """The nodes a child attribute's value holds, in visiting order: its items, itself, or none."""
    kind = type(value)
    if kind is tuple or kind is list:
        return value  # type: ignore[return-value]
    if value is None or kind is cst.MaybeSentinel:
        return ()
    return (value,)  # type: ignore[return-value]


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        attributes = child_attributes(node)
        if attributes is None:
            node._visit_and_replace_children(visitor)
        else:
            for name in attributes:
                visitor.on_visit_attribute(node, name)
                for child in attribute_nodes(getattr(node, name)):
                    _walk(child, visitor)
                visitor.on_leave_attribute(node, name)
    visitor.on_leave(node)


# Per visitor class: per node class, (attribute, visit hook, leave hook) in visiting order, or None
# when LibCST walks that class itself. Used when the visitor keeps CSTVisitor's attribute dispatch
# (``visit_<Node>_<attribute>`` looked up by name), so the lookups can be done once.
_Plan = Optional[tuple[tuple[str, Optional[Callable], Optional[Callable]], ...]]
_PLANS: dict[type, dict[type, _Plan]] = {}


def _plan(visitor_class: type, node: cst.CSTNode) -> _Plan:
    attributes = child_attributes(node)
    if attributes is None:
        return None
    name = type(node).__name__
    return tuple(
        (
            attribute,
            getattr(visitor_class, f"visit_{name}_{attribute}", None),
            getattr(visitor_class, f"leave_{name}_{attribute}", None),
        )
        for attribute in attributes
    )


def _walk_planned(node: cst.CSTNode, visitor: cst.CSTVisitor, plans: dict[type, _Plan]) -> None:
    if visitor.on_visit(node):
        cls = type(node)
        try:
            plan = plans[cls]
        except KeyError:
            plan = plans[cls] = _plan(type(visitor), node)
        if plan is None:
            node._visit_and_replace_children(visitor)
        else:
            for name, before, after in plan:
                if before is not None:
                    before(visitor, node)
                value = getattr(node, name)
                kind = type(value)
                if kind is tuple or kind is list:
                    for child in value:
                        _walk_planned(child, visitor, plans)
                elif value is not None and kind is not cst.MaybeSentinel:
                    _walk_planned(value, visitor, plans)
                if after is not None:
                    after(visitor, node)
    visitor.on_leave(node)


class _PositionState(PositionProvidingCodegenState):
    """LibCST's position-recording code generation with cheaper bookkeeping: no regex split per
    token, no generator-based context manager per node, and plain ``(line, column, end line, end
    column)`` tuples keyed by ``id(node)`` until a position is asked for. The positions are the same
    (a test compares them with PositionProvider's on the fixtures and on torchvision)."""

    __slots__ = ()

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            self._update_position(value)
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        computed = self.provider.computed
        key = id(node)
        if key not in computed:  # a syntactic position recorded inside the node wins
            computed[key] = (start[0], start[1], self.line, self.column)

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ) -> "_SyntacticPosition":
        return _SyntacticPosition(self, node, start_node, end_node)


class _SyntacticPosition:
    __slots__ = ("state", "node", "start_node", "end_node", "line", "column")

    def __init__(self, state: _PositionState, node: cst.CSTNode, start_node: Optional[cst.CSTNode],
                 end_node: Optional[cst.CSTNode]) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node
        self.line = state.line
        self.column = state.column

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> bool:
        state = self.state
        computed = state.provider.computed
        if self.start_node is not None:
            line, column = computed[id(self.start_node)][:2]
        else:
            line, column = self.line, self.column
        if self.end_node is not None:
            end_line, end_column = computed[id(self.end_node)][2:]
        else:
            end_line, end_column = state.line, state.column
        computed[id(self.node)] = (line, column, end_line, end_column)
        return False


class _Positions(Mapping):
    """CSTNode → CodeRange, built on first access from the recorded tuples (most nodes' positions
    are never asked for). Keys are node identities: the module it holds keeps them alive. Where the
    tuples were recorded per top-level statement (:func:`code_positions` with a memo), ``offsets``
    holds each node's line offset (the lines before its statement), or ``parts`` each statement's
    tuples and ``statement_offsets`` its offset."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.computed: dict[int, tuple[int, int, int, int]] = {}
        self.offsets: dict[int, int] | None = None
        # Recorded per statement and remembered by a memo: each top-level statement's tuples (the memo
        # says which statement holds a node: WalkMemo.enclosing) and line offset, by its id; the
        # module's own range.
        self.parts: "list[tuple[cst.CSTNode, dict[int, tuple[int, int, int, int]]]] | None" = None
        self.memo = None
        self.question: tuple = ()
        self.statement_offsets: dict[int, int] = {}
        self.whole: tuple[int, int, int, int] | None = None
        self._ranges: dict[int, CodeRange] = {}

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        found = self._ranges.get(key)
        if found is None:
            try:
                if self.whole is not None and node is self.module:
                    line, column, end_line, end_column = self.whole
                elif self.parts is not None:
                    line, column, end_line, end_column = self._in_part(node)
                else:
                    line, column, end_line, end_column = self.computed[key]
            except KeyError:
                raise KeyError(node) from None
            if self.offsets is not None:
                offset = self.offsets[key]
                line, end_line = line + offset, end_line + offset
            found = self._ranges[key] = CodeRange(CodePosition(line, column), CodePosition(end_line, end_column))
        return found

    def _in_part(self, node: cst.CSTNode) -> tuple[int, int, int, int]:
        """The tuple of a node of one of the statements, moved down by the lines before that statement."""
        key = id(node)
        found = self.memo.enclosing(node, self.question)  # type: ignore[union-attr]
        if found is not None:
            statement, (recorded, _, _) = found
            # The memo holds ``statement``: an offset kept by its id is this module's statement's.
            offset = self.statement_offsets.get(id(statement))
            where = recorded.get(key)
            if offset is not None and where is not None:
                return where[0] + offset, where[1], where[2] + offset, where[3]
        for statement, recorded in self.parts:  # type: ignore[union-attr]
            where = recorded.get(key)  # (a memo of a later text: it forgot this one's statements)
            if where is not None:
                offset = self.statement_offsets[id(statement)]
                return where[0] + offset, where[1], where[2] + offset, where[3]
        raise KeyError(key)

    def _holds(self, node: cst.CSTNode) -> bool:
        if self.whole is not None and node is self.module:
            return True
        if self.parts is not None:
            return any(id(node) in recorded for _, recorded in self.parts)
        return id(node) in self.computed

    def __len__(self) -> int:
        if self.parts is not None:
            return sum(len(recorded) for _, recorded in self.parts) + (self.whole is not None)
        return len(self.computed) + (self.whole is not None)

    def __iter__(self):
        nodes: list[cst.CSTNode] = []

        class _Every(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                nodes.append(node)
                return True

        walk(self.module, _Every())
        return iter([node for node in nodes if self._holds(node)])


def code_positions(module: cst.Module) -> "Mapping[cst.CSTNode, CodeRange]":
    """PositionProvider's positions for every node of ``module``.

    ``MetadataWrapper(module).resolve(PositionProvider)`` gives the same mapping, but before the
    provider's code-generation pass it also walks (and rebuilds) the whole tree once for the
    batchable providers, of which there are none here; that walk costs as much as the pass itself.
    While an analysis keeps a memo (tcaudit/source/memo.py), each top-level statement's positions
    are recorded on their own, from its first line, and remembered: a statement an edit did not touch
    costs nothing the next time, only its line offset changes.
    """
    from tcaudit.source.memo import active

    memo = active()
    try:
        if memo is not None and module.has_trailing_newline:
            return _composed_positions(memo, module)
        positions = _Positions(module)
        state = _PositionState(
            default_indent=module.default_indent, default_newline=module.default_newline,
            provider=positions,  # type: ignore[arg-type] - it only needs somewhere to record
        )
        module._codegen(state)
    except (AttributeError, TypeError):  # a LibCST without these internals: take the public road
        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return positions


class StatementPositions(NamedTuple):
    """One top-level statement's code generated on its own (its leading lines included): each of its
    nodes' positions as if its code began the file, the newlines in its code, and the code."""

    recorded: dict[int, tuple[int, int, int, int]]
    lines: int
    code: str


def _statement_positions(module: cst.Module, node: cst.CSTNode) -> StatementPositions:
    positions = _Positions(module)
    state = _PositionState(default_indent=module.default_indent, default_newline=module.default_newline,
                           provider=positions)  # type: ignore[arg-type]
    node._codegen(state)
    return StatementPositions(positions.computed, state.line - 1, "".join(state.tokens))


def statement_positions(module: cst.Module, node: cst.CSTNode, memo) -> StatementPositions:
    """:class:`StatementPositions` of one of ``module``'s top-level statements, remembered in ``memo``
    (where :func:`code_positions` finds them, and which statement holds a node)."""
    question = _positions_question(module)

    def made() -> StatementPositions:
        positions = _statement_positions(module, node)
        memo.enclose(node, question, positions.recorded, ids=True)
        return positions

    return memo.answer(node, question, made)


def _positions_question(module: cst.Module) -> tuple:
    return ("positions", module.default_indent, module.default_newline)


def positions_in_place(module: cst.Module, statements: "tuple[cst.CSTNode, ...]", line: int,
                       depth: int) -> tuple[dict[int, tuple[int, int, int, int]], str]:
    """The positions of ``statements`` (consecutive statements of a block ``depth`` levels deep in a
    top-level statement, the module's indentation at each level) where their code begins on ``line`` of
    that statement's own code, and that code."""
    positions = _Positions(module)
    state = _PositionState(default_indent=module.default_indent, default_newline=module.default_newline,
                           provider=positions, indent_tokens=[module.default_indent] * depth,  # type: ignore[arg-type]
                           line=line, column=0)
    for statement in statements:
        statement._codegen(state)
    return positions.computed, "".join(state.tokens)


def remade_positions(old: StatementPositions, order: list, region: range, remade: "dict[int, cst.CSTNode]",
                     placed: dict[int, tuple[int, int, int, int]],
                     old_span: tuple[int, int, int, int], new_span: tuple[int, int, int, int],
                     shift: int, code: str) -> "StatementPositions | None":
    """The positions of a top-level statement remade around new statements (tcaudit/source/incremental.py),
    from the old statement's: ``order`` is the new statement's nodes in visiting order, ``region`` the
    indices of the new statements' nodes there (``placed`` their positions), ``remade`` the old node each
    remade one (on the way from the top to the new statements) stands for. A node before the region is
    where it was; one after it is ``shift`` lines further. A remade node (a block, a statement holding
    it) begins where it began, or where the new statements begin where it began with the old ones (a
    block begins with its first statement), and ends ``shift`` lines further, or where the new
    statements end where it ended with the old ones (``old_span``, ``new_span``: where the old
    statements and the new ones begin and end). None where the old positions lack a node."""
    recorded = old.recorded
    old_start, old_end = old_span[:2], old_span[2:]
    new_start, new_end = new_span[:2], new_span[2:]
    out: dict[int, tuple[int, int, int, int]] = {}
    try:
        for index in range(region.start):
            node = order[index]
            key = id(node)
            stood_for = remade.get(key)
            if stood_for is None:
                out[key] = recorded[key]
                continue
            line, column, end_line, end_column = recorded[id(stood_for)]
            start, end = (line, column), (end_line, end_column)
            out[key] = (*(new_start if start == old_start else start),
                        *(new_end if end == old_end else (end_line + shift, end_column)))
        for index in range(region.stop, len(order)):
            key = id(order[index])
            line, column, end_line, end_column = recorded[key]
            out[key] = (line + shift, column, end_line + shift, end_column)
    except KeyError:
        return None
    out.update(placed)
    return StatementPositions(out, old.lines + shift, code)


def remember_statement_positions(module: cst.Module, node: cst.CSTNode, memo, positions: StatementPositions,
                                 remade: "tuple[cst.CSTNode, Iterable[cst.CSTNode], Iterable[cst.CSTNode]] | None"
                                 = None) -> None:
    """Have ``memo`` answer :func:`statement_positions` for ``node`` with ``positions`` (made otherwise).
    ``remade``: the statement ``node`` was remade from, whose positions the memo holds, the nodes ``node``
    has that it had not, and the nodes it had that ``node`` has not."""
    question = _positions_question(module)
    memo.replace(node, question, positions)
    if remade is None:
        memo.enclose(node, question, positions.recorded, ids=True)
    else:
        memo.reenclose(remade[0], node, question, positions.recorded, remade[1], remade[2])


def statement_lines(module: cst.Module, node: cst.CSTNode, memo=None) -> int:
    """The lines of one of ``module``'s top-level statements (its leading comment and blank lines
    included), from ``memo`` where it recorded the statement's positions."""
    if memo is None:
        return module.code_for_node(node).count("\n")
    return statement_positions(module, node, memo).lines


def module_children(module: cst.Module) -> list[cst.CSTNode]:
    """The module's children in visiting order: its header's lines, its statements, its footer's lines."""
    return [*module.header, *module.body, *module.footer]


def _composed_positions(memo, module: cst.Module) -> _Positions:
    question = _positions_question(module)

    def composed() -> _Positions:
        positions = _Positions(module)
        offset = 0
        parts = []
        for child in module_children(module):
            recorded, lines, _ = statement_positions(module, child, memo)
            parts.append((child, recorded))
            positions.statement_offsets[id(child)] = offset
            offset += lines
        positions.parts, positions.memo, positions.question = parts, memo, question
        positions.whole = (1, 0, offset + 1 if any(recorded for _, recorded in parts) else 2, 0)  # empty: its newline
        return positions

    return memo.answer(module, ("module positions", *question[1:]), composed)