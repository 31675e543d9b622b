"""Jupyter notebooks (nbformat 4) read as a script, and written back cell by cell.

The one home of notebook handling. A :class:`Notebook` is parsed from the file's bytes (plain JSON:
nbformat is not needed). Its cells are numbered from 1 among all the notebook's cells, markdown and raw
ones included, as ruff 0.17 numbers them (``cell 3`` is the notebook's third cell, as Jupyter shows it;
tests/test_notebooks.py keeps ruff's observed output). Its code cells make one *virtual script*: each
cell's text, with IPython's own syntax masked (a line magic ``%matplotlib inline``, a shell line
``!nvidia-smi``, help ``obj?`` and ``?obj``, a capture ``files = !ls`` or ``t = %timeit -o f()``
becomes the comment ``# tcaudit-magic: %matplotlib inline`` at the same indentation), cells joined
by a separator comment line (``# %% tcaudit cell 3`` before the code cell that is the third cell). A cell that starts
with a cell magic (``%%time``, ``%%bash``) is left out of the script, as is every cell of a notebook
whose kernel is not Python. Rules, suppression comments and fixes work on the virtual script
unchanged; :meth:`Notebook.cell_position` turns its lines into (cell, line in the cell).

:meth:`Notebook.render` turns a fixed virtual script back into the notebook's bytes: only the code
cells whose text changed get a new ``source`` (in the cell's own representation: a list of lines or
one string, the last line with or without its newline as before); outputs, execution counts,
metadata, attachments, ids and key order are kept, and the file is written in its own JSON style
(the indentation, separators and escaping that reproduce the original bytes). An edit that cannot be
put back cell by cell (it moved or removed a separator, changed a masked magic line, or left a cell
that no longer compiles on its own) raises :class:`NotebookEditError`, and the file is left alone.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tcaudit.source.errors import SourceError

if TYPE_CHECKING:
    from tcaudit.findings import Finding, TextEdit

SUFFIX = ".ipynb"
SEPARATOR = "# %% tcaudit cell "  # + the code cell's number; a line of its own at column 0
MAGIC = "# tcaudit-magic: "  # + the masked line, stripped; at the line's own indentation
_HELP = re.compile(r"^(\?{1,2}[\w.\[\]()]+|[\w.\[\]()]+\?{1,2})$")
# IPython's captures: ``files = !ls``, ``out = !!nvidia-smi``, ``t = %timeit -o f()``, ``a, b = %sx cmd``
# (never Python: no expression starts with ``!`` or ``%``).
_CAPTURE = re.compile(r"^[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*[!%]")


class NotebookEditError(Exception):
    """A change of the virtual script that cannot be written back into the notebook's cells."""


def is_notebook(path: Any) -> bool:
    """Whether ``path`` (a str or Path) names a notebook, by its suffix."""
    return str(path).lower().endswith(SUFFIX)


def _is_magic(stripped: str) -> bool:
    return stripped.startswith(("%", "!")) or bool(_HELP.match(stripped)) or bool(_CAPTURE.match(stripped))


def _scan_line(line: str, state: list) -> None:
    """Move ``state`` ([bracket depth, open string quote or "", backslash continuation]) past ``line``:
    a small lexer, enough to tell where statements start."""
    i, n = 0, len(line)
    state[2] = False
    while i < n:
        char = line[i]
        if state[1]:
            if char == "\\":
                i += 2
            elif line.startswith(state[1], i):
                i += len(state[1])
                state[1] = ""
            else:
                i += 1
            continue
        if char == "#":
            break
        if char in "'\"":
            triple = line[i:i + 3]
            state[1] = triple if triple in ("'''", '"""') else char
            i += len(state[1])
            continue
        if char in "([{":
            state[0] += 1
        elif char in ")]}":
            state[0] = max(state[0] - 1, 0)
        elif char == "\\" and i == n - 1:
            state[2] = True
        i += 1
    if state[1] in ("'", '"'):
        state[1] = ""  # a one-line string does not go on to the next line


def mask(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """``text``'s lines (without line ends) with IPython syntax masked, and the (placeholder, original)
    pairs in order. A line is IPython's only where it starts a statement: a ``%`` continuing an
    expression in brackets, or a line of a multi-line string, stays as it is. A masked line that ends
    with a backslash continues on the next line, which is masked too."""
    masked: list[str] = []
    pairs: list[tuple[str, str]] = []
    state: list = [0, "", False]  # bracket depth, open string quote, backslash continuation
    continued = False  # the previous line was masked and ended with a backslash
    for line in split_lines(text):
        stripped = line.strip()
        at_start = state[0] == 0 and not state[1] and not state[2]
        if continued or (at_start and stripped and _is_magic(stripped)):
            placeholder = _placeholder(line)
            masked.append(placeholder)
            pairs.append((placeholder, line))
            continued = stripped.endswith("\\")
            continue
        continued = False
        masked.append(line)
        _scan_line(line, state)
    return masked, pairs


def split_lines(text: str) -> list[str]:
    """``text``'s lines without their ends, split where Python's tokenizer ends a line (``\\n``,
    ``\\r\\n``, ``\\r``; not ``str.splitlines``'s form feeds and other separators)."""
    lines = _LINE_END.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


_LINE_END = re.compile(r"\r\n|\r|\n")
_LAST_END = re.compile(r"(\r\n|\r|\n)\Z")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # valid in JSON ("\\ud800"), not in any text file
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _lines_with_ends(text: str) -> list[str]:
    return _LINE.findall(text)


def _placeholder(line: str) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    return f"{indent}{MAGIC}{line.strip()}"


def _compiles(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


@dataclass
class CodeCell:
    number: int  # 1-based among all the notebook's cells (markdown and raw too), as ruff numbers them
    index: int  # its place in the notebook's ``cells``
    source: str  # the cell's text as stored
    as_list: bool  # ``source`` stored as a list of lines (else one string)
    included: bool  # part of the virtual script (not a cell magic, a Python notebook)
    masked: str = ""  # its text in the virtual script: masked, each line ending with "\n"
    placeholders: list[tuple[str, str]] = field(default_factory=list)
    first_line: int = 0  # the virtual script's line of the cell's first line (0: none)
    line_count: int = 0

    @property
    def masked_lines(self) -> list[str]:
        """The cell's lines as the virtual script has them."""
        return split_lines(self.masked)

    @property
    def lines(self) -> list[str]:
        """The cell's lines as the notebook shows them (unmasked)."""
        return split_lines(self.source)


def _json_style(text: str, data: Any) -> dict[str, Any] | None:
    """The ``json.dumps`` arguments that write ``data`` back as ``text`` byte for byte, or None."""
    body = text[:-1] if text.endswith("\n") else text
    indents: list[Any] = [1, 2, 4, None, "\t", 3]
    match = re.search(r"\n([ \t]+)\S", body)
    if match:
        found = match.group(1)
        indents.insert(0, len(found) if found.strip(" ") == "" else found)
    for indent in dict.fromkeys(indents):
        for separators in ((",", ": "), (", ", ": "), (",", ":")):
            for ensure_ascii in (False, True):
                style = {"indent": indent, "separators": separators, "ensure_ascii": ensure_ascii}
                if json.dumps(data, **style) == body:
                    return style
    return None


def _guessed_style(text: str) -> dict[str, Any]:
    """Jupyter's own style, with the file's indentation where it has one (a file no style reproduces)."""
    match = re.search(r"\n([ \t]+)\S", text)
    indent: Any = 1
    if match:
        found = match.group(1)
        indent = len(found) if found.strip(" ") == "" else found
    elif "\n" not in text.rstrip("\n"):
        indent = None
    return {"indent": indent, "separators": (",", ": ") if indent is not None else (", ", ": "), "ensure_ascii": False}


class Notebook:
    """One notebook's code cells as a script (see the module's docstring)."""

    def __init__(self, raw: bytes, data: dict[str, Any], text: str) -> None:
        self.raw = raw
        self.data = data
        self._text = text  # the file's JSON text
        self.cells: list[CodeCell] = []
        self.python = _is_python(data.get("metadata"))
        for index, cell in enumerate(data["cells"]):
            if not isinstance(cell, dict) or cell.get("cell_type") != "code":
                continue
            number = index + 1
            source = cell.get("source", "")
            as_list = isinstance(source, list)
            if as_list:
                if not all(isinstance(part, str) for part in source):
                    raise SourceError(f"not a Jupyter notebook: code cell {number}'s source is not text")
                source = "".join(source)
            elif not isinstance(source, str):
                raise SourceError(f"not a Jupyter notebook: code cell {number}'s source is not text")
            surrogate = _LONE_SURROGATE.search(source)
            if surrogate:
                line = source[: surrogate.start()].count("\n") + 1
                raise SourceError(f"cannot parse notebook: code cell {number} line {line} holds a lone surrogate "
                                  f"(\\u{ord(surrogate.group()):04x}), which is not Unicode text")
            included = self.python and not source.lstrip().startswith("%%")
            self.cells.append(CodeCell(number, index, source, as_list, included))
        self._by_number = {cell.number: cell for cell in self.cells}
        parts: list[str] = []
        line = 1
        first = True
        for cell in self.cells:
            if not cell.included:
                continue
            if not first:
                parts.append(f"{SEPARATOR}{cell.number}\n")
                line += 1
            first = False
            masked, cell.placeholders = mask(cell.source)
            cell.masked = "".join(f"{part}\n" for part in masked)
            cell.first_line, cell.line_count = line, len(masked)
            parts.append(cell.masked)
            line += len(masked)
        self.text = "".join(parts)  # the virtual script

    @classmethod
    def parse(cls, raw: bytes) -> "Notebook":
        """The notebook in ``raw``; SourceError where it is not valid JSON or not an nbformat 4 notebook."""
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise SourceError(f"cannot parse notebook: byte 0x{raw[exc.start]:02x} on line {line} is not valid UTF-8",
                              line=line) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceError(f"cannot parse notebook: invalid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
                              line=exc.lineno, column=exc.colno) from None
        except RecursionError:
            raise SourceError("cannot parse notebook: nesting too deep") from None
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            raise SourceError("not a Jupyter notebook: no list of cells at the top level")
        if data.get("nbformat") != 4:
            raise SourceError(f"not a Jupyter notebook in nbformat 4 (nbformat is {data.get('nbformat')!r})")
        return cls(raw, data, text)

    # -- positions --------------------------------------------------------------------------------
    def cell(self, number: int) -> CodeCell | None:
        """The code cell that is the notebook's ``number``-th cell (None: no such cell, or not code)."""
        return self._by_number.get(number)

    def cell_position(self, line: int) -> tuple[int, int] | None:
        """(code cell number, line in the cell) of the virtual script's line ``line``; a separator line
        counts as the previous cell's last line. None where the script has no cells."""
        chosen = None
        for cell in self.cells:
            if not cell.included:
                continue
            if chosen is None or cell.first_line <= line:
                chosen = cell
            if cell.first_line > line:
                break
        if chosen is None:
            return None
        within = line - chosen.first_line + 1
        return chosen.number, max(1, min(within, max(chosen.line_count, 1)))

    # -- writing back -----------------------------------------------------------------------------
    def new_sources(self, text: str) -> dict[int, str]:
        """The new source of each code cell that ``text`` (a version of the virtual script) changes,
        by cell number, unmasked. Raises NotebookEditError where the change cannot be made cell by cell."""
        if text == self.text:
            return {}
        included = [cell for cell in self.cells if cell.included]
        if not included:
            raise NotebookEditError("the notebook has no Python code cells to change")
        segments: list[list[str]] = [[]]
        expected = [f"{SEPARATOR}{cell.number}" for cell in included[1:]]
        found: list[str] = []
        for line in _lines_with_ends(text):
            bare = line.rstrip("\r\n")
            if bare.startswith(SEPARATOR.rstrip()):
                found.append(bare)
                segments.append([])
                continue
            segments[-1].append(line)
        if found != expected:
            raise NotebookEditError("the fix spans notebook cells (it moves code across a cell boundary)")
        changed: dict[int, str] = {}
        for cell, lines in zip(included, segments):
            masked = "".join(lines)
            if masked == cell.masked:
                continue
            if not _compiles(masked) and _compiles(cell.masked):  # (the original's compile only when needed)
                raise NotebookEditError(
                    f"the fix spans notebook cells (cell {cell.number} would not compile on its own)")
            changed[cell.number] = self._unmasked(cell, masked)
        return changed

    def _unmasked(self, cell: CodeCell, masked: str) -> str:
        pending = list(cell.placeholders)
        out: list[str] = []
        for line in _lines_with_ends(masked):
            bare = line.rstrip("\r\n")
            if bare.lstrip().startswith(MAGIC):
                if not pending or pending[0][0] != bare:
                    raise NotebookEditError(f"the fix would change an IPython line of cell {cell.number} ({bare.strip()})")
                out.append(pending.pop(0)[1] + line[len(bare):])
            else:
                out.append(line)
        if pending:
            raise NotebookEditError(f"the fix would remove an IPython line of cell {cell.number} ({pending[0][1].strip()})")
        source = "".join(_with_line_ends(cell.source, out))
        if not cell.source.endswith(("\n", "\r")) and source.endswith(("\n", "\r")):
            source = _LAST_END.sub("", source)  # Jupyter stores a cell's last line without its newline
        return source

    def check(self, text: str) -> str | None:
        """Why ``text`` cannot be written back into the notebook, or None when it can."""
        try:
            self.new_sources(text)
        except NotebookEditError as exc:
            return str(exc)
        return None

    def render(self, text: str) -> bytes:
        """The notebook's bytes with the code cells that ``text`` changes given their new source; the
        original bytes where it changes none. Raises NotebookEditError (see :meth:`new_sources`)."""
        changed = self.new_sources(text)
        if not changed:
            return self.raw
        data = json.loads(self._text)  # a fresh copy, in the file's key order
        for number, source in changed.items():
            cell = self._by_number[number]
            data["cells"][cell.index]["source"] = _lines_with_ends(source) if cell.as_list else source
        text = self._text.replace("\r\n", "\n")  # a file saved with Windows line ends keeps them
        style = _json_style(text, self.data) or _guessed_style(text)
        out = json.dumps(data, **style)
        if text.endswith("\n"):
            out += "\n"
        if "\r\n" in self._text:
            out = out.replace("\n", "\r\n")
        encoded = out.encode("utf-8")
        return (b"\xef\xbb\xbf" + encoded) if self.raw.startswith(b"\xef\xbb\xbf") else encoded

    def cell_lines_in(self, text: str) -> str:
        """``text`` (a message) with the virtual script's line numbers it names (``line 90``, ``lines 90-91``,
        ``train.ipynb:90``) given as the cells' (``cell 5 line 37``, ``cell 5 lines 37-38``,
        ``train.ipynb:cell 5:37``)."""
        if not text or not self.cells:
            return text

        def at(number: str) -> tuple[int, int] | None:
            return self.cell_position(int(number))

        def lines(match: re.Match) -> str:
            word, numbers = match.group(1), re.findall(r"\d+|\D+", match.group(2))
            places = [at(part) if part.isdigit() else part for part in numbers]
            cells = {place[0] for place in places if isinstance(place, tuple)}
            if None in places or not cells:
                return match.group(0)
            if len(cells) == 1:
                body = "".join(str(p[1]) if isinstance(p, tuple) else p for p in places)
                return f"cell {cells.pop()} {word} {body}"
            return "".join(f"cell {p[0]} line {p[1]}" if isinstance(p, tuple) else " to " if p == "-" else p
                           for p in places)

        def file_line(match: re.Match) -> str:
            place = at(match.group(2))
            return f"{match.group(1)}:cell {place[0]}:{place[1]}" if place else match.group(0)

        text = re.sub(r"\b(lines?) (\d+(?:(?:-|, | and )\d+)*)\b", lines, text)
        return re.sub(r"(\.ipynb):(\d+)\b", file_line, text)

    def cell_diffs(self, text: str, display: str) -> str:
        """Unified diffs of the cells ``text`` changes, one per cell, headed ``a/<display>:cell N``."""
        import difflib

        header = (lambda side: display) if display.startswith("/") else (lambda side: f"{side}/{display}")
        out: list[str] = []
        for number, source in sorted(self.new_sources(text).items()):
            old = self._by_number[number].source
            old_lines = [line if line.endswith("\n") else line + "\n" for line in _lines_with_ends(old)]
            new_lines = [line if line.endswith("\n") else line + "\n" for line in _lines_with_ends(source)]
            out.extend(difflib.unified_diff(old_lines, new_lines, fromfile=f"{header('a')}:cell {number}",
                                            tofile=f"{header('b')}:cell {number}"))
        return "".join(out)


def _with_line_ends(original: str, lines: list[str]) -> list[str]:
    """``lines`` (a cell's new lines, each ending with ``\n`` as the virtual script has them) with the
    line ends of the cell as stored: a line kept from ``original`` keeps its own end (``\r\n``, ``\r``),
    a new line gets the end most of the cell's lines have."""
    import difflib

    old = _lines_with_ends(original)
    ends = [line[len(line.rstrip("\r\n")):] for line in old]
    if all(end in ("\n", "") for end in ends):
        return lines
    counted = [end for end in ends if end]
    usual = max(set(counted), key=counted.count) if counted else "\n"
    bare_old = [line.rstrip("\r\n") for line in old]
    bare_new = [line.rstrip("\r\n") for line in lines]
    out = [bare + (usual if line.endswith(("\n", "\r")) else "") for bare, line in zip(bare_new, lines)]
    matcher = difflib.SequenceMatcher(None, bare_old, bare_new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                if ends[i] and lines[j].endswith(("\n", "\r")):
                    out[j] = bare_new[j] + ends[i]
    return out


def _is_python(metadata: Any) -> bool:
    """Whether the notebook's kernel runs Python (a notebook that does not say is taken as Python)."""
    if not isinstance(metadata, dict):
        return True
    for table, key in (("kernelspec", "language"), ("language_info", "name")):
        value = metadata.get(table, {}).get(key) if isinstance(metadata.get(table), dict) else None
        if isinstance(value, str) and value.strip() and value.strip().lower() not in ("python", "python3", "ipython"):
            return False
    return True


def in_cells(finding: "Finding", notebook: Notebook) -> "Finding":
    """``finding`` (made in the virtual script's lines) in the notebook's coordinates: its location gets
    the code cell and the lines within it (an end beyond the cell is its last line).

    The fix's text edits (``Fix.edits``) are moved to their cell the same way, each with its ``cell``;
    where one of them does not lie within a single cell (it would edit a cell boundary) the fix keeps its
    description but no edits, since no cell-relative edit could say what it does."""
    import dataclasses

    loc = finding.location
    if loc.cell is not None:
        return finding
    start = notebook.cell_position(loc.line)
    if start is None:
        return finding
    cell = notebook.cell(start[0])
    assert cell is not None  # cell_position names an included code cell
    end_line, end_column = loc.end_line - cell.first_line + 1, loc.end_column
    if end_line > max(cell.line_count, 1):  # clamped to the cell's last line, to its end
        end_line = max(cell.line_count, 1)
        end_column = len(cell.masked_lines[end_line - 1]) + 1 if cell.masked_lines else 1
    end_line = max(end_line, start[1])
    location = dataclasses.replace(loc, line=start[1], end_line=end_line, end_column=end_column, cell=cell.number)
    fix = finding.fix
    if fix is not None:
        pending = fix.pending_edits  # edits made on demand are moved to their cells once made
        edits = (pending.then(lambda made: _edits_in_cells(made, notebook)) if pending is not None
                 else None if fix.edits is None else _edits_in_cells(fix.edits, notebook))
        fix = dataclasses.replace(
            fix, edits=edits,  # type: ignore[arg-type]
            reason=notebook.cell_lines_in(fix.reason) if fix.reason else fix.reason,
            description=notebook.cell_lines_in(fix.description),
        )
    related = tuple(_related_in_cells(place, loc.path, notebook) for place in finding.related)
    return dataclasses.replace(finding, location=location, fix=fix, message=notebook.cell_lines_in(finding.message),
                               explanation=notebook.cell_lines_in(finding.explanation), related=related)


def _edits_in_cells(edits, notebook: Notebook):
    """``edits`` of the virtual script moved into their cells; None where one of them spans cells."""
    moved = [_edit_in_cell(edit, notebook) for edit in edits]
    return None if any(e is None for e in moved) else tuple(moved)


def _related_in_cells(place, path: str, notebook: Notebook):
    """A related place in the same notebook (where a value is set, in an earlier cell) in its cell's lines."""
    import dataclasses

    loc = place.location
    if loc.path != path or loc.cell is not None:
        return place
    start = notebook.cell_position(loc.line)
    if start is None:
        return place
    span = loc.end_line - loc.line
    moved = dataclasses.replace(loc, line=start[1], end_line=start[1] + span, cell=start[0])
    return dataclasses.replace(place, location=moved, message=notebook.cell_lines_in(place.message))


def _edit_in_cell(edit: "TextEdit", notebook: Notebook) -> "TextEdit | None":
    import dataclasses

    for cell in notebook.cells:
        if not cell.included or not cell.first_line <= edit.line < cell.first_line + max(cell.line_count, 1):
            continue
        line = edit.line - cell.first_line + 1
        end = edit.end_line - cell.first_line + 1
        # An edit may end at the start of the line after the cell's last (it removes that line whole).
        if end > cell.line_count and not (end == cell.line_count + 1 and edit.end_column == 1):
            return None
        return dataclasses.replace(edit, line=line, end_line=end, cell=cell.number)
    return None
