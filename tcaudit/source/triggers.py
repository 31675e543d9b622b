"""Rule triggers, checked fast: the literal text a trigger regex cannot match without is looked for
first (``str.__contains__`` is much faster than the regex), and the regex runs only when it is all
there.

A trigger such as ``(?s)\\A(?=.*?(?:backward))(?=.*?(?:\\bcuda\\b|torch\\.accelerator))`` needs
``backward`` and one of ``cuda`` / ``torch.accelerator``; most files lack one, and Python's regex
engine cannot skip ahead to a literal behind a lookahead or a ``\\b``. The literals come from
Python's own parse of the pattern and are only ever *necessary* conditions, so the verdict is
always the regex's own.

A trigger made by :func:`all_of` is checked part by part: each part is searched on its own (a part
that starts with a literal gets the regex engine's fast literal scan, which a lookahead behind
``\\A`` never does), and a part several rules share (``\\.\\s*backward\\b``) is decided once per file.
"""

from __future__ import annotations

import contextlib
import re
from contextvars import ContextVar
from typing import Callable, Iterable, Iterator, Union

from tcaudit.source.parsing import common_prefix, common_suffix

try:  # Python 3.11+
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

# A requirement: a literal the text must contain, or alternatives of which one must hold in full.
Need = Union[str, "list[list[Need]]"]

_REPEATS = tuple(getattr(_sre, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre, name))


def _needs(items) -> list[Need]:
    needs: list[Need] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= 2:
            needs.append("".join(run))
        run.clear()

    for op, av in items:
        if op is _sre.LITERAL:
            run.append(chr(av))
            continue
        flush()
        if op is _sre.SUBPATTERN:
            _group, add_flags, _del_flags, sub = av
            if not add_flags & _sre.SRE_FLAG_IGNORECASE:
                needs.extend(_needs(sub))
        elif op is _sre.ASSERT:  # a positive lookahead or lookbehind must match somewhere
            _direction, sub = av
            needs.extend(_needs(sub))
        elif op in _REPEATS:
            low, _high, sub = av
            if low >= 1:
                needs.extend(_needs(sub))
        elif op is getattr(_sre, "ATOMIC_GROUP", None):
            needs.extend(_needs(av))
        elif op is _sre.BRANCH:
            _, branches = av
            alternatives = [_needs(branch) for branch in branches]
            if all(alternatives):  # a branch that needs nothing makes the whole branch need nothing
                needs.append(alternatives)
        # Anything else (classes, anchors, ANY, negative lookarounds, backreferences) needs no literal.
    flush()
    return needs


def required_literals(pattern: str) -> list[Need]:
    """Literals every match of ``pattern`` contains (possibly as alternatives); [] when unknown."""
    try:
        parsed = _sre_parse.parse(pattern)
        if parsed.state.flags & _sre.SRE_FLAG_IGNORECASE:
            return []
        return _needs(parsed)
    except Exception:  # noqa: BLE001 - an internal API changed: fall back to the plain regex
        return []


def _holds(needs: list[Need], text: str) -> bool:
    literals = _LITERALS.get()
    contains = literals.contains if literals is not None and literals.text is text else text.__contains__
    return _all_there(needs, contains)


def _all_there(needs: list[Need], contains: "Callable[[str], bool]") -> bool:
    for need in needs:
        if isinstance(need, str):
            if not contains(need):
                return False
        elif not any(_all_there(alternative, contains) for alternative in need):
            return False
    return True


class Literals:
    """Whether one document's text contains each literal the triggers need, answered from the last
    text's answers: an edit replaces one stretch, so a literal found outside it is still there (moved
    with the text after it), and one found nowhere can only be in the new stretch. The same answers as
    ``literal in text``, looking at the edit's stretch instead of the whole text (6 ms a keystroke on
    a 2,000-line file). One per document (an editor's: ``tcaudit/source/incremental.py``).

    The triggers' regexes are answered the same way (:meth:`matches`, about 2 ms a keystroke): a match
    of the last text that the edit left whole, with the characters around it that the regex looks at
    (one for ``\\b``, a lookaround's width), is still a match where the regex looks no further; a regex
    that matched nowhere and cannot match across a line's end can only match on the lines the edit
    touched."""

    def __init__(self) -> None:
        self.text: str | None = None
        self._found: dict[str, int] = {}  # a literal's place in ``text`` (-1: not in it)
        self._last_found: dict[str, int] = {}  # the same of the last text (none before the first)
        self._stretch = (0, 0, 0)  # the changed stretch: start, its end in the last text, in this one
        # A regex's first match in ``text`` (None: none), and the same of the last text.
        self._matched: dict[re.Pattern, tuple[int, int] | None] = {}
        self._last_matched: dict[re.Pattern, tuple[int, int] | None] = {}

    def use(self, text: str) -> None:
        """Answer for ``text`` from now on."""
        if text is self.text:
            return
        if self.text is not None:  # what was found in the last text, for this one
            self._last_found, self._last_matched = self._found, self._matched
            self._stretch = _changed_stretch(self.text, text)
        self.text, self._found, self._matched = text, {}, {}

    def matches(self, regex: re.Pattern) -> bool:
        """``regex.search(text) is not None`` for the text in use."""
        return self.span(regex) is not None

    def span(self, regex: re.Pattern) -> "tuple[int, int] | None":
        """Where a match of ``regex`` in the text in use is (not always the leftmost); None where none."""
        if regex in self._matched:
            return self._matched[regex]
        span = self._matched[regex] = self._match(regex)
        return span

    def _match(self, regex: re.Pattern) -> tuple[int, int] | None:
        text = self.text
        assert text is not None
        shape = _shape(regex)
        if regex in self._last_matched:
            last = self._last_matched[regex]
            start, old_end, new_end = self._stretch
            if last is not None and shape.context_free:
                margin = shape.margin
                if last[1] + margin <= start:  # before the edit, the characters it looks at after it too
                    return last
                if last[0] - margin >= old_end:  # after it, with those it looks at before: moved with the text
                    moved = new_end - old_end
                    return last[0] + moved, last[1] + moved
            elif last is None and shape.line_local:
                # Every line the edit left whole was searched last time: only its own lines can match now.
                first = text.rfind("\n", 0, start) + 1
                end = text.find("\n", new_end)
                found = regex.search(text[first:len(text) if end < 0 else end])
                return None if found is None else (first + found.start(), first + found.end())
        if shape.starts is not None:
            return _search_from_starts(regex, text, shape.starts)
        found = regex.search(text)
        return None if found is None else found.span()

    def contains(self, literal: str) -> bool:
        place = self._found.get(literal)
        if place is None:
            place = self._found[literal] = self._place(literal)
        return place >= 0

    def _place(self, literal: str) -> int:
        text = self.text
        assert text is not None
        last = self._last_found.get(literal)
        if last is None:
            return text.find(literal)
        start, old_end, new_end = self._stretch
        size = len(literal)
        if last >= 0:
            if last + size <= start:
                return last
            if last >= old_end:
                return last + new_end - old_end
            return text.find(literal)
        # Not in the last text: only where the new stretch is, or a literal running into it.
        return text.find(literal, max(0, start - size + 1), new_end + size - 1)


class _Shape:
    """What a regex can look at: ``context_free`` where a match depends on its own text and ``margin``
    characters on either side only (``\\b`` looks at one, a lookbehind or a bounded lookahead at as many
    as it is wide; anchors at the text's start look no further), ``line_local`` where also no match holds
    a line's end (nothing in it, lookarounds included, matches a newline, and its anchors mean the same at
    a line's ends as at a string's: ``\\b``, and ``^``/``$`` under MULTILINE)."""

    __slots__ = ("context_free", "line_local", "margin", "starts", "words_only")

    def __init__(self, context_free: bool, line_local: bool, margin: int, starts: "tuple[str, ...] | None",
                 words_only: bool) -> None:
        self.context_free = context_free
        self.line_local = line_local
        self.margin = margin
        # It looks beyond a match only as ``\\b`` does (no lookaround, no other anchor).
        self.words_only = words_only
        # Text every match begins with one of (None: not known): a match is looked for only where one is.
        self.starts = starts


_SHAPES: dict[re.Pattern, _Shape] = {}


def _shape(regex: re.Pattern) -> _Shape:
    shape = _SHAPES.get(regex)
    if shape is None:
        try:
            parsed = _sre_parse.parse(regex.pattern, regex.flags)
            context_free, line_local, margin, words_only = _looks(parsed, parsed.state.flags)
            starts = None if parsed.state.flags & _sre.SRE_FLAG_IGNORECASE else _starts(parsed)
        except Exception:  # noqa: BLE001 - an internal API changed: search the whole text
            context_free = line_local = words_only = False
            margin, starts = 1, None
        if starts is not None and min(map(len, starts)) < 4:
            starts = None  # a short one is everywhere: the regex's own scan is as quick
        shape = _SHAPES[regex] = _Shape(context_free, context_free and line_local, margin, starts, words_only)
    return shape


def _starts(items) -> "tuple[str, ...] | None":
    """Text every match of the parsed regex begins with one of (anchors and lookarounds before it take
    no text); None where that is not known."""
    run: list[str] = []
    for op, av in items:
        if op is _sre.LITERAL:
            run.append(chr(av))
            continue
        if run:
            break
        if op in (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT):
            continue  # takes no text
        if op is _sre.BRANCH:
            found: list[str] = []
            for branch in av[1]:
                its = _starts(branch)
                if its is None:
                    return None
                found.extend(its)
            return tuple(found)
        if op is _sre.SUBPATTERN and not av[1] & _sre.SRE_FLAG_IGNORECASE:
            return _starts(av[3])
        return None
    return ("".join(run),) if run else None


def _search_from_starts(regex: re.Pattern, text: str, starts: tuple[str, ...]) -> "tuple[int, int] | None":
    """A match of ``regex`` in ``text`` (the first one found, not always the leftmost), every one of whose
    matches begins with one of ``starts``: matched where each of those is (``str.find`` is much quicker
    than the regex's scan of a long text when it cannot skip ahead to a literal); None where none."""
    for start in starts:
        at = text.find(start)
        while at >= 0:
            found = regex.match(text, at)
            if found is not None:
                return found.span()
            at = text.find(start, at + 1)
    return None


_LINE_ANCHORS = {getattr(_sre, name) for name in ("AT_BOUNDARY", "AT_NON_BOUNDARY")}
_NEWLINE_CATEGORIES = {getattr(_sre, name) for name in ("CATEGORY_SPACE", "CATEGORY_NOT_WORD", "CATEGORY_NOT_DIGIT",
                                                          "CATEGORY_LINEBREAK", "CATEGORY_UNI_SPACE",
                                                          "CATEGORY_UNI_NOT_WORD", "CATEGORY_UNI_NOT_DIGIT",
                                                          "CATEGORY_UNI_LINEBREAK", "CATEGORY_LOC_NOT_WORD")
                       if hasattr(_sre, name)}
_UNBOUNDED = getattr(_sre, "MAXREPEAT", 1 << 30)


def _looks(items, flags: int) -> tuple[bool, bool, int, bool]:
    """(context free, line local, margin, words only) of a parsed regex (see :class:`_Shape`); unknown
    pieces make it none of them."""
    context_free = line_local = words_only = True
    margin = 1

    def inner(sub, sub_flags: int) -> None:
        nonlocal context_free, line_local, margin, words_only
        its = _looks(sub, sub_flags)
        context_free &= its[0]
        line_local &= its[1]
        margin = max(margin, its[2])
        words_only &= its[3]

    for op, av in items:
        if op is _sre.LITERAL:
            line_local &= av != 10
        elif op is _sre.NOT_LITERAL:
            line_local &= av == 10
        elif op is _sre.ANY:
            line_local &= not flags & _sre.SRE_FLAG_DOTALL
        elif op is _sre.IN:
            line_local &= _set_misses_newline(av)
        elif op is _sre.AT:
            if av in _LINE_ANCHORS:
                continue
            words_only = False
            multiline = bool(flags & _sre.SRE_FLAG_MULTILINE)
            if multiline and av in (_sre.AT_BEGINNING, _sre.AT_END):
                continue
            line_local = False
            # ``^`` and ``\\A`` mean the text's start, where no match after an edit can be; ``$`` and
            # ``\\Z`` its end (or before its last newline), which an edit after the match moves.
            context_free &= av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING)
        elif op is _sre.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            inner(sub, (flags | add_flags) & ~del_flags)
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            inner(av[2], flags)
        elif op is _sre.BRANCH:
            for branch in av[1]:
                inner(branch, flags)
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            # A lookaround reads its width beyond the place it stands at, which is inside the match.
            _direction, sub = av
            width = sub.getwidth()[1]
            if width >= _UNBOUNDED:
                return False, False, margin, False
            margin = max(margin, width)
            words_only = False
            inner(sub, flags)
        elif op is _sre.GROUPREF:
            continue  # what the group matched: within the match
        else:  # atomic groups and possessive repeats (no backtracking), conditionals, anything new
            return False, False, margin, False
    return context_free, line_local, margin, words_only


def _set_misses_newline(items) -> bool:
    """Whether a character set (an ``IN``'s items) cannot match a newline."""
    for op, av in items:
        if op is _sre.NEGATE:
            return False
        if op is _sre.LITERAL and av == 10:
            return False
        if op is _sre.RANGE and av[0] <= 10 <= av[1]:
            return False
        if op is _sre.CATEGORY and av in _NEWLINE_CATEGORIES:
            return False
        if op not in (_sre.LITERAL, _sre.RANGE, _sre.CATEGORY):
            return False
    return True


def _changed_stretch(old: str, new: str) -> tuple[int, int, int]:
    """(start, end in ``old``, end in ``new``) of the one stretch ``old`` and ``new`` differ in."""
    start = common_prefix(old, new)
    end = common_suffix(old, new, start)
    return start, len(old) - end, len(new) - end


_LITERALS: "ContextVar[Literals | None]" = ContextVar("tcaudit_trigger_literals", default=None)


@contextlib.contextmanager
def answering_literals(literals: Literals, text: str) -> Iterator[None]:
    """Within the block, triggers checked on ``text`` ask ``literals`` (a document's) whether it
    contains what they need."""
    literals.use(text)
    token = _LITERALS.set(literals)
    try:
        yield
    finally:
        _LITERALS.reset(token)


def text_matches(regex: re.Pattern, text: str) -> bool:
    """``regex.search(text) is not None``; for the text of the document an editor analyses, answered
    from its last text where the edit allows (:meth:`Literals.matches`)."""
    return match_span(regex, text) is not None


def match_span(regex: re.Pattern, text: str) -> "tuple[int, int] | None":
    """Where a match of ``regex`` in ``text`` is (not always the leftmost), or None where there is none;
    for the text of the document an editor analyses, answered from its last text (:meth:`Literals.span`)."""
    literals = _LITERALS.get()
    if literals is not None and literals.text is text:
        return literals.span(regex)
    found = regex.search(text)
    return None if found is None else found.span()


def matches_words_within_lines(regex: re.Pattern) -> bool:
    """Whether every match of ``regex`` lies within one line and depends on that line alone (see
    :class:`_Shape`: ``line_local``), looking beyond itself only as ``\\b`` does (no lookaround, no
    ``^``/``$``): a character after a match counts only as a word character or not."""
    shape = _shape(regex)
    return shape.line_local and shape.words_only


# The parts of each regex all_of made, so that trigger() can check them one by one.
_ALL_OF_PARTS: dict[str, tuple[str, ...]] = {}


def all_of(*patterns: str) -> str:
    """One trigger regex that needs every pattern somewhere in the file (a rule's triggers are OR-ed)."""
    combined = r"(?s)\A" + "".join(f"(?=.*?(?:{p}))" for p in patterns)
    _ALL_OF_PARTS[combined] = patterns
    return combined


def all_of_parts(pattern: str) -> tuple[str, ...] | None:
    """The patterns :func:`all_of` joined into ``pattern``; None for a regex it did not make."""
    return _ALL_OF_PARTS.get(pattern)


class Trigger:
    __slots__ = ("pattern", "regex", "needs", "parts")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.regex = re.compile(pattern, flags)
        self.needs = required_literals(pattern)
        # ``(?s)\A(?=.*?(?:p1))(?=.*?(?:p2))`` matches exactly when each ``p`` is found with DOTALL.
        self.parts = tuple(trigger(part, re.DOTALL) for part in _ALL_OF_PARTS.get(pattern, ()))

    def search(self, text: str, verdicts: dict["Trigger", bool] | None = None) -> bool:
        """``self.regex.search(text) is not None``, usually without running the regex. ``verdicts``
        remembers the parts already decided for this text."""
        if not _holds(self.needs, text):
            return False
        if not self.parts:
            return text_matches(self.regex, text)
        for part in self.parts:
            verdict = verdicts.get(part) if verdicts is not None else None
            if verdict is None:
                verdict = part.search(text)
                if verdicts is not None:
                    verdicts[part] = verdict
            if not verdict:
                return False
        return True


_TRIGGERS: dict[tuple[str, int], Trigger] = {}


def trigger(pattern: str, flags: int = 0) -> Trigger:
    found = _TRIGGERS.get((pattern, flags))
    if found is None:
        found = _TRIGGERS[(pattern, flags)] = Trigger(pattern, flags)
    return found


def triggers_under(
    triggers: tuple[str, ...], structural_triggers: dict[str, tuple[str, ...]], structural_fixes: Iterable[str]
) -> tuple[str, ...]:
    """A rule's triggers under the structural conversions ``fix`` may make: each conversion the rule
    names in ``structural_triggers`` replaces ``triggers`` with its own (several are OR-ed)."""
    replaced = [pattern for option in sorted(set(structural_fixes)) for pattern in structural_triggers.get(option, ())]
    return tuple(replaced) if replaced else triggers
