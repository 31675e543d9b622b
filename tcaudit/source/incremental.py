"""Analyse a new version of a document by re-parsing only the top-level statements that changed.

An editor sends a new text at each keystroke; parsing a 2,000-line file whole costs LibCST about
0.16 s, and each top-level statement parses on its own. :class:`IncrementalState` keeps the last
parsed module of one document. For the next text it finds the lines that changed (the common prefix
and suffix of the two texts), widens them to the top-level statements that hold them (with the one
before where the change reaches a statement's first line of code or the lines above it, and the one
after where the change ends between two: a line typed there may belong to either), parses that
stretch alone and splices its statements into the last module in place of the old ones. Every other
statement is the very object it was, so what the analysis remembered about it (tcaudit/source/memo.py:
node lists, parents, positions, the facts' records) is reused and the walks cost what the edit
changed. The rules still run on the whole module (they relate statements to each other: the loop,
the model, the optimizer); what they ask of the tree is what gets cheaper. An edit
that no rule can notice (a comment, spacing, a new local variable: tcaudit/source/inert.py) is not
analysed at all: the engine keeps the last analysis here (``kept``) and moves its findings.

The spliced module is the module a whole parse gives (tests/test_incremental.py compares them with
``deep_equals`` over random edits of every fixture). Where that could fail, the text is parsed whole
instead: a change in the comments above the first statement, a stretch whose indentation is not the
module's (LibCST keeps one for the module, from its first indented block) or that took away that
first block, a stretch whose parse leaves lines for the next statement, carriage returns, or a
stretch that does not parse on its own (its syntax error then comes from the whole parse).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from tcaudit.source.memo import WalkMemo, remembering

if TYPE_CHECKING:
    import libcst as cst

    from tcaudit.source.parsing import SourceFile


@dataclass
class _Parsed:
    text: str
    module: "cst.Module"
    # Lines of each top-level statement's code, its leading comment and blank lines included.
    statement_lines: list[int]
    first_indented: int  # the index of the first statement with an indented block (len(body): none)


@dataclass
class IncrementalState:
    """What one document's analyses keep for the next one: its last module, the memo of the walks over
    it, and the last analysis's findings (for an edit no rule notices). One analysis at a time uses a
    state (an editor scans each document in turn; a second scan beside it goes without)."""

    memo: WalkMemo = field(default_factory=WalkMemo)
    _last: "_Parsed | None" = None
    # What the last text cost: the statements parsed ("all" for a whole parse).
    reparsed: "int | str" = "all"
    # Held by the analysis using the state (reentrant: the engine holds it around reuse and analysis).
    _lock: "threading.RLock" = field(default_factory=threading.RLock, repr=False)
    # The last analysis's findings, for the next text where its edit is one no rule notices
    # (tcaudit/source/inert.py): kept and reused by tcaudit/engine.py. Whether that happened last time.
    kept: object = field(default=None, repr=False)
    reused: bool = False

    @contextlib.contextmanager
    def analysing(self, source: "SourceFile") -> Iterator[bool]:
        """Around one analysis of ``source``: its module spliced from the last one where the edit
        allows, the walks answered from this document's memo, and afterwards (where it parsed) the
        module kept for the next text and the memo rid of what this analysis did not ask about.
        Yields False, doing none of that, while another analysis of the document holds the state (a
        code action's scan beside the typing's): that one is then an ordinary whole analysis."""
        if not self._lock.acquire(blocking=False):
            yield False
            return
        try:
            with remembering(self.memo):
                self.prepare(source)
                yield True
                if source.parsed_module is not None:
                    self.remember(source)
                    self.memo.sweep()
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def claim(self) -> Iterator[bool]:
        """Hold the state for one scan: yields False (holding nothing) where another thread's scan of the
        document holds it, which then scans without it."""
        if not self._lock.acquire(blocking=False):
            yield False
            return
        try:
            yield True
        finally:
            self._lock.release()

    def statement_starts(self, text: str) -> "list[int] | None":
        """The first line (1-based) of each top-level statement of ``text``, its leading comment and blank
        lines included, where ``text`` is the last one parsed; else None."""
        last = self._last
        if last is None or last.text != text:
            return None
        starts, line = [], len(last.module.header) + 1
        for count in last.statement_lines:
            starts.append(line)
            line += count
        return starts

    def prepare(self, source: "SourceFile") -> None:
        """Give ``source`` a module spliced from the last one where the edit allows; else leave it to
        parse whole on first use."""
        self.reparsed = "all"
        module = self._splice(source)
        if module is not None:
            source.with_module(module)

    def remember(self, source: "SourceFile") -> None:
        """Keep ``source``'s module (parsed) as the one the next text is spliced into."""
        from tcaudit.source.walk import statement_lines

        module = source.parsed_module
        if module is None or "\r" in source.text or not module.has_trailing_newline:
            self._last = None
            return
        last = self._last
        if last is not None and last.module is module:
            return
        counts = [statement_lines(module, statement, self.memo) for statement in module.body]
        self._last = _Parsed(source.text, module, counts, _first_indented(module))

    def _splice(self, source: "SourceFile") -> "cst.Module | None":
        last = self._last
        text = source.text
        if last is None or "\r" in text or not text.endswith("\n") or source.notebook is not None:
            return None
        old_lines = last.text.split("\n")
        new_lines = text.split("\n")
        if old_lines == new_lines:
            return last.module
        prefix = _common_prefix(old_lines, new_lines)
        suffix = _common_suffix(old_lines, new_lines, prefix)
        module = last.module
        if not module.body:
            return None
        # Each statement's first line (0-based): the header's lines come first.
        starts: list[int] = []
        line = len(module.header)
        for count in last.statement_lines:
            starts.append(line)
            line += count
        body_end = line
        # The last line before the change and the first after it (the texts end with a newline: the
        # split's last item is the empty rest after it, common to both).
        before = prefix - 1
        after = len(old_lines) - suffix
        if before < starts[0]:
            return None
        # One statement more before the change: lines a change makes part of the previous statement's
        # last block (a comment indented to its level goes to that block's footer) are parsed with it.
        # Not where the change comes after the statement's first line of code (its header, at the
        # margin): the lines before that are as they were, and so is where they belong.
        at = _statement_at(starts, before)
        header = any(line[:1] not in ("", " ", "\t", "#", "\x0c") for line in old_lines[starts[at]:before + 1])
        if header and at > 0:
            spliced = self._splice_from(at, source, last, old_lines, new_lines, starts, body_end, before, after)
            if spliced is not _OTHER_INDENT:
                return spliced  # type: ignore[return-value]
            # The stretch's first block set another indentation than the module's: with the statement
            # before it, the stretch may take the module's (blocks indented unlike the first block).
        spliced = self._splice_from(max(at - 1, 0), source, last, old_lines, new_lines, starts, body_end, before, after)
        return None if spliced is _OTHER_INDENT else spliced  # type: ignore[return-value]

    def _splice_from(self, first: int, source: "SourceFile", last: "_Parsed", old_lines: list[str],
                     new_lines: list[str], starts: list[int], body_end: int, before: int, after: int) -> object:
        """The module spliced with the stretch from top-level statement ``first`` parsed again; None where it
        cannot be; ``_OTHER_INDENT`` where the stretch's indentation is not the module's."""
        from tcaudit.source.walk import statement_lines

        module = last.module
        text = source.text
        end = len(module.body) - 1
        last_index = end if after >= body_end else _statement_at(starts, max(after, before))
        old_start = starts[first]
        if last_index == end:  # to the end of the file: the footer's lines with it
            old_end, new_end = len(old_lines) - 1, len(new_lines) - 1
        else:
            old_end = starts[last_index] + last.statement_lines[last_index]
            new_end = old_end + (len(new_lines) - len(old_lines))
        if new_end <= old_start:
            return None
        parsed = _parse_region("\n".join(new_lines[old_start:new_end]) + "\n")
        if parsed is None or not parsed.body or (parsed.footer and last_index != end):
            return None
        statements = list(parsed.body)
        if first != 0 and parsed.header:  # lines before the first statement are its leading lines here
            statements[0] = statements[0].with_changes(leading_lines=(*parsed.header, *statements[0].leading_lines))
        # LibCST keeps one indentation for the module: the first indented block's. Where that block is
        # before the stretch, the stretch must have the same; where it is in the stretch, so must the
        # stretch's first block; where it was in the old stretch and the new one has none, parse whole.
        blocks = [i for i, statement in enumerate(statements) if _has_block(statement)]
        if blocks and parsed.default_indent != module.default_indent:
            return _OTHER_INDENT
        if first <= last.first_indented:
            if blocks:
                first_indented = first + blocks[0]
            elif last.first_indented > last_index:
                first_indented = last.first_indented + len(statements) - (last_index + 1 - first)
            else:
                return None
        else:
            first_indented = last.first_indented
        changes: dict = {"body": (*module.body[:first], *statements, *module.body[last_index + 1:])}
        if first == 0:  # lines before the first statement are the module's header
            changes["header"] = (*module.header, *parsed.header)
        if last_index == end:
            changes["footer"] = parsed.footer
        spliced = module.with_changes(**changes)
        counts = [statement_lines(spliced, statement, self.memo) for statement in statements]
        header = len(parsed.header) if first == 0 else 0
        footer = len(parsed.footer) if last_index == end else 0
        if header + sum(counts) + footer != new_end - old_start:
            return None
        self._last = _Parsed(text, spliced, [*last.statement_lines[:first], *counts,
                                             *last.statement_lines[last_index + 1:]], first_indented)
        self.reparsed = len(statements)
        return spliced


def _has_block(statement: "cst.CSTNode") -> bool:
    import libcst as cst

    from tcaudit.source.syntax import nodes_of

    return isinstance(statement, cst.BaseCompoundStatement) and bool(nodes_of(statement, cst.IndentedBlock))


def _parse_region(region: str) -> "cst.Module | None":
    """The stretch parsed on its own (its indentation detected as a whole parse would from its first
    block); None where it does not parse, or is what a whole file would be refused for."""
    import libcst as cst

    from tcaudit.source.parsing import DEEP_NESTING, beyond_analysis, max_bracket_depth

    if max_bracket_depth(region) >= DEEP_NESTING or beyond_analysis(region) is not None:
        return None
    try:
        return cst.parse_module(region)
    except (cst.ParserSyntaxError, RecursionError, MemoryError, ValueError):
        return None


def _first_indented(module: "cst.Module") -> int:
    """The index of the first statement with an indented block (LibCST takes the module's indentation
    from it); ``len(module.body)`` where none has one."""
    return next((i for i, statement in enumerate(module.body) if _has_block(statement)), len(module.body))


_OTHER_INDENT = object()  # what _splice_from says of a stretch indented unlike the module


def _statement_at(starts: list[int], line: int) -> int:
    """The index of the statement whose lines hold ``line`` (0-based), given each one's first line."""
    return max(bisect.bisect_right(starts, line) - 1, 0)


def _common_prefix(a: list[str], b: list[str]) -> int:
    limit = min(len(a), len(b))
    low, high = 0, limit  # a[:low] == b[:low]; the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _common_suffix(a: list[str], b: list[str], prefix: int) -> int:
    limit = min(len(a), len(b)) - prefix
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle:len(a) - low] == b[len(b) - middle:len(b) - low]:
            low = middle
        else:
            high = middle - 1
    return low
