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
changed. Where the change falls inside one top-level statement, after its first line (a line typed in
a long ``main()``), it goes further down (:class:`_Inside`): only the statements it touched in the
innermost block that holds them are parsed, the top-level statement is remade around them (the blocks
and statements on the way down, with the other statements of those blocks the objects they were), and
its walk and positions are the old ones' with the new statements' put in (their code, generated in
place, must be the new text's lines for them). The rules still run on the whole module (they relate
statements to each other: the loop, the model, the optimizer); what they ask of the tree is what gets
cheaper. An edit that no rule can notice (a comment, spacing: tcaudit/source/inert.py) is not analysed
at all: the engine keeps the last analysis here (``kept``) and moves its findings.

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
from tcaudit.source.parsing import common_prefix, common_suffix
from tcaudit.source.triggers import Literals

if TYPE_CHECKING:
    import libcst as cst

    from tcaudit.source.parsing import SourceFile
    from tcaudit.source.syntax import RemadeWalk
    from tcaudit.source.walk import StatementPositions


# The memo forgets what an analysis did not ask about after every few analyses, not after each: a sweep
# looks at every remembered answer (0.4 ms on a 2,000-line file), and what an edit replaced is a few
# statements' answers, kept a few analyses longer.
_SWEEP_EVERY = 4


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
    # What the last text cost: the top-level statements parsed or remade ("all" for a whole parse), and of
    # those remade around what changed inside them (one at most), the statements parsed in its block
    # (None where whole top-level statements were parsed).
    reparsed: "int | str" = "all"
    parsed_inside: "int | None" = None
    # Held by the analysis using the state (reentrant: the engine holds it around reuse and analysis).
    _lock: "threading.RLock" = field(default_factory=threading.RLock, repr=False)
    # The last analysis's findings, for the next text where its edit is one no rule notices
    # (tcaudit/source/inert.py): kept and reused by tcaudit/engine.py. Whether that happened last time.
    kept: object = field(default=None, repr=False)
    reused: bool = False
    # Which literals the rules' triggers need are in the text, from the last text's answers.
    literals: Literals = field(default_factory=Literals, repr=False)
    _analysed: int = 0  # analyses that parsed (the memo forgets, after every few, what the last did not ask about)

    @contextlib.contextmanager
    def analysing(self, source: "SourceFile") -> Iterator[bool]:
        """Around one analysis of ``source``: its module spliced from the last one where the edit
        allows, the walks answered from this document's memo, and afterwards (where it parsed) the
        module kept for the next text and (every few analyses) the memo rid of what it did not ask about.
        Yields False, doing none of that, while another analysis of the document holds the state (a
        code action's scan beside the typing's): that one is then an ordinary whole analysis."""
        if not self._lock.acquire(blocking=False):
            yield False
            return
        try:
            with remembering(self.memo):
                self.memo.begin()
                self.prepare(source)
                self.memo.document = source
                yield True
                if source.parsed_module is not None:
                    self.remember(source)
                    self._analysed += 1
                    if self._analysed % _SWEEP_EVERY == 0:
                        self.memo.sweep()
        finally:
            self.memo.document = None
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
        self.parsed_inside = None
        self.memo.remade = {}
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
        prefix = common_prefix(old_lines, new_lines)
        suffix = common_suffix(old_lines, new_lines, prefix)
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
        ends_at = starts[at] + last.statement_lines[at]  # the first line after the statement
        if header and (after < ends_at or (after == ends_at and after == before + 1)):
            # The change is inside one statement, after its first line: parse only what it touched
            # in the innermost block that holds it.
            inside = self._splice_inside(at, source, last, old_lines, new_lines, starts, before, after)
            if inside is not None:
                return inside
        if header and at > 0:
            spliced = self._splice_from(at, source, last, old_lines, new_lines, starts, body_end, before, after)
            if spliced is not _OTHER_INDENT:
                return spliced  # type: ignore[return-value]
            # The stretch's first block set another indentation than the module's: with the statement
            # before it, the stretch may take the module's (blocks indented unlike the first block).
        spliced = self._splice_from(max(at - 1, 0), source, last, old_lines, new_lines, starts, body_end, before, after)
        return None if spliced is _OTHER_INDENT else spliced  # type: ignore[return-value]

    def _splice_inside(self, at: int, source: "SourceFile", last: "_Parsed", old_lines: list[str],
                       new_lines: list[str], starts: list[int], before: int, after: int) -> "cst.Module | None":
        """The module with top-level statement ``at`` remade around the statements the change touched
        in the innermost block that holds it (a line typed in a 300-line ``main()`` parses that line, not
        ``main``); None where that cannot be told apart from a whole parse (see :class:`_Inside`)."""
        from tcaudit.source.syntax import remade_walk
        from tcaudit.source.walk import remember_statement_positions, statement_positions

        module = last.module
        top = module.body[at]
        base, count = starts[at], last.statement_lines[at]
        try:
            old_positions = statement_positions(module, top, self.memo)
        except Exception:  # noqa: BLE001 - no positions, no splice inside: the statement is parsed whole
            return None
        inside = _Inside(module, old_positions.recorded, base, old_lines, new_lines, before + 1, after)
        try:
            statement = inside.remade(top)
        except Exception:  # noqa: BLE001 - LibCST refused a remade node: the statement is parsed whole
            return None
        if statement is None:
            return None
        spliced = module.with_changes(body=(*module.body[:at], statement, *module.body[at + 1:]))
        new_count = count + len(new_lines) - len(old_lines)
        code = "\n".join(new_lines[base:base + new_count]) + "\n"
        # The walk and the positions of the remade statement, from the old one's: the new statements'
        # code generated in place must be the new text's lines for them.
        walked = remade_walk(self.memo, top, statement)
        made = None if walked is None else inside.positions(spliced, old_positions, walked, code)
        if made is not None:
            remember_statement_positions(spliced, statement, self.memo, made, (top, walked.added, walked.removed))
        else:
            # Generated whole: its code must be the new text's lines for it, or the splice is not taken (a
            # line counted wrong would misplace every position after it).
            made = statement_positions(spliced, statement, self.memo)
            if made.lines != new_count or made.code != code:
                return None
        counts = list(last.statement_lines)
        counts[at] = new_count
        self._last = _Parsed(source.text, spliced, counts, last.first_indented)
        self.reparsed = 1
        self.parsed_inside = inside.parsed
        self.memo.remade = inside.remade_from
        return spliced

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


class _Inside:
    """Where in a top-level statement a change falls, and that stretch parsed again.

    Lines are 0-based lines of the old text; the change replaced old lines ``[first, after)`` (none where
    text was only inserted before line ``first``). In a block (``body`` of a def, class, loop, ``if``,
    ``with``, ``try``) each statement owns its leading lines and its code; the lines after its code up
    to the next statement's leading lines (a nested block's trailing comments) are its too. The change
    goes down into the one statement whose lines hold it, as long as that statement's block holds it;
    the statements of the innermost such block that hold the change are parsed again, inside ``if 1:``
    lines that give them their indentation (so that LibCST reads their comment and blank lines as in
    the whole file), and the statements around them are the very objects they were.

    Not taken (the enclosing stretch is parsed instead), where the owner of a line could change with
    the edit: a stretch after a statement with a block of its own that does not begin with code at the
    block's indentation (a comment there may close that block's code), a stretch that ends in a
    statement with a block where comment lines follow it, lines left over after the stretch's last
    statement, a block whose statements are decorated, an indentation that is not the module's
    repeated."""

    def __init__(self, module: "cst.Module", recorded: dict, base: int, old_lines: list[str],
                 new_lines: list[str], first: int, after: int) -> None:
        self.module = module
        self.recorded = recorded  # positions in the top-level statement's own code (its first line is 1)
        self.base = base  # the statement's first line in the text
        self.old_lines = old_lines
        self.new_lines = new_lines
        self.first = first
        self.last = max(after - 1, first)  # the last old line changed (or the line text went before)
        self.inserted = after == first  # lines only typed (before old line ``first``), none changed
        self.delta = len(new_lines) - len(old_lines)
        self.parsed = 0
        # Once parsed: each remade node (by id) and the old node it stands for; the new statements, the
        # line their stretch begins on, their block's depth, and where the old statements they replace began
        # and ended.
        self.remade_from: dict[int, cst.CSTNode] = {}
        self.statements: tuple = ()
        self.top = 0
        self.depth = 0
        self.old_span: tuple[int, int, int, int] = (0, 0, 0, 0)

    def remade(self, node: "cst.CSTNode") -> "cst.CSTNode | None":
        """``node`` with the stretch of its block (or of a block inside) parsed again; None where the
        change is not inside its block's statements or cannot be parsed there alone."""
        import libcst as cst

        block = getattr(node, "body", None)
        if not isinstance(block, cst.IndentedBlock) or not block.body:
            return None
        statements = block.body
        if any(getattr(statement, "decorators", ()) for statement in statements):
            return None
        recorded, base = self.recorded, self.base
        try:
            codes = [base + recorded[id(statement)][0] - 1 for statement in statements]
            end = base + recorded[id(statements[-1])][2] - 1
        except KeyError:
            return None
        tops = [code - len(statement.leading_lines) for code, statement in zip(codes, statements)]
        # Lines typed right after the block's last statement are parsed with it (where they are not this
        # block's, its parse fails and the block around it takes them).
        appended = self.inserted and self.first == end + 1 and not block.footer
        if self.first < tops[0] or (self.last > end and not appended):
            return None
        i = bisect.bisect_right(tops, self.first) - 1
        j = bisect.bisect_right(tops, self.last) - 1
        if self.inserted and not appended and self.first == tops[i]:
            # Lines typed between two statements: indented deeper, at the end of the block above; else
            # parsed alone, as statements of their own.
            typed = self.new_lines[self.first:self.first + self.delta]
            opening = next((line for line in typed if line.strip()), "")
            indent = _indent_of(self.old_lines[codes[i]])
            if i > 0 and opening.startswith(indent) and opening[len(indent):][:1] in (" ", "\t"):
                inner = self.remade(statements[i - 1])
                if inner is not None:
                    return self._replaced(node, block, i - 1, i - 1, (inner,))
            remade = self._parsed(statements, i, i - 1, self.first, self.first - 1, self.old_lines[codes[i]])
            if remade is not None:
                self.old_span = (*recorded[id(statements[i])][:2], -1, -1)  # nothing ended with them
                return self._replaced(node, block, i, i - 1, remade)
        if i == j:
            inner = self.remade(statements[i])
            if inner is not None:
                return self._replaced(node, block, i, i, (inner,))
        lasts = [top - 1 for top in tops[1:]] + [end]
        remade = self._parsed(statements, i, j, tops[i], lasts[j], self.old_lines[codes[i]])
        if remade is None:
            return None
        self.old_span = (*recorded[id(statements[i])][:2], *recorded[id(statements[j])][2:])
        return self._replaced(node, block, i, j, remade)

    def _replaced(self, node: "cst.CSTNode", block: "cst.IndentedBlock", i: int, j: int,
                  statements: tuple) -> "cst.CSTNode":
        """``node`` with statements ``i`` to ``j`` of its block ``node.body`` replaced by ``statements``."""
        body = (*block.body[:i], *statements, *block.body[j + 1:])
        made = node.with_changes(body=block.with_changes(body=body))
        self.remade_from[id(made)] = node
        self.remade_from[id(made.body)] = block
        return made

    def positions(self, module: "cst.Module", old: "StatementPositions", walked: "RemadeWalk",
                  code: str) -> "StatementPositions | None":
        """The remade top-level statement's positions from the old one's (``walked``: its nodes in visiting
        order, and where each one's tree ends there), the new statements' generated in place; None where
        their code is not the new text's lines for them."""
        from tcaudit.source.walk import positions_in_place, remade_positions

        order, ends = walked.found, walked.ends
        first, last = self.statements[0], self.statements[-1]
        start = next((k for k, node in enumerate(order) if node is first), None)
        end = next((k for k, node in enumerate(order) if node is last), None)
        if start is None or end is None:
            return None
        line = self.top - self.base + 1
        placed, made = positions_in_place(module, self.statements, line, self.depth)
        lines = self.new_lines[self.top:self.top + made.count("\n")]
        if not made.endswith("\n") or made != "\n".join(lines) + "\n":
            return None
        return remade_positions(old, order, range(start, ends[end]), self.remade_from, placed, self.old_span,
                                (*placed[id(first)][:2], *placed[id(last)][2:]), self.delta, code)

    def _parsed(self, statements, i: int, j: int, top: int, last: int, code_line: str) -> "tuple | None":
        """Statements ``i`` to ``j`` of a block (old lines ``top`` to ``last``) as the new text has them."""
        import libcst as cst

        indent = _indent_of(code_line)
        unit = self.module.default_indent
        depth = len(indent) // len(unit) if unit else 0
        if not indent or indent != unit * depth:
            return None
        new_last = last + self.delta
        if new_last < top:
            return None
        lines = self.new_lines[top:new_last + 1]
        opening = next((line for line in lines if line.strip()), None)
        if opening is None or not _at(opening, indent):
            if i > 0 and isinstance(statements[i - 1], cst.BaseCompoundStatement):
                return None  # a comment or a deeper line here may belong to the block above
        region = "".join(f"{unit * level}if 1:\n" for level in range(depth)) + "\n".join(lines) + "\n"
        parsed = _parse_region(region)
        if parsed is None or parsed.header or parsed.footer or len(parsed.body) != 1:
            return None
        node = parsed.body[0]
        for level in range(depth):
            if not isinstance(node, cst.If) or node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
                return None
            block = node.body
            if block.footer or (level < depth - 1 and len(block.body) != 1):
                return None
            if level == depth - 1:
                remade = tuple(block.body)
                break
            node = block.body[0]
        else:  # pragma: no cover - depth >= 1 always breaks
            return None
        if isinstance(remade[-1], cst.BaseCompoundStatement):
            # Comment lines right after the stretch may belong to its last statement's block now.
            for line in self.new_lines[new_last + 1:]:
                stripped = line.strip()
                if stripped.startswith("#"):
                    return None
                if stripped:
                    break
        self.parsed = len(remade)
        self.statements, self.top, self.depth = remade, top, depth
        return remade


def _indent_of(line: str) -> str:
    """The spaces and tabs ``line`` begins with."""
    return line[:len(line) - len(line.lstrip(" \t"))]


def _at(line: str, indent: str) -> bool:
    """Whether ``line`` is code that begins at ``indent`` exactly."""
    return line.startswith(indent) and line[len(indent):][:1] not in ("", " ", "\t", "#", "\x0c")


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
