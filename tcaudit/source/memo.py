"""What whole-tree walks found, kept while an analysis runs and, in an editor, from one analysis of a
document to the next.

The rules and the facts ask the same questions of the same trees many times (every call of a module,
each node's parent, every node's position): a 2,000-line file took about thirty walks of its whole
tree per analysis. LibCST trees are immutable, so an answer about a node holds for as long as that
node exists. While a :class:`WalkMemo` is active (:func:`remembering`), ``nodes_of``,
``parent_map`` and ``code_positions`` (tcaudit/source/syntax.py, tcaudit/source/walk.py) answer from
it, and answer for a module by putting together the answers for its top-level statements. After an
edit, tcaudit/source/incremental.py parses only the statements that changed and keeps the other
statement objects as they were, so their answers are reused and the walks cost what the edit changed.

Entries are keyed by the node's identity and hold the node, so an identity is never reused while its
entry lives; :meth:`WalkMemo.sweep` drops what the last analysis did not ask about (the statements
an edit replaced).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterator


class WalkMemo:
    """Answers about nodes, by (node identity, question). One analysis at a time uses one memo."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Hashable], tuple[Any, Any]] = {}
        self._used: set[tuple[int, Hashable]] = set()
        # The last union made for each question (:meth:`union`): (children, their parts, the union, the
        # child of each key).
        self._unions: dict[Hashable, tuple[list, list[dict], dict, dict]] = {}
        # Which remembered answer holds each node it names (:meth:`enclose`): the node's id → the
        # answer's key; and each such answer's node ids, to forget them with it.
        self._inside: dict[int, tuple[int, Hashable]] = {}
        self._enclosed: dict[tuple[int, Hashable], list[int]] = {}
        self.hits = 0
        self.misses = 0

    def answer(self, node: Any, question: Hashable, compute: Callable[[], Any]) -> Any:
        """The answer to ``question`` about ``node``: remembered, or ``compute()`` now and remembered."""
        key = (id(node), question)
        entry = self._entries.get(key)
        self._used.add(key)
        if entry is not None and entry[0] is node:
            self.hits += 1
            return entry[1]
        self.misses += 1
        value = compute()
        self._entries[key] = (node, value)
        return value

    def peek(self, node: Any, question: Hashable) -> Any:
        """The remembered answer to ``question`` about ``node``, or None; not counted as asked (an answer
        only peeked at is forgotten at the next sweep, as the node it is about is gone by then)."""
        entry = self._entries.get((id(node), question))
        return entry[1] if entry is not None and entry[0] is node else None

    def replace(self, node: Any, question: Hashable, value: Any) -> None:
        """Remember ``value`` as the answer to ``question`` about ``node`` from now on (an answer remade for
        another tree that holds the node: the old one need not keep that tree alive)."""
        key = (id(node), question)
        self._used.add(key)
        self._entries[key] = (node, value)

    def union(self, question: Hashable, children: list, part_of: Callable[[Any], dict]) -> "tuple[dict, dict] | None":
        """(the union of the dicts ``part_of(child)`` gives for ``children``, keyed by node ids; the id of
        the child each key came from), shared: do not change them. None where two children share a key
        (then put the parts together as the question needs). Made from the last union for ``question``
        where the children are mostly the same objects (an edit replaced a few top-level statements):
        the parts of the children that went are taken out, those of the ones that came put in, and
        nothing else is touched (a copy of each dict: the last analysis may still read its own). On a
        2,000-line file the positions cost 3.6 ms so against 6.3 ms afresh; the parents (one dict, no
        owners) cost more so than afresh, and are put together afresh."""
        parts = [part_of(child) for child in children]
        last = self._unions.get(question)
        made = _updated_union(last, children, parts) if last is not None else None
        if made is None:
            table: dict = {}
            owners: dict = {}
            for child, part in zip(children, parts):
                table.update(part)
                owners.update(dict.fromkeys(part, id(child)))
            if len(table) != sum(map(len, parts)):
                self._unions.pop(question, None)
                return None
            made = (table, owners)
        self._unions[question] = (list(children), parts, *made)
        return made

    def enclose(self, node: Any, question: Hashable, members: "list[Any]") -> None:
        """Note that the answer to ``question`` about ``node`` (remembered already) holds ``members``,
        the nodes of ``node``'s tree: :meth:`enclosing` finds it from any of them."""
        key = (id(node), question)
        inside = self._inside
        for member in self._enclosed.get(key, ()):  # the answer for an earlier node of that id
            if inside.get(member) == key:
                del inside[member]
        ids = list(map(id, members))
        inside.update(dict.fromkeys(ids, key))
        self._enclosed[key] = ids

    def enclosing(self, node: Any, question: Hashable) -> "tuple[Any, Any] | None":
        """(the root, the answer) of a remembered answer to ``question`` that :meth:`enclose` said holds a
        node with ``node``'s id, or None. The caller checks that the answer holds ``node`` itself (an id
        outlives its node where the answer that named it was remade)."""
        key = self._inside.get(id(node))
        if key is None or key[1] != question:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._used.add(key)
        return entry

    def sweep(self) -> None:
        """Forget what was not asked about since the last sweep (called after each analysis)."""
        used = self._used
        self._entries = {key: entry for key, entry in self._entries.items() if key in used}
        self._used = set()
        if self._enclosed:
            inside = self._inside
            for key in [key for key in self._enclosed if key not in used]:
                for member in self._enclosed.pop(key):
                    if inside.get(member) == key:
                        del inside[member]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enclosed(self) -> int:
        """How many nodes :meth:`enclosing` can find a remembered answer for."""
        return len(self._inside)


def _updated_union(last: tuple[list, list[dict], dict, dict], children: list, parts: list[dict]) -> "tuple[dict, dict] | None":
    """The union of ``parts`` made from ``last`` (see :meth:`WalkMemo.union`), or None where that would
    not be cheaper than making it afresh, or a node came to be in two parts."""
    old_children, old_parts, table, owners = last
    same = min(len(old_children), len(children))
    first = 0
    while first < same and old_children[first] is children[first] and old_parts[first] is parts[first]:
        first += 1
    tail = 0
    while (tail < same - first and old_children[-1 - tail] is children[-1 - tail]
           and old_parts[-1 - tail] is parts[-1 - tail]):
        tail += 1
    gone, came = old_parts[first:len(old_parts) - tail], parts[first:len(parts) - tail]
    if sum(map(len, gone)) + sum(map(len, came)) > len(table) // 2:
        return None
    table, owners = dict(table), dict(owners)
    for part in gone:
        for key in part:
            del table[key]
            del owners[key]
    size = len(table)
    for child, part in zip(children[first:len(children) - tail], came):
        table.update(part)
        owners.update(dict.fromkeys(part, id(child)))
        size += len(part)
    return (table, owners) if len(table) == size else None


_ACTIVE: ContextVar["WalkMemo | None"] = ContextVar("tcaudit_walk_memo", default=None)


def active() -> "WalkMemo | None":
    """The memo of the analysis running in this thread, if any."""
    return _ACTIVE.get()


def remembered(node: Any, question: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()``, an answer about ``node`` that depends on nothing but the tree under it, remembered
    where an analysis keeps a memo (an editor's: for as long as an edit leaves the node as it is). The
    answer is shared: do not change it."""
    memo = _ACTIVE.get()
    return compute() if memo is None else memo.answer(node, question, compute)


@contextlib.contextmanager
def remembering(memo: "WalkMemo | None" = None) -> Iterator[WalkMemo]:
    """Make ``memo`` (a new one by default) the one walks answer from in this thread (and the threads
    it runs the analysis on, which copy its context) until the block ends; a memo already active stays
    where none is given (an analysis inside another shares its memo). A memo serves one analysis at a
    time: it is not locked."""
    current = _ACTIVE.get()
    if current is not None and (memo is None or memo is current):
        yield current
        return
    token = _ACTIVE.set(memo if memo is not None else WalkMemo())
    try:
        yield _ACTIVE.get()  # type: ignore[misc]
    finally:
        _ACTIVE.reset(token)
