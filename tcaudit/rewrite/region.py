"""One finding's fix made on the smallest part of the module that holds it (issue 50).

A codemod is a LibCST transformer over the whole module, and LibCST rebuilds (and prints back) every node
it visits: on a 2,000-line file that is about a quarter of a second per fix, which ``scan``'s per-finding
edits (an editor's quick fix, JSON and SARIF ``edits``) paid for each finding. Here the codemod gets a
*region*: the module with every top-level ``def`` and ``class`` that holds none of the fix's nodes
replaced by a one-line placeholder ``def`` (so every other module-level statement, the imports, the
settings and the main guard, is still there, in its place, for the codemod to read and to insert next
to). The placeholders' lines are then replaced by the original text of what they stand for.

The region is used only where it provably gives the whole module's text: the region's code, with the
placeholders replaced back, must be the original text byte for byte, each placeholder must come out of
the codemod untouched and once, and a name the fix newly imports must not occur in what was left out
(the safety net's "used before its import" reads module-level code). Otherwise :func:`region_for` or
:meth:`Region.spliced` says None and the caller makes the fix on the whole module.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Iterable

import libcst as cst

from tcaudit.findings import TextEdit
from tcaudit.rewrite.textedits import edits_between
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.parsing import line_starts

_PLACEHOLDER = "__tcaudit_elided_{}__"
# A top-level statement kind whose body does not run when the module does (a class body does, but it is
# left out only whole, and the import check below reads its text): what a region may leave out.
_ELIDABLE = (cst.FunctionDef, cst.ClassDef)
# Below this many top-level statements a region would save nothing worth its checks.
MIN_STATEMENTS = 4


@dataclass(frozen=True)
class Region:
    """The module a codemod runs on instead of the whole one, and how to put the whole text back."""

    module: cst.Module
    # (the placeholder's line as the region's code prints it, the original text it stands for: the
    # statements it replaces less the blank and comment lines above the first, which it keeps)
    elided: tuple[tuple[str, str], ...]
    # The region's code (the original text with each left-out run as its placeholder's line), and the
    # 1-based line of each placeholder in it.
    code: str = ""
    placeholder_lines: tuple[int, ...] = ()

    def edits(self, new_code: str) -> "tuple[TextEdit, ...] | None":
        """The edits that turn the whole original text into the whole new one, found by comparing the
        region's code with ``new_code`` (the codemod's output for the region) and moved to the original
        text's lines; None where an edit would reach into a placeholder's line."""
        out = []
        for edit in edits_between(self.code, new_code):
            start = self._original(edit.line, edit.column)
            end = self._original(edit.end_line, edit.end_column)
            if start is None or end is None:
                return None
            out.append(TextEdit(start[0], start[1], end[0], end[1], edit.content))
        return tuple(out)

    def _original(self, line: int, column: int) -> tuple[int, int] | None:
        shift = 0
        for placeholder, (_, original) in zip(self.placeholder_lines, self.elided):
            if placeholder > line:
                break
            if placeholder == line:
                return (line + shift, 1) if column == 1 else None
            shift += original.count("\n") - 1
        return line + shift, column

    def spliced(self, code: str) -> str | None:
        """The whole module's text from the codemod's output ``code`` for the region; None where a
        placeholder did not come out as it went in (the codemod touched what it was not given)."""
        out: list[str] = []
        rest = 0
        for line, original in self.elided:
            at = code.find(line, rest)
            if at < 0 or (at > 0 and code[at - 1] not in "\r\n") or code.find(line, at + len(line)) >= 0:
                return None
            out.append(code[rest:at])
            out.append(original)
            rest = at + len(line)
        out.append(code[rest:])
        return "".join(out)

    def left_out(self) -> str:
        """The original text of everything the region leaves out."""
        return "".join(original for _, original in self.elided)


def region_for(facts: ScriptFacts, anchors: Iterable[Any], lines: Iterable[int] = ()) -> Region | None:
    """The region that holds every syntax node found in ``anchors`` (a fix's plan, walked for nodes)
    and the top-level statements over ``lines``; None where it would leave nothing out or cannot be
    made exactly."""
    module = facts.module
    body = list(module.body)
    if len(body) < MIN_STATEMENTS:
        return None
    text = facts.source.text
    if "\r" in text.replace("\r\n", ""):
        return None  # lone CRs: LibCST's code differs from the text at the end (keep_lone_cr)
    try:
        starts = [_first_line(facts, statement) for statement in body]
    except KeyError:
        return None
    if any(b <= a for a, b in zip(starts, starts[1:])) or starts[0] < 1:
        return None
    keep = {len(body) - 1}  # the last statement: what follows it (the footer) then needs no place
    for line in lines:
        keep.add(_statement_at(starts, line))
    for node in _nodes_in(anchors):
        try:
            keep.add(_statement_at(starts, facts.line_of(node)))
        except KeyError:
            continue  # a node the plan made, not one of this text
    offsets = line_starts(text)
    if offsets[-1] != len(text):
        offsets.append(len(text))  # and the text's end
    if len(offsets) <= starts[-1]:
        return None
    newline = module.default_newline
    region_body: list[cst.BaseStatement] = []
    elided: list[tuple[str, str]] = []
    expected: list[str] = [text[:offsets[starts[0] - 1]]]
    index = 0
    while index < len(body):
        if index in keep or not isinstance(body[index], _ELIDABLE):
            end = index + 1
            region_body.append(body[index])
            expected.append(text[offsets[starts[index] - 1]:offsets[starts[end] - 1]] if end < len(body) else
                            text[offsets[starts[index] - 1]:])
            index = end
            continue
        end = index
        while end < len(body) and end not in keep and isinstance(body[end], _ELIDABLE):
            end += 1
        # The placeholder keeps the blank and comment lines above the first statement it stands for: a
        # codemod that inserts before it spaces its block by them, as it would before the statement.
        name = _PLACEHOLDER.format(len(elided))
        line = f"def {name}(): ...{newline}"
        leading = body[index].leading_lines
        region_body.append(cst.FunctionDef(name=cst.Name(name), params=cst.Parameters(), leading_lines=leading,
                                           body=cst.SimpleStatementSuite(body=[cst.Expr(cst.Ellipsis())])))
        own = starts[index] + len(leading)
        elided.append((line, text[offsets[own - 1]:offsets[starts[end] - 1]]))
        expected.append(text[offsets[starts[index] - 1]:offsets[own - 1]] + line)
        index = end
    if not elided:
        return None
    code = "".join(expected)
    placeholder_lines, line, placeholders = [], 1, {placeholder for placeholder, _ in elided}
    for piece in expected:
        if piece in placeholders or piece.endswith(tuple(placeholders)):
            placeholder_lines.append(line + piece.count("\n") - 1)
        line += piece.count("\n")
    region = Region(module.with_changes(body=region_body), tuple(elided), code, tuple(placeholder_lines))
    if len(placeholder_lines) != len(elided) or region.module.code != code:
        return None  # the statements' lines were not where the positions said: no exact splice
    return region


def imports_added(before: cst.Module, after: cst.Module) -> set[str]:
    """The names ``after``'s top-level imports bind that ``before``'s do not."""
    return _imported(after) - _imported(before)


def mentions(text: str, names: Iterable[str]) -> bool:
    """Whether ``text`` uses one of ``names`` (dotted ones too) as a name, not as an attribute or part of a
    longer name. (Looked for as plain text first: a pattern that starts with a look-behind tries every
    position of the text.)"""
    return any(name in text and re.search(rf"(?<![\w.]){re.escape(name)}\b", text) for name in names)


def _imported(module: cst.Module) -> set[str]:
    names: set[str] = set()
    for statement in module.body:
        for small in getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        names.add(alias.asname.name.value)
                    else:
                        names.add(_dotted(alias.name).split(".")[0])
    return names


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


def _first_line(facts: ScriptFacts, statement: cst.BaseStatement) -> int:
    """The line a top-level statement's code starts on: its leading blank and comment lines included."""
    decorators = getattr(statement, "decorators", ())
    anchor = decorators[0] if decorators else statement
    return facts.position(anchor).start.line - len(statement.leading_lines)


def _statement_at(starts: list[int], line: int) -> int:
    """The index of the top-level statement whose lines hold ``line``."""
    low, high = 0, len(starts) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if starts[middle] <= line:
            low = middle
        else:
            high = middle - 1
    return low


def _nodes_in(value: Any, depth: int = 0, seen: set[int] | None = None) -> Iterable[cst.CSTNode]:
    """The syntax nodes a plan (or a list of plans) holds, through its fields, tuples, lists and dicts."""
    if isinstance(value, cst.CSTNode):
        yield value
        return
    if depth > 8 or value is None or isinstance(value, (str, bytes, int, float, enum.Enum, type)):
        return
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items: Iterable[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    elif isinstance(value, ScriptFacts):
        return  # the analysis itself: every node of the text
    elif hasattr(value, "__dict__"):
        items = vars(value).values()
    elif hasattr(type(value), "__slots__"):
        items = [getattr(value, slot, None) for cls in type(value).__mro__ for slot in getattr(cls, "__slots__", ())]
    else:
        return
    for item in items:
        yield from _nodes_in(item, depth + 1, seen)
