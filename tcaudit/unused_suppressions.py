"""TC001 unused-suppression (ruff's RUF100): a suppression comment's code that silenced no finding,
or that names no rule (a misspelt ``TC2O1``), and its fix, which removes those codes (or the whole
directive, or the whole comment when nothing is left of it).

It needs the final findings of every rule on the file, so it runs in the engine's filtering stage
(tcaudit/engine.py), not as a script rule. A code counts as unused only when every rule it names was
enabled for the file and ran on it: a suppression of a disabled rule, of a rule that per-file-ignores
turns off, of the model audit's rules (TC1: whether the audit covered a file is not known per file),
or in a file that did not parse or hit an internal error, is never reported. A bare
``# tcaudit: ignore`` is not reported either: which rules it was written for is not known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from tcaudit.catalog import is_known_selector, load_catalog, matches_selector
from tcaudit.findings import Finding, Fix, FixClass, Location, TextEdit
from tcaudit.rewrite.textedits import source_lines
from tcaudit.source.suppressions import NOQA, Directive, Directives

RULE = "TC001"
# Rules whose suppressions are never reported: the model audit's (not known to have covered a file),
# and TC001's own (a suppression of TC001 that silences nothing would report itself).
NEVER_UNUSED_PREFIXES = ("TC1", RULE)


@dataclass
class Usage:
    """Which codes of one file's directives silenced a finding."""

    directives: Directives
    used: set[tuple[int, int]] = field(default_factory=set)  # (directive index, code index)

    def suppress(self, finding: Finding) -> bool:
        """Whether ``finding`` is suppressed; marks every directive code that covers it as used."""
        hit = False
        for index, directive in enumerate(self.directives.found):
            if not directive.covers(finding):
                continue
            hit = True
            for position, code in enumerate(directive.codes or ()):
                if matches_selector(finding.rule, code.code):
                    self.used.add((index, position))
        return hit


def unused_suppressions(
    path: str,
    text: str,
    usage: Usage,
    ran: Callable[[str], bool],
) -> list[Finding]:
    """The TC001 findings of one file: one per directive with unused or unknown codes. ``ran(rule)``:
    whether that rule was enabled for the file and ran on it."""
    spec = load_catalog()[RULE]
    # Lines as the tokenizer counts them (a form feed does not end one), with their breaks: a line
    # removed whole takes its break along (the last line may have none).
    with_breaks = source_lines(text)
    lines = [line.rstrip("\r\n") for line in with_breaks]
    out: list[Finding] = []
    for index, directive in enumerate(usage.directives.found):
        if directive.codes is None:
            continue  # bare: not known which rules it was meant for
        unknown, unused = [], []
        for position, code in enumerate(directive.codes):
            if (index, position) in usage.used:
                continue
            if not is_known_selector(code.code):
                unknown.append(code.code)
                continue
            rules = [rule for rule in load_catalog() if matches_selector(rule, code.code)]
            if any(rule.startswith(NEVER_UNUSED_PREFIXES) for rule in rules):
                continue
            if rules and all(ran(rule) for rule in rules):
                unused.append(code.code)
        if not unknown and not unused:
            continue
        line_text = lines[directive.line - 1] if directive.line <= len(lines) else ""
        parts = []
        if unused:
            parts.append(f"unused: {', '.join(unused)}")
        if unknown:
            parts.append(f"unknown: {', '.join(unknown)}")
        kind = "`noqa`" if directive.syntax == NOQA else "suppression"
        edits = removal_edits(directive, set(unused) | set(unknown), line_text, with_breaks[directive.line - 1] != lines[directive.line - 1] if directive.line <= len(lines) else False)
        out.append(Finding(
            rule=RULE,
            name=spec.name,
            severity=spec.severity,
            location=Location(path, directive.line, directive.column + 1, directive.line, directive.end_column + 1),
            message=f"Unused {kind} directive ({'; '.join(parts)})",
            fix=Fix(FixClass.SAFE, "remove the unused codes" if len(edits) and _keeps_some(directive, set(unused) | set(unknown))
                    else "remove the directive", edits=edits),
            source_line=line_text.strip(),
        ))
    return out


def _kept(directive: Directive, dropped: set[str]) -> list[str]:
    return [code for code in directive.listed if code.upper() not in dropped]


def _keeps_some(directive: Directive, dropped: set[str]) -> bool:
    return bool(_kept(directive, dropped))


def removal_edits(directive: Directive, dropped: set[str], line_text: str, has_break: bool) -> tuple[TextEdit, ...]:
    """Text edits, on the directive's comment only, that drop the codes in ``dropped``: the code
    list rewritten where some codes stay; else the directive removed, and the comment with it where
    nothing else is left in it (the whole line where the comment was all there was on it)."""
    line = directive.line
    kept = _kept(directive, dropped)
    if kept:
        start, end = directive.list_span
        return (TextEdit(line, start + 1, line, end + 1, ", ".join(kept)),)
    comment = line_text[directive.comment_column:]
    before = comment[: directive.column - directive.comment_column]
    after = comment[directive.end_column - directive.comment_column:]
    rest = (before.rstrip() + " " + after.strip()).strip() if before.strip() else after.strip()
    if rest:
        if not rest.startswith("#"):
            rest = "# " + rest  # what followed the directive stays a comment
        return (TextEdit(line, directive.comment_column + 1, line, len(line_text) + 1, rest),)
    code = line_text[: directive.comment_column]
    if not code.strip():
        # The comment was the whole line: the line goes (its line break with it, where it has one).
        if has_break:
            return (TextEdit(line, 1, line + 1, 1, ""),)
        return (TextEdit(line, 1, line, len(line_text) + 1, ""),)
    kept_code = code.rstrip()
    return (TextEdit(line, len(kept_code) + 1, line, len(line_text) + 1, ""),)


def rules_that_ran(
    enabled: Iterable[str],
    ignored_here: tuple[str, ...],
    analysed: bool,
) -> Callable[[str], bool]:
    """``ran(rule)`` for one file: enabled, not turned off for it by per-file-ignores, and the file
    analysed (it parsed, and no internal error cut its analysis short)."""
    enabled = frozenset(enabled)

    def ran(rule: str) -> bool:
        return analysed and rule in enabled and not any(matches_selector(rule, s) for s in ignored_here)

    return ran


__all__ = ["RULE", "Usage", "removal_edits", "rules_that_ran", "unused_suppressions"]
