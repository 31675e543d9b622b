"""Small questions about LibCST syntax trees and source text that several layers ask (the script
analysis, the rules, the model audit's slicing): one home for each."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Mapping
from typing import NamedTuple

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.source.memo import active as active_memo
from tcaudit.source.memo import remembered
from tcaudit.source.parsing import line_starts
from tcaudit.source.triggers import match_span, matches_words_within_lines
from tcaudit.source.walk import attribute_nodes, child_attributes, module_children, walk

_COMMENT = re.compile(r"#[^\n]*")


def strip_comments(text: str) -> str:
    """``text`` without ``#`` comments (a cheap pre-filter for text searches, not a tokenizer: a
    ``#`` inside a string also ends the line's text)."""
    return _COMMENT.sub("", text)


def code_matches(regex: "re.Pattern", text: str) -> bool:
    """``regex.search(strip_comments(text)) is not None``. For a regex whose matches lie within a line and
    look beyond themselves only as ``\\b`` does, a match in ``text`` with no ``#`` before it on its line is
    one in the code, and a match in the code is one in the text (a line's code is the line up to its
    ``#``, which is no word character, as a line's end is not): the document's text then answers as its
    triggers do (tcaudit/source/triggers.py), without stripping and searching it again."""
    if matches_words_within_lines(regex):
        span = match_span(regex, text)
        if span is None:
            return False  # a match in the code is one in the text
        if "#" not in text[text.rfind("\n", 0, span[0]) + 1:span[1]]:
            return True
    return regex.search(strip_comments(text)) is not None


def evaluated_value(node: "cst.BaseString | cst.Integer | cst.Float | cst.Imaginary") -> object:
    """``node.evaluated_value``: a literal's value. A plain string literal (no escapes, no bytes) is read
    off its text; LibCST asks Python's parser for every one (``ast.literal_eval``: about 40 µs, a fifth
    of a 2,000-line file's analysis went there)."""
    if isinstance(node, cst.SimpleString):
        text = node.value
        prefix = node.prefix
        if not prefix.strip("rRuU"):  # none, raw or u
            quote = node.quote
            body = text[len(prefix) + len(quote):len(text) - len(quote)]
            if "\\" not in body and "\r" not in body:
                return body
    return node.evaluated_value


def call_nodes(node: cst.CSTNode) -> list[cst.Call]:
    """Every call under ``node`` (itself included), outermost first."""
    return nodes_of(node, cst.Call)


def nodes_of(node: cst.CSTNode, kind: type) -> list:
    """Every node of type ``kind`` under ``node`` (itself included), in visiting order. (LibCST's
    ``matchers.findall`` does this too, but importing its matchers costs a scan's start-up.) While an
    analysis keeps a memo (tcaudit/source/memo.py), answered from it: a module's answer is its
    top-level statements' answers put together. The list is the caller's to change."""
    memo = active_memo()
    if memo is None:
        return _nodes_of(node, kind)
    return list(_remembered_nodes(memo, node, kind))


def _remembered_nodes(memo, node: cst.CSTNode, kind: type) -> list:
    if not isinstance(node, cst.Module):
        return memo.answer(node, ("nodes", kind), lambda: _of_kind(_everything(memo, node).found, kind))

    def composed() -> list:
        found: list = [node] if isinstance(node, kind) else []
        for child in module_children(node):
            found.extend(_remembered_nodes(memo, child, kind))
        return found

    return memo.answer(node, ("nodes", kind), composed)


def _of_kind(nodes: list, kind: "type | tuple[type, ...]") -> list:
    """``[n for n in nodes if isinstance(n, kind)]``, deciding once per node class: LibCST's node classes
    are ABCs, whose ``isinstance`` is a Python-level call for each node that is not of the class itself."""
    table = _KIND_TABLES.get(kind)
    if table is None:
        table = _KIND_TABLES[kind] = {}
    try:
        return [n for n in nodes if table[type(n)]]
    except KeyError:
        for n in nodes:
            cls = type(n)
            if cls not in table:
                table[cls] = issubclass(cls, kind)
        return [n for n in nodes if table[type(n)]]


# Per kind asked of nodes_of: whether each node class is of it.
_KIND_TABLES: "dict[type | tuple[type, ...], dict[type, bool]]" = {}


def full_name(node: "cst.CSTNode | str") -> "str | None":
    """LibCST's ``get_full_name_for_node`` (``a.b.c`` of a name, attribute, call, subscript, def, class or
    decorator; None for others), its common cases told by the node's class itself: an ``isinstance`` of a
    LibCST class runs ABCMeta's check in Python, and the analysis asks this of a long file's every name."""
    kind = type(node)
    if kind is cst.Name:
        return node.value  # type: ignore[union-attr]
    if kind is cst.Attribute:
        return f"{full_name(node.value)}.{node.attr.value}"  # type: ignore[union-attr]
    if kind is cst.Call:
        return full_name(node.func)  # type: ignore[union-attr]
    if kind in _NAMED:
        return full_name(node.name)  # type: ignore[union-attr]
    if kind is cst.Subscript:
        return full_name(node.value)  # type: ignore[union-attr]
    if kind is cst.Decorator:
        return full_name(node.decorator)  # type: ignore[union-attr]
    if kind is str:
        return node  # type: ignore[return-value]
    if kind in _NOT_NAMED:
        return None
    return get_full_name_for_node(node)  # a subclass: LibCST's own answer


_NAMED = (cst.FunctionDef, cst.ClassDef)
_NOT_NAMED = frozenset((cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
                        cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.BooleanOperation, cst.IfExp,
                        cst.Lambda, cst.Tuple, cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp,
                        cst.SetComp, cst.GeneratorExp, cst.Ellipsis, cst.Await, cst.Yield, cst.NamedExpr,
                        cst.Imaginary, cst.StarredElement))

class _Walked:
    """Every node under a root in visiting order, and each one's parent: one walk answers every
    ``nodes_of`` kind (a filter of the list) and the parents. A walk also answers for each node under
    its root (``found[i:ends[i]]`` is the tree under ``found[i]``): a question about a statement inside
    a function whose walk is remembered slices that walk instead of walking again."""

    __slots__ = ("found", "ends", "parents", "_index")

    def __init__(self, found: list, ends: "list[int] | None", parents: dict[int, cst.CSTNode]) -> None:
        self.found = found
        self.ends = ends  # None for a slice (it is not sliced again: its walk is)
        self.parents = parents
        self._index: "dict[int, int] | None" = None

    def index_of(self, node: cst.CSTNode) -> "int | None":
        """Where ``node`` itself is in ``found``; None where this walk does not hold it."""
        index = self._index
        if index is None:
            index = self._index = {id(n): i for i, n in enumerate(self.found)}
        at = index.get(id(node))
        return at if at is not None and self.found[at] is node else None

    def under(self, node: cst.CSTNode) -> "_Walked | None":
        """The walk of ``node``'s tree sliced from this one, or None where this walk does not hold
        ``node`` itself."""
        at = None if self.ends is None else self.index_of(node)
        if at is None:
            return None
        nodes = self.found[at:self.ends[at]]  # type: ignore[index]
        parents = self.parents
        return _Walked(nodes, None, {key: parents[key] for key in map(id, nodes[1:])})


def _everything(memo, node: cst.CSTNode) -> _Walked:
    """Every node under ``node`` in visiting order, and each one's parent: sliced from a remembered
    walk that holds ``node``, else walked (and remembered as one that holds its nodes)."""
    return memo.answer(node, "everything", lambda: _walk_everything(memo, node))


def _walk_everything(memo, node: cst.CSTNode) -> _Walked:
    enclosing = memo.enclosing(node, "everything")
    if enclosing is not None:
        sliced = enclosing[1].under(node)
        if sliced is not None:
            return sliced
    collector = _Everything()
    walk(node, collector)
    walked = _Walked(collector.found, collector.ends, collector.parents)
    memo.enclose(node, "everything", collector.found)
    return walked


class RemadeWalk(NamedTuple):
    """The walk of a statement remade around a few new nodes (:func:`remade_walk`)."""

    found: list  # its nodes in visiting order
    ends: list[int]  # where each one's tree ends in ``found``
    added: list  # the nodes the statement it was remade from did not have
    removed: list  # the nodes of that statement it does not have


def remade_walk(memo, old: cst.CSTNode, new: cst.CSTNode) -> RemadeWalk | None:
    """Remember the walk of ``new`` (a statement remade from ``old`` around a few new nodes: every other
    node of it is ``old``'s) as put together from ``old``'s remembered walk, each of ``old``'s trees
    taken from it whole and only the new nodes visited. None (nothing remembered) where ``old``'s walk
    is not."""
    walked = memo.peek(old, "everything")
    if walked is None or walked.ends is None:
        return None
    found: list[cst.CSTNode] = []
    ends: list[int] = []
    parents: dict[int, cst.CSTNode] = {}
    added: list[cst.CSTNode] = []  # the nodes not in ``old``'s walk
    taken: list[tuple[int, int]] = []  # the stretches of ``old``'s walk taken whole

    def take(nodes: list, node_ends: list[int], start: int, stop: int) -> None:
        """Nodes ``start`` to ``stop`` of another walk, their trees' ends moved to this one's."""
        offset = len(found) - start
        found.extend(nodes[start:stop])
        ends.extend([end + offset for end in node_ends[start:stop]])

    def add(node: cst.CSTNode, parent: "cst.CSTNode | None") -> None:
        if parent is not None:
            parents[id(node)] = parent
        at = walked.index_of(node)
        if at is not None:
            stop = walked.ends[at]
            take(walked.found, walked.ends, at, stop)
            taken.append((at, stop))
            parents.update({key: walked.parents[key] for key in map(id, walked.found[at + 1:stop])})
            return
        attributes = child_attributes(node)
        if attributes is None:  # a class LibCST walks itself
            collector = _Everything()
            walk(node, collector)
            take(collector.found, collector.ends, 0, len(collector.found))
            parents.update(collector.parents)
            added.extend(collector.found)
            return
        me = len(found)
        found.append(node)
        added.append(node)
        ends.append(0)
        for name in attributes:
            for child in attribute_nodes(getattr(node, name)):
                add(child, node)
        ends[me] = len(found)

    add(new, None)
    made = _Walked(found, ends, parents)
    removed, place = [], 0
    for start, stop in sorted(taken):
        removed.extend(walked.found[place:start])
        place = max(place, stop)
    removed.extend(walked.found[place:])
    memo.answer(new, "everything", lambda: made)
    memo.reenclose(old, new, "everything", found, added, removed)
    return RemadeWalk(found, ends, added, removed)


def _nodes_of(node: cst.CSTNode, kind: type) -> list:
    collector = _Nodes(kind)
    walk(node, collector)
    return collector.found


class _Nodes(cst.CSTVisitor):
    """Collects the nodes of one type. One class for every walk: walk.py keeps a plan per visitor class."""

    def __init__(self, kind: type) -> None:
        super().__init__()
        self.kind = kind
        self.found: list = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True


def parent_map(module: cst.CSTNode) -> "Mapping[int, cst.CSTNode]":
    """Each node's parent, by the child's ``id`` (the root has none). While an analysis keeps a memo,
    answered from it (a module's from its statements' walks); the map is then shared: do not change it."""
    memo = active_memo()
    if memo is None:
        return _parent_map(module)
    return _remembered_parents(memo, module)


def _remembered_parents(memo, node: cst.CSTNode) -> "Mapping[int, cst.CSTNode]":
    if not isinstance(node, cst.Module):
        return _everything(memo, node).parents
    return memo.answer(node, "parents", lambda: _ModuleParents(memo, node))


class _ModuleParents(Mapping):
    """:func:`parent_map` of a module while an analysis keeps a memo: a node's parent from the remembered
    walk of the top-level statement that holds it (the memo says which: ``WalkMemo.enclosing``), so that
    no map of the whole module is put together for the few nodes the rules ask about. After the memo's
    next sweep (an analysis of a later text: the memo may have forgotten this module's statements), and
    to list or count, from a walk of the whole module."""

    def __init__(self, memo, module: cst.Module) -> None:
        self.module = module
        self._memo = memo
        self._sweeps = memo.sweeps
        children = module_children(module)
        for child in children:  # each statement walked, and the memo told which walk holds its nodes
            _everything(memo, child)
        self._children = {id(child) for child in children}
        self._whole: "dict[int, cst.CSTNode] | None" = None

    def get(self, key: int, default=None):  # type: ignore[override]
        if key in self._children:
            return self.module
        if key == id(self.module):
            return default
        memo = self._memo
        if self._whole is None and memo.sweeps == self._sweeps:
            found = memo.enclosing_id(key, "everything")
            if found is None:  # every node of the module is in its statement's walk: not one of them
                parent = default
            elif id(found[0]) in self._children or found[0] is self.module:
                # The memo holds the walk's root: an id among this module's statements' is one of them,
                # and the node of its walk with ``key``'s id is the node asked about.
                parent = found[1].parents.get(key, _NOT_FOUND)
            else:  # a walk of another tree (a fix's) that holds some of these nodes: the whole map
                parent = _NOT_FOUND
            if parent is not _NOT_FOUND and memo.sweeps == self._sweeps:  # (no sweep while asking)
                return parent
        return self.whole().get(key, default)

    def __getitem__(self, key: int) -> cst.CSTNode:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def whole(self) -> dict[int, cst.CSTNode]:
        if self._whole is None:
            self._whole = _parent_map(self.module)
        return self._whole

    def __iter__(self):
        return iter(self.whole())

    def __len__(self) -> int:
        return len(self.whole())


_NOT_FOUND = object()


def _parent_map(module: cst.CSTNode) -> dict[int, cst.CSTNode]:
    collector = _Parents()
    walk(module, collector)
    return collector.parents


class _Parents(cst.CSTVisitor):
    """Each node's parent. The node being left is the top of the stack: its parent is the one below
    (``node.children`` would make LibCST visit every node's children once more to list them)."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[int, cst.CSTNode] = {}
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parents[id(node)] = self.stack[-1]
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class _Everything(cst.CSTVisitor):
    """Every node in visiting order, where each one's tree ends in that list, and each one's parent
    (one walk for all three)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.CSTNode] = []
        self.ends: list[int] = []
        self.parents: dict[int, cst.CSTNode] = {}
        self.stack: list[int] = []  # the indices of the nodes entered and not left

    def on_visit(self, node: cst.CSTNode) -> bool:
        found = self.found
        stack = self.stack
        if stack:
            self.parents[id(node)] = found[stack[-1]]
        stack.append(len(found))
        found.append(node)
        self.ends.append(0)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.ends[self.stack.pop()] = len(self.found)


def enclosing_function(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.FunctionDef | None:
    """The innermost ``def`` around ``node`` (None at module level), by ``parents`` (:func:`parent_map`)."""
    parent = parents.get(id(node))
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        parent = parents.get(id(parent))
    return parent


def param_names(function: cst.FunctionDef, *, stars: bool = True) -> list[str]:
    """The function's parameter names in order: positional-only, ordinary, keyword-only, then (with
    ``stars``) the ``*args`` and ``**kwargs`` names."""
    params = function.params
    names = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
    if stars:
        names += [s.name.value for s in (params.star_arg, params.star_kwarg) if isinstance(s, cst.Param)]
    return names


def keyword(call: cst.Call, key: str | None, position: int | None = None) -> cst.Arg | None:
    """The argument ``call`` passes as ``key=`` (the first, should it repeat one); failing that, with
    ``position``, its positional argument there, ``*args`` and ``**kwargs`` not counted (a negative
    position is none). ``key`` None looks at the position alone. The one look-up of a call's argument
    (``CallSite.arg`` asks it too)."""
    if key is not None:
        found = next((a for a in call.args if a.keyword is not None and a.keyword.value == key), None)
        if found is not None:
            return found
    if position is None or position < 0:
        return None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position] if position < len(positional) else None


def is_main_guard(node: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` (either side first)."""
    if not isinstance(node, cst.If) or not isinstance(node.test, cst.Comparison):
        return False
    test = node.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    names = {full_name(side) for side in sides}
    strings = {evaluated_value(side) for side in sides if isinstance(side, cst.SimpleString)}
    return "__name__" in names and "__main__" in strings


def target_names(target: cst.BaseExpression) -> set[str]:
    """The dotted names an assignment or loop target binds: ``x`` → {"x"}, ``self.a, (b, *c)`` →
    {"self.a", "b", "c"}; a subscript (``x[0] = ...``) binds none."""
    if isinstance(target, (cst.Tuple, cst.List)):
        out: set[str] = set()
        for element in target.elements:
            out |= target_names(element.value)
        return out
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    name = full_name(target)
    return {name} if name and isinstance(target, (cst.Name, cst.Attribute)) else set()


def contains(container: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Whether ``node`` (by identity) is ``container`` or lies inside it (while an analysis keeps a memo,
    looked up in the remembered walk of ``container``)."""
    if node is container:
        return True
    memo = active_memo()
    if memo is not None:
        return _everything(memo, container).index_of(node) is not None
    return any(n is node for n in nodes_of(container, type(node)))


def method_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    """The method ``name`` defined in ``cls``'s own body, if any."""
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    return next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def code_text(text: str) -> str:
    """``text`` with its comments and docstrings (any string that is a statement of its own) blanked out,
    lines and columns kept: what the code says, not what its prose mentions. A string the code uses
    (``os.environ["LOCAL_RANK"]``) stays. Text the tokenizer cannot read gets :func:`strip_comments`."""
    # Offsets of the tokenizer's rows: it reads lines ending at "\n" only (not str.splitlines' "\x0c", "\r"...).
    starts = line_starts(text)
    spans: list[tuple[tuple[int, int], tuple[int, int]]] = []
    statement: list[tokenize.TokenInfo] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                spans.append((token.start, token.end))
            elif token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if statement and all(t.type == tokenize.STRING for t in statement):
                    spans.append((statement[0].start, statement[-1].end))
                statement = []
            elif token.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                statement.append(token)
    except (tokenize.TokenError, SyntaxError):
        return strip_comments(text)
    chars = list(text)
    for (row, col), (end_row, end_col) in spans:
        for index in range(starts[row - 1] + col, starts[end_row - 1] + end_col):
            if chars[index] not in "\r\n":
                chars[index] = " "
    return "".join(chars)


def chain_root(node: cst.Attribute, inner: set[int]) -> cst.BaseExpression | None:
    """What the attribute chain ``node`` ends in (``a`` of ``a.b.c``), where ``node`` is its outermost
    link; None for an inner link (``a.b``), which ``inner`` (the ids of the inner links of the chains
    seen so far, visited after their outermost) holds."""
    if id(node) in inner:
        return None
    value = node.value
    while isinstance(value, cst.Attribute):
        inner.add(id(value))
        value = value.value
    return value


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name and dotted name read in an expression (a new set, the caller's to change)."""
    return set(remembered(node, "names read", lambda: frozenset(_names_read(node))))


def _names_read(node: cst.CSTNode) -> set[str]:
    out: set[str] = set()
    inner: set[int] = set()
    for n in nodes_of(node, _NAMES):  # an attribute chain's outermost link comes before its inner ones
        if type(n) is cst.Name:
            out.add(n.value)
            continue
        # The outermost attribute of a chain names it once, with every prefix (``a.b.c``: also
        # ``a.b``): naming each inner attribute again would walk the chain once per link.
        if chain_root(n, inner) is None:
            continue
        dotted = full_name(n)
        if dotted:
            parts = dotted.split(".")
            out.update(".".join(parts[:end]) for end in range(2, len(parts) + 1))
    return out


_NAMES = (cst.Name, cst.Attribute)
