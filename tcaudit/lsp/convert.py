"""Findings and fixes as the Language Server Protocol shapes them: diagnostics, text edits, code actions.

tcaudit's positions are 1-based lines and 1-based columns in code points, ends exclusive
(:class:`tcaudit.findings.Location`, :class:`tcaudit.findings.TextEdit`); the protocol's are 0-based
lines and columns in the code units the client negotiated (UTF-16 unless it asked for another),
which pygls's PositionCodec converts from code points.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Sequence

from lsprotocol import types as lsp
from pygls.workspace import PositionCodec

from tcaudit.findings import Finding, Severity, TextEdit
from tcaudit.rule_docs import rule_page_uri

SOURCE = "tcaudit"
FIX_ALL_KIND = "source.fixAll.tcaudit"
SEVERITIES = {
    Severity.ERROR: lsp.DiagnosticSeverity.Error,
    Severity.WARNING: lsp.DiagnosticSeverity.Warning,
    Severity.INFO: lsp.DiagnosticSeverity.Information,
}


def _position(lines: Sequence[str], codec: PositionCodec, line: int, column: int) -> lsp.Position:
    """A 1-based (line, code-point column) as the client's 0-based position, clamped to the text."""
    row = min(max(line - 1, 0), len(lines))
    if row == len(lines):
        return lsp.Position(line=row, character=0)
    text = lines[row].rstrip("\r\n")
    char = min(max(column - 1, 0), len(text))
    if text.isascii():  # one unit per character in UTF-8, UTF-16 and UTF-32 alike
        return lsp.Position(line=row, character=char)
    return codec.position_to_client_units(lines, lsp.Position(line=row, character=char))


def to_range(lines: Sequence[str], codec: PositionCodec, line: int, column: int, end_line: int,
             end_column: int, *, widen: bool = False) -> lsp.Range:
    """The client's range for a tcaudit span; ``widen``: an empty span covers the rest of its line
    (a diagnostic of no width is hard to see and to point at)."""
    start = _position(lines, codec, line, column)
    end = _position(lines, codec, end_line, end_column)
    if widen and (end.line, end.character) <= (start.line, start.character) and start.line < len(lines):
        text = lines[start.line].rstrip("\r\n")
        end = codec.position_to_client_units(lines, lsp.Position(line=start.line, character=len(text)))
        if end.character <= start.character:  # nothing after the position: the whole line
            start = lsp.Position(line=start.line, character=0)
    return lsp.Range(start=start, end=end)


def finding_range(finding: Finding, lines: Sequence[str], codec: PositionCodec) -> lsp.Range:
    loc = finding.location
    return to_range(lines, codec, loc.line, loc.column, loc.end_line, loc.end_column, widen=True)


def diagnostic(finding: Finding, lines: Sequence[str], codec: PositionCodec, uri: str,
               findings: Sequence[Finding] = ()) -> lsp.Diagnostic:
    """One finding as a diagnostic: its rule as the code with a link to the rule's page, and, for a
    finding that presumes another rule's fix (``Finding.follows``), that rule's findings as related
    locations. ``data`` names the finding for code actions (rule, line, message)."""
    href = rule_page_uri(finding.rule)
    related = []
    if finding.follows:
        for leader in findings:
            if leader.rule == finding.follows and leader is not finding:
                related.append(lsp.DiagnosticRelatedInformation(
                    location=lsp.Location(uri=uri, range=finding_range(leader, lines, codec)),
                    message=f"presumes the fix of {leader.rule}: {leader.message}",
                ))
    for place in finding.related:
        loc = place.location
        # Another file of the project (a helper's module): its lines are not this buffer's, so its
        # range is given as it is (line and column; UTF-8 and UTF-16 agree on ASCII code).
        target = Path(loc.path)
        related.append(lsp.DiagnosticRelatedInformation(
            location=lsp.Location(
                uri=target.resolve().as_uri() if not target.is_absolute() else target.as_uri(),
                range=lsp.Range(start=lsp.Position(line=loc.line - 1, character=max(0, loc.column - 1)),
                                end=lsp.Position(line=loc.end_line - 1, character=max(0, loc.end_column - 1))),
            ),
            message=place.message,
        ))
    return lsp.Diagnostic(
        range=finding_range(finding, lines, codec),
        message=finding.message,
        severity=SEVERITIES[finding.severity],
        code=finding.rule,
        code_description=lsp.CodeDescription(href=href) if href else None,
        source=SOURCE,
        related_information=related or None,
        data={"rule": finding.rule, "line": finding.location.line, "message": finding.message},
    )


def broken_text_message(finding: Finding, text: str) -> str:
    """A TC000 diagnostic's message in the editor: what does not parse, on which line and where, and that
    the other diagnostics shown are from the last version of the text that parsed."""
    loc = finding.location
    lines = text.splitlines()
    line = lines[loc.line - 1].strip() if 0 < loc.line <= len(lines) else ""
    if len(line) > 60:
        line = line[:57] + "..."
    where = f"line {loc.line}, column {loc.column}" + (f" (`{line}`)" if line else "")
    return f"{finding.message} at {where}; the other diagnostics are from the last text that parsed"


def carried_over(findings: Sequence[Finding], old_text: str, new_text: str, broken_lines: set[int]) -> list[Finding]:
    """The findings of ``old_text`` (the last text that parsed) that still stand on unchanged text in
    ``new_text`` (which does not parse), moved to where that text is now; a finding whose place was
    edited, or is on a line that does not parse (``broken_lines``), is left out."""
    import dataclasses

    from tcaudit.rewrite.textedits import position_map

    where = position_map(old_text, new_text)
    kept = []
    for finding in findings:
        loc = finding.location
        if finding.rule == "TC000" or loc.cell is not None:
            continue
        start = where(loc.line, loc.column)
        if loc.end_column > 1:
            last = where(loc.end_line, loc.end_column - 1)
            end = (last[0], last[1] + 1) if last is not None else None
        else:
            empty = (loc.end_line, loc.end_column) == (loc.line, loc.column)
            end = start if empty else where(loc.end_line, loc.end_column)
        if start is None or end is None or start[0] in broken_lines or end[0] in broken_lines:
            continue
        moved = dataclasses.replace(loc, line=start[0], column=start[1], end_line=end[0], end_column=end[1])
        kept.append(dataclasses.replace(finding, location=moved, fix=None))
    return kept


def text_edits(edits: Sequence[TextEdit], lines: Sequence[str], codec: PositionCodec) -> list[lsp.TextEdit]:
    return [
        lsp.TextEdit(range=to_range(lines, codec, e.line, e.column, e.end_line, e.end_column), new_text=e.content)
        for e in edits
    ]


def whole_text_edit(old_lines: Sequence[str], new_text: str, codec: PositionCodec) -> lsp.TextEdit:
    """One edit replacing the whole document with ``new_text``."""
    end = lsp.Position(line=len(old_lines), character=0)
    return lsp.TextEdit(range=lsp.Range(start=lsp.Position(line=0, character=0), end=end), new_text=new_text)


def workspace_edit(uri: str, version: int | None, edits: list[lsp.TextEdit], document_changes: bool) -> lsp.WorkspaceEdit:
    """The edits of one document, versioned where the client takes ``documentChanges`` (an edit made
    for an older version of the text is then refused, not applied to the wrong place)."""
    if document_changes:
        return lsp.WorkspaceEdit(document_changes=[lsp.TextDocumentEdit(
            text_document=lsp.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
            edits=edits,
        )])
    return lsp.WorkspaceEdit(changes={uri: edits})


def workspace_edits(changes: Sequence[tuple[str, "int | None", list[lsp.TextEdit]]],
                    document_changes: bool) -> lsp.WorkspaceEdit:
    """The edits of several documents (a notebook's cells): (uri, version, edits) each."""
    if document_changes:
        return lsp.WorkspaceEdit(document_changes=[lsp.TextDocumentEdit(
            text_document=lsp.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version), edits=edits)
            for uri, version, edits in changes])
    return lsp.WorkspaceEdit(changes={uri: edits for uri, _, edits in changes})


def notebook_json(cells: Sequence[tuple[bool, str]]) -> str:
    """The notebook file an editor's notebook stands for: (is a code cell, its text) per cell, in order,
    as nbformat 4 JSON, so the scan reads it as ``tcaudit scan`` reads the ``.ipynb`` (its cell numbers
    count every cell, as the editor's do)."""
    import json

    out = []
    for code, text in cells:
        source = text.splitlines(keepends=True)
        if code:
            out.append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source})
        else:
            out.append({"cell_type": "markdown", "metadata": {}, "source": source})
    return json.dumps({"cells": out, "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
                       "nbformat": 4, "nbformat_minor": 5}, indent=1, ensure_ascii=False) + "\n"


def fix_title(finding: Finding) -> str:
    """"Apply numerics fix: bf16 autocast": the fix class, then what the fix does."""
    fix = finding.fix
    assert fix is not None
    description = " ".join(fix.description.split()).rstrip(".")
    return f"Apply {fix.fix_class.value} fix: {description} ({finding.rule})"


_NOQA_CODES = re.compile(r"#\s*noqa:\s*[A-Za-z]+[0-9][A-Za-z0-9]*(?:(?:\s*,\s*)[A-Za-z]+[0-9][A-Za-z0-9]*)*",
                         re.IGNORECASE)


def suppression_edit(text: str, line: int, rule: str) -> TextEdit | None:
    """The edit that suppresses ``rule`` on ``line`` (1-based): its code added to the line's
    ``# noqa:`` comment, or ``  # noqa: RULE`` after the line's code. None where no comment can go
    there: the line ends inside a string that goes on to the next line, or the text does not
    tokenize (the finding would not be suppressed by a comment the tokenizer never reaches)."""
    lines = text.splitlines(keepends=True)
    if not 0 < line <= len(lines):
        return None
    comment = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING and token.start[0] <= line < token.end[0]:
                return None  # the line's end is inside a string
            if token.type == tokenize.COMMENT and token.start[0] == line:
                comment = token
            if token.start[0] > line:
                break
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    body = lines[line - 1].rstrip("\r\n")
    if comment is not None:
        match = _NOQA_CODES.search(comment.string)
        if match is not None:
            column = comment.start[1] + match.end()
            return TextEdit(line, column + 1, line, column + 1, f", {rule}")
    end = len(body)
    return TextEdit(line, end + 1, line, end + 1, f"  # noqa: {rule}")
