"""Read a file once, decode it as Python does, and parse it with LibCST only when a rule needs it."""

from __future__ import annotations

import ast
import errno
import io
import os
import re
import stat
import tokenize
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from tcaudit.source.errors import SourceError  # noqa: F401 - re-exported: the readers of files catch it from here

if TYPE_CHECKING:
    import libcst as cst

    from tcaudit.source.notebook import Notebook


def line_starts(text: str) -> list[int]:
    """The offset each line of ``text`` starts at (lines end at ``\n``; a text ending with one has an
    empty last line)."""
    starts = [0]
    find = text.find
    at = find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = find("\n", at + 1)
    return starts


def common_prefix(a: "Sequence", b: "Sequence") -> int:
    """How many leading items (characters of two texts, lines of two line lists) ``a`` and ``b`` share:
    a search by halves, comparing slices (in C) instead of item by item."""
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low]; the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def common_suffix(a: "Sequence", b: "Sequence", prefix: int = 0) -> int:
    """How many trailing items ``a`` and ``b`` share, not reaching into their first ``prefix`` (the
    common prefix, so that a changed stretch is never counted on both sides)."""
    low, high = 0, min(len(a), len(b)) - prefix
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle:len(a) - low] == b[len(b) - middle:len(b) - low]:
            low = middle
        else:
            high = middle - 1
    return low


def looks_like_python2(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("print ") and not stripped.startswith("print ("):
            return True
        if stripped.startswith("exec ") or " ur'" in stripped or "except " in stripped and ", e:" in stripped:
            return True
    return False


@dataclass
class SourceFile:
    path: Path
    display_path: str
    raw: bytes
    text: str
    encoding: str
    # A Jupyter notebook's cells (tcaudit/source/notebook.py): ``text`` is then its virtual script.
    notebook: "Notebook | None" = field(default=None, repr=False)
    _module: cst.Module | None = field(default=None, repr=False)
    _lines: list[str] | None = field(default=None, repr=False)

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines

    def line_text(self, line: int) -> str:
        lines = self.lines
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def with_module(self, module: cst.Module) -> "SourceFile":
        """This file with its LibCST module given: one parsed already (``module.code`` is ``text``)."""
        self._module = module
        return self

    @property
    def parsed_module(self) -> "cst.Module | None":
        """The LibCST module where the text was parsed already; None before (nothing is parsed here)."""
        return self._module

    @property
    def module(self) -> cst.Module:
        """The LibCST module, parsed on first use. Raises SourceError for unparsable code."""
        if self._module is None:
            import libcst as cst  # here, not at the top: a scan answered from the cache never parses

            # Deeply nested brackets go to Python's own parser first: it refuses what Python cannot
            # run (brackets nested beyond 200 levels), which LibCST's native parser would recurse on
            # until the process's stack overflows. Other files skip that second parse.
            if max_bracket_depth(self.text) >= DEEP_NESTING:
                error = python_syntax_error(self.text, self.display_path)
                if error is not None:
                    raise error
            error = beyond_analysis(self.text, self.display_path)
            if error is not None:
                raise error
            try:
                self._module = cst.parse_module(self.text)
            except cst.ParserSyntaxError as exc:
                error = python_syntax_error(self.text, self.display_path)
                if error is not None:
                    raise error from None  # Python's own message (a Python 2 file says so)
                raise SourceError(
                    f"cannot parse with LibCST (Python itself accepts this file): {exc.message}",
                    line=max(exc.raw_line, 1),
                    column=exc.raw_column + 1,
                ) from None
            except RecursionError:
                raise SourceError("cannot parse: nesting too deep") from None
            except MemoryError:
                raise SourceError("cannot parse: out of memory while parsing") from None
        return self._module


# Bracket depth from which a file is checked by Python's parser before LibCST's (Python stops at 200).
DEEP_NESTING = 100
_NOT_BRACKETS = re.compile(r"[^()\[\]{}]+")


def max_bracket_depth(text: str) -> int:
    """The deepest bracket nesting in ``text``, counting brackets in strings and comments too (an
    over-estimate at worst, which only costs the extra check)."""
    depth = deepest = 0
    for char in _NOT_BRACKETS.sub("", text):
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


# Code that only a generator writes: a physical line this long, or this many ``elif`` arms.
LONG_LINE = 2_000
MANY_ARMS = 1_000
# Past these, one statement is reported as too large to analyse (TC000) instead of analysed: LibCST's
# parser takes time quadratic in an expression's depth (a 5,000-term sum took 32 s to parse), and
# such statements are data or generated code, not training logic.
MAX_EXPRESSION_DEPTH = 500
MAX_STATEMENT_NODES = 50_000


def beyond_analysis(text: str, filename: str = "<unknown>") -> SourceError | None:
    """For a file with generated-looking code (a line over :data:`LONG_LINE` characters, or
    :data:`MANY_ARMS` ``elif`` arms), what stops its analysis: CPython's own refusal to compile it (a
    3,000-arm ``elif`` chain overflows the compiler's recursion), or one statement too large to analyse
    in reasonable time (an expression nested over :data:`MAX_EXPRESSION_DEPTH` deep, or over
    :data:`MAX_STATEMENT_NODES` nodes). None for every other file, at the cost of one scan of the text."""
    if text.count("elif ") < MANY_ARMS and not any(len(line) > LONG_LINE for line in text.splitlines()):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text, filename=filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return python_syntax_error(text, filename)
    error = _compile_error(text)
    if error is not None:
        return error
    for statement in tree.body:
        nodes, deepest, where = 0, 0, statement.lineno
        stack = [(statement, 0)]
        while stack:
            node, depth = stack.pop()
            nodes += 1
            if depth > deepest:
                deepest, where = depth, getattr(node, "lineno", where)
            inside = isinstance(node, ast.expr)
            stack.extend((child, depth + 1 if inside else 0) for child in ast.iter_child_nodes(node))
        if deepest > MAX_EXPRESSION_DEPTH:
            return SourceError(f"too large to analyse: an expression nested {deepest} deep on line {where} "
                               f"(tcaudit analyses up to {MAX_EXPRESSION_DEPTH})", line=where)
        if nodes > MAX_STATEMENT_NODES:
            return SourceError(f"too large to analyse: the statement on line {statement.lineno} has {nodes} parts "
                               f"(tcaudit analyses up to {MAX_STATEMENT_NODES})", line=statement.lineno)
    return None


_COMPILE = """
import ast, json, sys, warnings
text = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(text, "<file>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
except SyntaxError as exc:
    print(json.dumps([exc.msg, exc.lineno or 1, exc.offset or 1]))
except (ValueError, RecursionError, MemoryError) as exc:
    print(json.dumps([str(exc), 1, 1]))
"""


def _compile_error(text: str) -> SourceError | None:
    """What CPython says when it compiles ``text`` as ``python train.py`` would: in a fresh interpreter
    with the default recursion limit (a scan raises its own for LibCST, under which a 3,000-arm ``elif``
    chain compiles that ``python`` refuses). None when it compiles, or when that cannot be told."""
    import json
    import subprocess
    import sys

    try:
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", _COMPILE], input=text.encode("utf-8", "surrogateescape"),
                              capture_output=True, timeout=60)
        verdict = json.loads(proc.stdout) if proc.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not verdict:
        return None
    message, line, column = verdict
    return SourceError(f"CPython cannot compile it: {message}", line=max(int(line), 1), column=max(int(column), 1))


def python_syntax_error(text: str, filename: str = "<unknown>") -> SourceError | None:
    """Python's own verdict on ``text``: None when it parses, else a SourceError with its position."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like are not our business
            ast.parse(text, filename=filename)
    except SyntaxError as exc:
        message = f"cannot parse: {exc.msg}"
        if looks_like_python2(text):
            message = "cannot parse: this looks like Python 2 code (tcaudit reads Python 3 only)"
        return SourceError(message, line=max(exc.lineno or 1, 1), column=max(exc.offset or 1, 1))
    except (ValueError, RecursionError, MemoryError) as exc:
        return SourceError(f"cannot parse: {exc}")
    return None


def _utf8_problem(raw: bytes) -> tuple[str, int] | None:
    """Where and why ``raw`` is not UTF-8, as (reason, 1-based line); None if it decodes."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return f"byte 0x{raw[exc.start]:02x} on line {line} is not valid UTF-8", line
    return None


def _codec_name(encoding: str) -> str:
    return encoding.upper() if encoding.lower().startswith("utf") else encoding


_ENCODING_HINT = "add a PEP 263 coding line such as `# -*- coding: latin-1 -*-`, or save the file as UTF-8"


def read_file_bytes(path: Path) -> bytes:
    """The bytes of a regular file. A FIFO, socket or device (which could block forever or never
    end), a symlink loop or an unreadable file raises SourceError instead."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceError("cannot read file: a symlink loop") from None
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise SourceError(f"cannot read file: a symlink to nothing ({os.readlink(path)})") from None
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError("cannot read file: not a regular file (a FIFO, socket or device)")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as exc:
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_source(path: Path, display_path: str | None = None) -> SourceFile:
    """Read and decode a file with Python's own rules (PEP 263 cookie, BOM, UTF-8 default)."""
    return decode_source(read_file_bytes(path), path, display_path)


def decode_source(raw: bytes, path: Path, display_path: str | None = None) -> SourceFile:
    """``raw`` (a file's bytes, or a text not on disk such as an editor's buffer) decoded as
    :func:`read_source` decodes a file: SourceError where it is not Python source text."""
    display = display_path or path.as_posix()
    from tcaudit.source.notebook import is_notebook

    if is_notebook(path):
        return notebook_source(path, display, raw)
    if b"\x00" in raw:
        raise SourceError("cannot parse: binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        reason = getattr(exc, "msg", None) or str(exc)
        if reason.startswith("unknown encoding"):
            raise SourceError(f"cannot decode: the coding line names an {reason}") from None
        if reason.startswith("encoding problem"):
            raise SourceError(
                f"cannot decode: the coding line contradicts the UTF-8 byte order mark ({reason})"
            ) from None
        problem = _utf8_problem(raw)
        if problem is not None:
            raise SourceError(f"cannot decode as UTF-8: {problem[0]} ({_ENCODING_HINT})", line=problem[1]) from None
        raise SourceError(f"cannot decode: {reason}") from None
    try:
        text = raw.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            line = raw[: exc.start].count(b"\n") + 1
            reason = f"byte 0x{raw[exc.start]:02x} on line {line} is not valid {_codec_name(encoding)}"
        else:
            line, reason = 1, str(exc)
        raise SourceError(f"cannot decode as {_codec_name(encoding)}: {reason} ({_ENCODING_HINT})", line=line) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return SourceFile(path=path, display_path=display, raw=raw, text=text, encoding=encoding)


def notebook_source(path: Path, display: str, raw: bytes) -> SourceFile:
    """A notebook's bytes as a SourceFile whose text is its virtual script (tcaudit/source/notebook.py)."""
    from tcaudit.source.notebook import Notebook

    notebook = Notebook.parse(raw)
    return SourceFile(path=path, display_path=display, raw=raw, text=notebook.text, encoding="utf-8", notebook=notebook)
