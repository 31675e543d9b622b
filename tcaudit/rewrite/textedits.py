"""A fix as a list of text edits: replacements of ranges of the original text.

What ``scan`` hands to machines (JSON ``fix.edits``, SARIF ``fixes``, the Python API, an editor's
quick fix) is the change one finding's fix makes, as ruff gives it: each edit replaces the text from
``(line, column)`` to ``(end_line, end_column)`` (1-based, columns in code points, the end exclusive)
with ``content``. Edits of one fix never overlap; applied together to the text they were made from,
they give exactly the text the fix writes.
"""

from __future__ import annotations

import bisect
import difflib
import re
from typing import Callable, Iterable, Sequence

from tcaudit.findings import TextEdit
from tcaudit.source.parsing import common_prefix, common_suffix

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def source_lines(text: str) -> list[str]:
    """The lines of ``text`` with their endings, as Python's tokenizer (and LibCST) counts them: only
    ``\n``, ``\r\n`` and ``\r`` end a line (``str.splitlines`` also splits at form feeds and more)."""
    return _LINE.findall(text)


class _Lines:
    """Offsets ↔ (line, column) for one text; a line ends after its ``\\n``, ``\\r\\n`` or lone ``\\r``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        for line in source_lines(text):
            self.starts.append(self.starts[-1] + len(line))
        # The last entry is the end of the text: the start of the line after the last one.

    def position(self, offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(self.starts, offset) - 1
        index = min(index, len(self.starts) - 1)
        return index + 1, offset - self.starts[index] + 1

    def offset(self, line: int, column: int) -> int:
        if not 1 <= line <= len(self.starts):
            raise ValueError(f"line {line} is outside the text ({len(self.starts) - 1} lines)")
        offset = self.starts[line - 1] + column - 1
        limit = self.starts[line] if line < len(self.starts) else len(self.text)
        if column < 1 or offset > max(limit, self.starts[line - 1]):
            raise ValueError(f"column {column} is outside line {line}")
        return offset


def edits_between(old: str, new: str) -> tuple[TextEdit, ...]:
    """The smallest edits (one per changed run of lines, trimmed to the characters that change) that
    turn ``old`` into ``new``."""
    if old == new:
        return ()
    old_lines = source_lines(old)
    new_lines = source_lines(new)
    where = _Lines(old)
    new_starts = [0]
    for line in new_lines:
        new_starts.append(new_starts[-1] + len(line))
    edits: list[TextEdit] = []
    for i1, i2, j1, j2 in changed_runs(old_lines, new_lines):
        start, end = where.starts[i1], where.starts[i2]
        removed, added = old[start:end], new[new_starts[j1]:new_starts[j2]]
        prefix = common_prefix(removed, added)
        suffix = common_suffix(removed, added, prefix)
        start, end = start + prefix, end - suffix
        content = added[prefix:len(added) - suffix]
        line, column = where.position(start)
        end_line, end_column = where.position(end)
        edits.append(TextEdit(line, column, end_line, end_column, content))
    return tuple(edits)


_SMALL = 40_000  # a gap of lines this small (old × new) is compared exhaustively (difflib)
_WHOLE = 9_000_000  # a text up to ~3,000 lines a side is compared by difflib alone, as it always was


def changed_runs(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """The runs of lines (a[i1:i2] → b[j1:j2]) that differ between ``a`` and ``b``, in order, in time
    about linear in the lines: the common start and end are set aside, lines that occur once in each
    side anchor the rest (patience diffing), and only the small gaps between anchors go to difflib,
    whose matcher is quadratic on a file of many repeated lines (a 10,000-line file of similar
    training steps took minutes). A gap too large for it is one run: still exact, only less small.
    Texts up to about 3,000 lines a side go to difflib whole, so that where an edit lands among equal
    lines (an insertion between blank lines) is as it always was."""
    if len(a) * len(b) <= _WHOLE:  # as difflib places them (where an insertion among blank lines goes)
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    runs: list[tuple[int, int, int, int]] = []
    pending = [(0, len(a), 0, len(b))]
    while pending:
        lo_a, hi_a, lo_b, hi_b = pending.pop()
        while lo_a < hi_a and lo_b < hi_b and a[lo_a] == b[lo_b]:
            lo_a, lo_b = lo_a + 1, lo_b + 1
        while lo_a < hi_a and lo_b < hi_b and a[hi_a - 1] == b[hi_b - 1]:
            hi_a, hi_b = hi_a - 1, hi_b - 1
        if lo_a == hi_a and lo_b == hi_b:
            continue
        if lo_a == hi_a or lo_b == hi_b:
            runs.append((lo_a, hi_a, lo_b, hi_b))
            continue
        anchors = _unique_anchors(a, b, lo_a, hi_a, lo_b, hi_b)
        if anchors:
            edges = [(lo_a - 1, lo_b - 1), *anchors, (hi_a, hi_b)]
            for (i, j), (next_i, next_j) in zip(edges, edges[1:]):
                pending.append((i + 1, next_i, j + 1, next_j))
        elif (hi_a - lo_a) * (hi_b - lo_b) <= _SMALL:
            matcher = difflib.SequenceMatcher(None, a[lo_a:hi_a], b[lo_b:hi_b], autojunk=False)
            runs.extend((lo_a + i1, lo_a + i2, lo_b + j1, lo_b + j2)
                        for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")
        else:
            runs.append((lo_a, hi_a, lo_b, hi_b))
    return sorted(runs)


def _unique_anchors(a: Sequence[str], b: Sequence[str], lo_a: int, hi_a: int, lo_b: int, hi_b: int
                    ) -> list[tuple[int, int]]:
    """Pairs (i, j) of lines that occur exactly once in a[lo_a:hi_a] and once in b[lo_b:hi_b], the
    longest run of them in the same order on both sides."""
    count_a: dict[str, int] = {}
    for i in range(lo_a, hi_a):
        count_a[a[i]] = count_a.get(a[i], 0) + 1
    where_b: dict[str, int] = {}
    count_b: dict[str, int] = {}
    for j in range(lo_b, hi_b):
        count_b[b[j]] = count_b.get(b[j], 0) + 1
        where_b[b[j]] = j
    pairs = [(i, where_b[a[i]]) for i in range(lo_a, hi_a) if count_a[a[i]] == 1 and count_b.get(a[i]) == 1]
    if not pairs:
        return []
    # The longest increasing run of j (patience sorting), pairs already in increasing i.
    tails: list[int] = []  # tails[k]: index into pairs of the smallest last j of a run of length k + 1
    previous: list[int] = [-1] * len(pairs)
    for index, (_, j) in enumerate(pairs):
        k = _bisect_tails(pairs, tails, j)
        if k > 0:
            previous[index] = tails[k - 1]
        if k == len(tails):
            tails.append(index)
        else:
            tails[k] = index
    chain = []
    index = tails[-1]
    while index >= 0:
        chain.append(pairs[index])
        index = previous[index]
    return chain[::-1]


def _bisect_tails(pairs: list[tuple[int, int]], tails: list[int], j: int) -> int:
    lo, hi = 0, len(tails)
    while lo < hi:
        mid = (lo + hi) // 2
        if pairs[tails[mid]][1] < j:
            lo = mid + 1
        else:
            hi = mid
    return lo


def apply_edits(text: str, edits: Iterable[TextEdit]) -> str:
    """``text`` with ``edits`` made (all of them relative to ``text``). Raises ValueError when two
    edits overlap or one lies outside the text."""
    where = _Lines(text)
    spans = sorted((where.offset(e.line, e.column), where.offset(e.end_line, e.end_column), e.content) for e in edits)
    out: list[str] = []
    at = 0
    for start, end, content in spans:
        if start < at or end < start:
            raise ValueError("overlapping or inverted edits")
        out.append(text[at:start])
        out.append(content)
        at = end
    out.append(text[at:])
    return "".join(out)


def overlapping(first: Sequence[TextEdit], second: Sequence[TextEdit]) -> bool:
    """Whether any edit of ``first`` touches the range of one of ``second`` (two insertions at one
    place count: their order would decide the text)."""
    for a in first:
        for b in second:
            if (a.line, a.column) <= (b.end_line, b.end_column) and (b.line, b.column) <= (a.end_line, a.end_column):
                return True
    return False


def line_map(old: str, new: str) -> dict[int, int]:
    """Where each line of ``old`` stands in ``new`` (1-based): a kept line exactly, a changed line at its
    place among the lines that replace it, a deleted line at the new line that follows where it was
    (at most the last line)."""
    out: dict[int, int] = {}
    new_lines = source_lines(new)
    matcher = difflib.SequenceMatcher(None, source_lines(old), new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for index in range(i1, i2):
            if tag == "equal":
                out[index + 1] = j1 + index - i1 + 1
            elif tag == "replace":
                out[index + 1] = j1 + min(index - i1, j2 - j1 - 1) + 1
            else:  # deleted
                out[index + 1] = min(j1 + 1, max(len(new_lines), 1))
    return out


def keep_lone_cr(original: str, new: str) -> str:
    """LibCST's code for a file whose lines end in a lone CR (classic Mac OS) drops the last one:
    put it back, so that an unchanged file stays byte for byte and a fixed one keeps its ending."""
    if original.endswith("\r") and not original.endswith("\r\n") and new and not new.endswith("\r"):
        return new + "\r"
    return new


def position_map(old: str, new: str) -> "Callable[[int, int], tuple[int, int] | None]":
    """``where(line, column)``: where the character at that 1-based position of ``old`` stands in ``new``
    after an edit, or None where the edit replaced it. Unchanged lines move as a whole; inside a run of
    changed lines the characters are aligned one by one, so a statement a fix re-indents (under a new
    ``with``) or extends (a keyword added to its call) keeps its place: how a rule's finding on ``old``
    is found again among its findings on ``new``, by its node's position, whatever its line now reads."""
    old_at, new_at = _Lines(old), _Lines(new)
    shifts: list[tuple[int, int, "Callable[[int], int | None]"]] = []  # (old start, old end, offset map)
    matcher = difflib.SequenceMatcher(None, source_lines(old), source_lines(new), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        start, end = old_at.starts[i1], old_at.starts[i2]
        new_start = new_at.starts[j1]
        if tag == "equal":
            shifts.append((start, end, lambda offset, delta=new_start - start: offset + delta))
        elif tag == "replace":
            blocks = difflib.SequenceMatcher(
                None, old[start:end], new[new_start:new_at.starts[j2]], autojunk=False).get_matching_blocks()

            def inside(offset: int, start=start, new_start=new_start, blocks=blocks) -> int | None:
                for a, b, size in blocks:
                    if a <= offset - start < a + size:
                        return new_start + b + (offset - start - a)
                return None

            shifts.append((start, end, inside))

    def where(line: int, column: int) -> tuple[int, int] | None:
        try:
            offset = old_at.offset(line, column)
        except ValueError:
            return None
        for start, end, moved in shifts:
            if start <= offset < end:
                found = moved(offset)
                return new_at.position(found) if found is not None else None
        return None

    return where
