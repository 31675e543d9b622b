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
from typing import Any, Callable, Hashable, Iterable, Iterator


class WalkMemo:
    """Answers about nodes, by (node identity, question). One analysis at a time uses one memo."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Hashable], tuple[Any, Any]] = {}
        self._used: set[tuple[int, Hashable]] = set()
        # Which remembered answer holds each node it names (:meth:`enclose`), per question: the node's id
        # → a cell holding the answer's key (one cell per answer: :meth:`reenclose` hands an answer's nodes
        # to another by changing the key in it); and each such answer's cell and node ids (in chunks, one
        # per answer they were handed on from), to forget them with it.
        self._inside: dict[Hashable, dict[int, list]] = {}
        self._enclosed: dict[tuple[int, Hashable], tuple[list, list[list[int]]]] = {}
        self.hits = 0
        self.misses = 0
        self.analyses = 0  # analyses begun (:meth:`begin`): what an earlier one made may since have changed
        self.sweeps = 0  # how many times it forgot what was not asked about
        # The source a document's analysis reads now (IncrementalState.analysing): facts of that source
        # may keep what they made of the document's last text; not those of another file read meanwhile.
        self.document: Any = None
        # The nodes the document's last splice remade around an edit inside a top-level statement (the
        # statements and blocks on the way down to it: tcaudit/source/incremental.py), by the new node's
        # id, and the node each stands for; empty where the analysis is of a text not spliced that way.
        self.remade: dict[int, Any] = {}

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

    def enclose(self, node: Any, question: Hashable, members: "Iterable[Any]", ids: bool = False) -> None:
        """Note that the answer to ``question`` about ``node`` holds ``members``, the nodes of ``node``'s
        tree (their ids where ``ids``): :meth:`enclosing` finds it from any of them."""
        key = (id(node), question)
        inside = self._inside.setdefault(question, {})
        self._unenclose(key, inside)  # the answer for an earlier node of that id
        cell = [key]
        member_ids = list(members) if ids else list(map(id, members))
        inside.update(dict.fromkeys(member_ids, cell))
        self._enclosed[key] = (cell, [member_ids])

    def reenclose(self, old: Any, node: Any, question: Hashable, members: "Iterable[Any]", added: "Iterable[Any]",
                  removed: "Iterable[Any]", ids: bool = False) -> None:
        """:meth:`enclose` for ``node``, a tree remade from ``old`` around a few new nodes: ``members`` are
        ``old``'s, less ``removed``, and ``added``. ``old``'s nodes are handed to ``node``'s answer at
        once, and only the nodes added and removed are noted one by one."""
        old_key, key = (id(old), question), (id(node), question)
        held = self._enclosed.pop(old_key, None)
        entry = self._entries.get(old_key)
        if held is None or entry is None or entry[0] is not old:
            if held is not None:
                self._enclosed[old_key] = held
            self.enclose(node, question, members, ids)
            return
        inside = self._inside.setdefault(question, {})
        self._unenclose(key, inside)
        cell, chunks = held
        cell[0] = key
        for member in (removed if ids else map(id, removed)):
            if inside.get(member) is cell:
                del inside[member]
        added_ids = list(added) if ids else list(map(id, added))
        inside.update(dict.fromkeys(added_ids, cell))
        chunks.append(added_ids)
        if len(chunks) > 64:  # one chunk per edit: now and then one again, rid of the ids removed since
            chunks[:] = [[member for chunk in chunks for member in chunk if inside.get(member) is cell]]
        self._enclosed[key] = held

    def _unenclose(self, key: tuple[int, Hashable], inside: dict[int, list]) -> None:
        held = self._enclosed.pop(key, None)
        if held is None:
            return
        cell, chunks = held
        for chunk in chunks:
            for member in chunk:
                if inside.get(member) is cell:
                    del inside[member]

    def enclosing(self, node: Any, question: Hashable) -> "tuple[Any, Any] | None":
        """(the root, the answer) of a remembered answer to ``question`` that :meth:`enclose` said holds a
        node with ``node``'s id, or None. The caller checks that the answer holds ``node`` itself (an id
        outlives its node where the answer that named it was remade)."""
        return self.enclosing_id(id(node), question)

    def enclosing_id(self, member: int, question: Hashable) -> "tuple[Any, Any] | None":
        """:meth:`enclosing` of the node whose id is ``member``."""
        inside = self._inside.get(question)
        cell = inside.get(member) if inside is not None else None
        if cell is None:
            return None
        key = cell[0]
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._used.add(key)
        return entry

    def begin(self) -> None:
        """Start noting what is asked about anew (an analysis begins): the next :meth:`sweep` forgets what
        was not asked about since."""
        self.analyses += 1
        self._used = set()

    def sweep(self) -> None:
        """Forget what was not asked about since the last sweep or :meth:`begin` (called after an
        analysis)."""
        self.sweeps += 1
        used = self._used
        entries = self._entries
        for key in entries.keys() - used:  # few: the statements an edit replaced
            del entries[key]
        self._used = set()
        if self._enclosed:
            for key in self._enclosed.keys() - used:
                self._unenclose(key, self._inside[key[1]])

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enclosed(self) -> int:
        """How many nodes :meth:`enclosing` can find a remembered answer for (for the question it finds
        most for)."""
        return max(map(len, self._inside.values()), default=0)


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
