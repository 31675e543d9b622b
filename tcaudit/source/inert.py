"""Whether an edit of a document leaves every script rule's findings as they were, only moved.

The editor scans a document at each keystroke, and many keystrokes change nothing a rule reads: a
comment, a blank line, spacing. For such an edit the last analysis's findings stand, moved to where
their lines are now, and the facts and the rules need not run again (tcaudit/engine.py keeps the last
analysis of each document for this).

An edit is *inert* when all of these hold (anything else is analysed again in full):

* the new text parses (Python's own parser), and its top-level statements before and after the
  changed stretch are the old ones, moved by the lines the edit added or took away;
* the statements the edit touched have the same syntax trees as before, positions aside: only
  comments, blank lines and spacing changed. (A statement added, even one binding a new name to a
  number, is not inert: rules read the shape of blocks, such as "the ``amp.scale_loss`` block does
  more than the backward".)
* no text the edit added or took away (its whole lines) holds anything the analysis reads of a text
  (:class:`Vocabulary`, from tcaudit/rules/text_table.py: every pattern the rules and the script
  analysis search with, the words they compare names with, the pieces they look for): a comment that
  mentions ``channels_last`` or ``torchrun`` is analysed again;
* no file the last analysis read besides the document (a project module, a config beside the
  script) changed since (:func:`recording_reads`).

The findings' positions are mapped by :class:`Shift`; a position inside the changed stretch cannot be
mapped, and then the text is analysed again too. tests/test_inert_edits.py replays random edits of
real-world-shaped files and checks that what this reuses equals a full analysis after every edit.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Iterable, Iterator

from tcaudit.source.parsing import common_prefix, common_suffix, line_starts

_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"#[^\n]*")  # a comment (or the rest of a string holding ``#``: it is in the tree too)


class Shift:
    """Where positions of the old text are in the new one: the texts differ only in one stretch
    (``old[start:old_end]`` became ``new[start:new_end]``). Lines are 1-based, columns 1-based code
    points, as :class:`~tcaudit.findings.Location` and :class:`~tcaudit.findings.TextEdit` count them."""

    def __init__(self, old: str, new: str) -> None:
        start = common_prefix(old, new)
        end = common_suffix(old, new, start)
        old_end, new_end = len(old) - end, len(new) - end
        if old_end == start or new_end == start:
            # Lines added or taken away: slid back to a line's start where they can be (``"    a = 1\n"``
            # typed before an indented line matches its indentation first), so that what follows them
            # is after the change, not at its edge.
            inserted = old_end == start
            changed, stop = (new, new_end) if inserted else (old, old_end)
            while start > 0 and old[start - 1] != "\n" and changed[stop - 1] == old[start - 1]:
                start, stop = start - 1, stop - 1
            old_end, new_end = (start, stop) if inserted else (stop, start)
        self.start = start
        self.old_end = old_end
        self.new_end = new_end
        self._at_line_start = start == 0 or old[start - 1] == "\n"
        self.delta = self.new_end - self.old_end
        self._old_starts = line_starts(old)
        self._new_starts = line_starts(new)
        self.line_delta = len(self._new_starts) - len(self._old_starts)

    @property
    def unchanged(self) -> bool:
        return self.start == self.old_end == self.new_end

    def offset(self, line: int, column: int) -> int | None:
        """The old text's offset of (line, column), or None where there is no such line."""
        if not 1 <= line <= len(self._old_starts):
            return None
        return self._old_starts[line - 1] + column - 1

    def position(self, line: int, column: int, end: bool = False) -> tuple[int, int] | None:
        """(line, column) of the old text in the new one: of a first character, or (``end``) of the
        exclusive end of a stretch; None where it is in the changed stretch or at an edge of it that
        could belong to either side."""
        offset = self.offset(line, column)
        if offset is None:
            return None
        start, old_end = self.start, self.old_end
        if offset < start or (end and offset == start):
            moved = offset
        elif offset > old_end or (not end and offset == old_end and (old_end > start or self._at_line_start)):
            moved = offset + self.delta
        else:
            return None
        index = bisect.bisect_right(self._new_starts, moved) - 1
        return index + 1, moved - self._new_starts[index] + 1

    def span(self, line: int, column: int, end_line: int, end_column: int) -> tuple[int, int, int, int] | None:
        """A stretch of the old text in the new one, None where either end cannot be placed."""
        first = self.position(line, column)
        last = self.position(end_line, end_column, end=True)
        if first is None or last is None:
            return None
        return (*first, *last)

    def clear_of(self, line: int, column: int, end_line: int, end_column: int) -> bool:
        """Whether the stretch neither touches nor holds the changed one (a text edit made from the old
        text, of a stretch that holds the change, would undo the change)."""
        first = self.offset(line, column)
        last = self.offset(end_line, end_column)
        if first is None or last is None:
            return False
        return last < self.start or first > self.old_end


class Vocabulary:
    """What the analysis reads of a text: its patterns, the words it compares names with, the pieces it
    looks for with ``in`` (tcaudit/rules/text_table.py)."""

    def __init__(self, patterns: Iterable[tuple[str, int]], words: Iterable[str], pieces: Iterable[str]) -> None:
        self.patterns = [re.compile(pattern, flags) for pattern, flags in patterns]
        self.words = frozenset(words)
        self.pieces = tuple(pieces)

    def notices(self, text: str) -> bool:
        """Whether some part of the analysis could read something in ``text``: lines of code, whose
        names (outside comments) a rule may compare with its words."""
        return any(word in self.words for word in _WORD.findall(_COMMENT.sub("", text))) or self.searched(text)

    def searched(self, text: str) -> bool:
        """Whether a search of the analysis's in a file's text could find something in ``text``."""
        return any(piece in text for piece in self.pieces) or any(pattern.search(text) for pattern in self.patterns)


class Outline:
    """A text's top-level statements as chunks of lines: each chunk's first line (1-based) and, once
    parsed, its statements' trees. A chunk starts where a top-level statement (or the comments and
    decorators in front of it) starts, so each parses alone. Kept from one edit to the next: only the
    chunks an edit touches are parsed (after an editor's analysis, the chunks are LibCST's statements:
    tcaudit/source/incremental.py knows their lines)."""

    def __init__(self, lines: list[str], starts: list[int], chunks: "list[list[ast.stmt] | None]") -> None:
        self.lines = lines
        self.starts = starts
        self.chunks = chunks

    @classmethod
    def parse(cls, text: str, first_line: int = 1) -> "Outline | None":
        """The outline of ``text`` (whose first line is ``first_line`` of the file), every chunk parsed;
        None where it does not parse."""
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return None
        starts: list[int] = []
        chunks: list[list[ast.stmt] | None] = []
        for statement in tree.body:
            decorators = getattr(statement, "decorator_list", None) or ()
            start = min([statement.lineno, *(d.lineno for d in decorators)]) + first_line - 1
            if starts and starts[-1] == start:  # ``a = 1; b = 2``: one line, one chunk
                chunks[-1].append(statement)  # type: ignore[union-attr]
            else:
                starts.append(start)
                chunks.append([statement])
        return cls(text.split("\n"), starts, chunks)

    @classmethod
    def of_chunks(cls, text: str, starts: list[int]) -> "Outline":
        """The outline of ``text`` whose chunks start at ``starts``, none parsed yet."""
        return cls(text.split("\n"), starts, [None] * len(starts))

    def touched(self, first: int, last: int) -> tuple[int, int]:
        """(i, j): the chunks ``i..j-1`` hold a line from ``first`` to ``last``."""
        starts = self.starts
        i = max(bisect.bisect_right(starts, first) - 1, 0)
        j = max(bisect.bisect_right(starts, last), i)
        return i, j

    def statements(self, i: int, j: int) -> "list[ast.stmt] | None":
        """The statements of chunks ``i..j-1``, parsing those not parsed yet; None where one does not."""
        out: list[ast.stmt] = []
        for k in range(i, j):
            chunk = self.chunks[k]
            if chunk is None:
                end = self.starts[k + 1] - 1 if k + 1 < len(self.starts) else len(self.lines)
                try:
                    chunk = ast.parse("\n".join(self.lines[self.starts[k] - 1:end]) + "\n").body
                except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
                    return None
                self.chunks[k] = chunk
            out.extend(chunk)
        return out


def inert_edit(old: str, outline: Outline | None, new: str, vocabulary: Vocabulary
               ) -> tuple[Shift, Outline] | None:
    """(the shift, the new text's outline) where the edit from ``old`` (whose outline is ``outline``) to
    ``new`` is inert (the module docstring), else None."""
    if outline is None:
        return None
    shift = Shift(old, new)
    if shift.unchanged:
        return shift, outline
    removed, added = _changed_lines(old, shift.start, shift.old_end), _changed_lines(new, shift.start, shift.new_end)
    if vocabulary.notices(removed) or vocabulary.notices(added):
        return None
    # Code that changed (not comments or spacing alone) is told without parsing: the lines around the
    # change, comments and whitespace taken out, differ. (Where they are the same, the trees decide.)
    before, after = _lines_around(old, shift.start, shift.old_end), _lines_around(new, shift.start, shift.new_end)
    if _code_of(before) != _code_of(after):
        return None
    first = old.count("\n", 0, shift.start) + 1  # the first changed line (the same in both texts)
    last = old.count("\n", 0, shift.old_end) + 1
    i, j = outline.touched(first, last)
    # The stretch of whole top-level statements that holds the change, parsed alone in the new text: the
    # text around it is the same, and starts (or ends) with a whole statement at the margin.
    starts = outline.starts
    top = starts[i] if i < len(starts) and starts[i] <= first else 1
    if i == 0:
        top = 1
    bottom = starts[j] - 1 if j < len(starts) else None  # the old stretch's last line
    new_lines = new.split("\n")
    end = len(new_lines) if bottom is None else bottom + shift.line_delta
    if end < top - 1:
        return None
    stretch = Outline.parse("\n".join(new_lines[top - 1:end]) + "\n", top)
    if stretch is None:
        return None
    old_statements = outline.statements(i, j)
    if old_statements is None:
        return None
    if _shapes(old_statements) != _shapes(stretch.statements(0, len(stretch.starts)) or []):
        return None
    new_outline = Outline(new_lines,
                          [*starts[:i], *stretch.starts, *(line + shift.line_delta for line in starts[j:])],
                          [*outline.chunks[:i], *stretch.chunks, *outline.chunks[j:]])
    return shift, new_outline


def _changed_lines(text: str, start: int, end: int) -> str:
    """The whole lines that hold ``text[start:end]`` (the changed stretch with its lines' context)."""
    if start == end:  # nothing here: the other text's side holds the lines around it
        return ""
    first = text.rfind("\n", 0, start) + 1
    last = end - 1 if text[end - 1] == "\n" else text.find("\n", end)
    return text[first:len(text) if last < 0 else last]


def _lines_around(text: str, start: int, end: int) -> str:
    """The whole lines that hold ``text[start:end]``, or the line ``start`` is in where that is empty."""
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    return text[first:len(text) if last < 0 else last]


def _code_of(lines: str) -> str:
    """``lines`` without ``#`` comments and whitespace (a ``#`` in a string ends the line's text too: a
    necessary condition only)."""
    return _NOT_CODE.sub("", lines)


_NOT_CODE = re.compile(r"#[^\n]*|\s+")


def _shapes(statements: Iterable[ast.AST], depth: int = 0) -> list[tuple[int, str]]:
    """Every statement under these, in order: (nesting depth, its tree without the statements it holds
    and without positions). Exception handlers and match cases count as statements."""
    out: list[tuple[int, str]] = []
    for statement in statements:
        fields, nested = {}, []
        for name, value in ast.iter_fields(statement):
            if isinstance(value, list) and value and isinstance(value[0], _BLOCK_ITEMS):
                nested.append(value)
                value = []
            fields[name] = value
        out.append((depth, ast.dump(type(statement)(**fields))))
        for block in nested:
            out.extend(_shapes(block, depth + 1))
    return out


_BLOCK_ITEMS = (ast.stmt, ast.excepthandler, ast.match_case)


# -- the files an analysis read besides the document -----------------------------------------------

_READS: ContextVar["dict[str, tuple[int, int, int] | None] | None"] = ContextVar("tcaudit_reads", default=None)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


_UNSTAMPED = object()


def note_read(path: Path | str, stamp: "tuple[int, int, int] | None | object" = _UNSTAMPED) -> None:
    """Record that the analysis running in this thread read ``path`` (a file, or a folder it listed),
    with its (modification time, size, inode) where the caller has it (None: it was not there)."""
    reads = _READS.get()
    if reads is not None:
        key = os.fspath(path)
        if key not in reads:
            reads[key] = _stamp(key) if stamp is _UNSTAMPED else stamp  # type: ignore[assignment]


@contextlib.contextmanager
def recording_reads(folder: Path | None) -> Iterator[dict[str, tuple[int, int, int] | None]]:
    """Record, while the block runs, the files the analysis reads besides the document (and the
    document's folder, whose listing decides which modules and configs are there)."""
    reads: dict[str, tuple[int, int, int] | None] = {}
    token = _READS.set(reads)
    try:
        if folder is not None:
            note_read(folder)
        yield reads
    finally:
        _READS.reset(token)


def reads_unchanged(reads: dict[str, tuple[int, int, int] | None]) -> bool:
    """Whether every file (and folder) recorded is as it was."""
    return all(_stamp(path) == stamp for path, stamp in reads.items())
