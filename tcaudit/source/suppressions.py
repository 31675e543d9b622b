"""``# tcaudit: ignore[...]``, ``# tcaudit: ignore-file[...]`` and ``# noqa: TCxxx`` directives, read
from real comments.

``# noqa: TC201, TC303`` (ruff's and flake8's syntax) suppresses the tcaudit codes it names on its
line; the other tools' codes in the same comment (``# noqa: E501, TC201``) are theirs and ignored
here. A bare ``# noqa`` suppresses nothing in tcaudit: flake8 and ruff users put it on lines for
their own rules, and a performance finding the user never saw must not vanish with it (a bare
``# tcaudit: ignore`` silences every tcaudit rule on a line).

The comments come from Python's own tokenizer, so a directive quoted in a string or a docstring
(documentation that shows how to suppress a rule) suppresses nothing. A file the tokenizer stops
on (an unterminated string, a broken indent) keeps the directives of the comments before that point.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from tcaudit.catalog import matches_selector
from tcaudit.findings import Finding

# ``ignore`` must end the word: ``# tcaudit: ignore-file`` and ``# tcaudit: ignored`` are not line suppressions.
_LINE = re.compile(r"#\s*tcaudit:\s*ignore(?![-\w])(?:\[([^\]]*)\])?", re.IGNORECASE)
_FILE = re.compile(r"#\s*tcaudit:\s*ignore-file(?![-\w])(?:\[([^\]]*)\])?", re.IGNORECASE)
# ruff's noqa: ``# noqa: CODE[, CODE...]`` (commas or spaces between codes; a code is letters, then
# a digit, then letters or digits, so "because" in ``# noqa: TC201 because ...`` is not a code and a
# misspelt ``TC2O1`` stays one code, which suppresses nothing).
_NOQA = re.compile(
    r"#\s*noqa:\s*([A-Za-z]+[0-9][A-Za-z0-9]*(?:(?:\s*,\s*|\s+)[A-Za-z]+[0-9][A-Za-z0-9]*)*)", re.IGNORECASE
)
_NOQA_CODE = re.compile(r"[A-Za-z]+[0-9][A-Za-z0-9]*")
TCAUDIT, NOQA = "tcaudit", "noqa"


def parse_codes(group: str | None) -> tuple[str, ...] | None:
    """A directive's rule codes; None means every rule (a bare ``# tcaudit: ignore``)."""
    if group is None:
        return None
    codes = tuple(c.strip().upper() for c in group.split(",") if c.strip())
    return codes or None


def _covers(codes: tuple[str, ...] | None, rule: str) -> bool:
    return codes is None or any(matches_selector(rule, code) for code in codes)


@dataclass(frozen=True)
class Code:
    """One code a directive names, with where it is written: 1-based line, 0-based columns of the
    line's text, end exclusive."""

    code: str
    column: int
    end_column: int


@dataclass(frozen=True)
class Directive:
    """One suppression comment's directive: where it is (1-based line, 0-based columns of the
    directive's own text in its line, end exclusive) and the codes it names (None: every rule)."""

    line: int
    column: int
    end_column: int
    syntax: str  # TCAUDIT or NOQA
    file_wide: bool
    codes: tuple[Code, ...] | None
    # Every code as written, in order (a noqa's other tools' codes too), and the columns of the
    # list they form (0-based, end exclusive): what TC001's fix rewrites when it keeps some of them.
    listed: tuple[str, ...] = ()
    list_span: tuple[int, int] = (0, 0)
    # Where the comment holding the directive starts (0-based column; it runs to the end of the line).
    comment_column: int = 0

    @property
    def selectors(self) -> tuple[str, ...] | None:
        return None if self.codes is None else tuple(code.code for code in self.codes)

    def covers(self, finding: Finding) -> bool:
        if not self.file_wide and self.line not in {finding.location.line, finding.location.end_line}:
            return False
        return _covers(self.selectors, finding.rule)


@dataclass
class Directives:
    """The suppression directives of one file's text."""

    file_codes: list[tuple[str, ...] | None] = field(default_factory=list)
    line_codes: dict[int, list[tuple[str, ...] | None]] = field(default_factory=dict)
    # Every directive with its position (for TC001, which reports the unused ones).
    found: list[Directive] = field(default_factory=list)

    def suppresses(self, finding: Finding) -> bool:
        if any(_covers(codes, finding.rule) for codes in self.file_codes):
            return True
        location = finding.location
        for line in {location.line, location.end_line}:
            if any(_covers(codes, finding.rule) for codes in self.line_codes.get(line, ())):
                return True
        return False

    def add(self, directive: Directive) -> None:
        self.found.append(directive)
        if directive.file_wide:
            self.file_codes.append(directive.selectors)
        else:
            self.line_codes.setdefault(directive.line, []).append(directive.selectors)


NO_DIRECTIVES = Directives()


def _comments(text: str):
    """(line, column, comment text) of every comment the tokenizer reaches."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.start[1], token.string
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return


def _bracket_codes(match: re.Match, offset: int) -> tuple[Code, ...] | None:
    group = match.group(1)
    if group is None:
        return None
    codes = []
    start = offset + match.start(1)
    for part in re.finditer(r"[^,]+", group):
        code = part.group(0).strip()
        if code:
            column = start + part.start() + (len(part.group(0)) - len(part.group(0).lstrip()))
            codes.append(Code(code.upper(), column, column + len(code)))
    return tuple(codes) or None


def _bracket_list(match: re.Match, offset: int) -> tuple[tuple[str, ...], tuple[int, int]]:
    if match.group(1) is None:
        return (), (0, 0)
    listed = tuple(c.strip() for c in match.group(1).split(",") if c.strip())
    return listed, (offset + match.start(1), offset + match.end(1))


def directives(text: str) -> Directives:
    lowered = text.lower()
    if "tcaudit:" not in lowered and "noqa" not in lowered:
        return NO_DIRECTIVES
    found = Directives()
    for line, column, comment in _comments(text):
        lowered = comment.lower()
        if "tcaudit:" in lowered:
            for match in _FILE.finditer(comment):
                found.add(Directive(line, column + match.start(), column + match.end(), TCAUDIT, True,
                                    _bracket_codes(match, column), *_bracket_list(match, column), column))
            match = _LINE.search(comment)
            if match:
                found.add(Directive(line, column + match.start(), column + match.end(), TCAUDIT, False,
                                    _bracket_codes(match, column), *_bracket_list(match, column), column))
        if "noqa" in lowered:
            match = _NOQA.search(comment)
            if match:
                start = column + match.start(1)
                codes = tuple(
                    Code(part.group(0).upper(), start + part.start(), start + part.end())
                    for part in _NOQA_CODE.finditer(match.group(1))
                    if part.group(0).upper().startswith("TC")  # the other tools' codes are theirs
                )
                if codes:
                    listed = tuple(part.group(0) for part in _NOQA_CODE.finditer(match.group(1)))
                    found.add(Directive(line, column + match.start(), column + match.end(), NOQA, False, codes,
                                        listed, (start, column + match.end(1)), column))
    return found


__all__ = ["Code", "Directive", "Directives", "NO_DIRECTIVES", "NOQA", "TCAUDIT", "directives", "parse_codes"]
