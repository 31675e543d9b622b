"""``# tcaudit: ignore[...]`` and ``# tcaudit: ignore-file[...]`` directives, read from real comments.

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

def parse_codes(group: str | None) -> tuple[str, ...] | None:
    """A directive's rule codes; None means every rule (a bare ``# tcaudit: ignore``)."""
    if group is None:
        return None
    codes = tuple(c.strip().upper() for c in group.split(",") if c.strip())
    return codes or None


def _covers(codes: tuple[str, ...] | None, rule: str) -> bool:
    return codes is None or any(matches_selector(rule, code) for code in codes)


@dataclass
class Directives:
    """The suppression directives of one file's text."""

    file_codes: list[tuple[str, ...] | None] = field(default_factory=list)
    line_codes: dict[int, list[tuple[str, ...] | None]] = field(default_factory=dict)

    def suppresses(self, finding: Finding) -> bool:
        if any(_covers(codes, finding.rule) for codes in self.file_codes):
            return True
        location = finding.location
        for line in {location.line, location.end_line}:
            if any(_covers(codes, finding.rule) for codes in self.line_codes.get(line, ())):
                return True
        return False


NO_DIRECTIVES = Directives()


def _comments(text: str):
    """(line, comment text) of every comment the tokenizer reaches."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return


def directives(text: str) -> Directives:
    if "tcaudit:" not in text:
        return NO_DIRECTIVES
    found = Directives()
    for line, comment in _comments(text):
        if "tcaudit:" not in comment:
            continue
        for match in _FILE.finditer(comment):
            found.file_codes.append(parse_codes(match.group(1)))
        match = _LINE.search(comment)
        if match:
            found.line_codes.setdefault(line, []).append(parse_codes(match.group(1)))
    return found


__all__ = ["Directives", "NO_DIRECTIVES", "directives", "parse_codes"]
