"""Read a file once, decode it as Python does, and parse it with LibCST only when a rule needs it."""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst


class SourceError(Exception):
    """A file that cannot be read, decoded or parsed; reported as TC000."""

    def __init__(self, message: str, line: int = 1, column: int = 1):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


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

    @property
    def module(self) -> cst.Module:
        """The LibCST module, parsed on first use. Raises SourceError for unparsable code."""
        if self._module is None:
            try:
                self._module = cst.parse_module(self.text)
            except cst.ParserSyntaxError as exc:
                message = f"cannot parse: {exc.message}"
                if looks_like_python2(self.text):
                    message = "cannot parse: this looks like Python 2 code (tcaudit reads Python 3 only)"
                raise SourceError(message, line=max(exc.raw_line, 1), column=exc.raw_column + 1) from None
            except RecursionError:
                raise SourceError("cannot parse: nesting too deep") from None
        return self._module


def read_source(path: Path, display_path: str | None = None) -> SourceFile:
    """Read and decode a file with Python's own rules (PEP 263 cookie, BOM, UTF-8 default)."""
    display = display_path or path.as_posix()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise SourceError("cannot parse: binary file (contains NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        raise SourceError(f"cannot decode: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    try:
        text = raw.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        line = raw[: getattr(exc, "start", 0)].count(b"\n") + 1
        raise SourceError(
            f"cannot decode as {encoding}: {exc.reason if hasattr(exc, 'reason') else exc} "
            "(add a PEP 263 coding line or save the file as UTF-8)",
            line=line,
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return SourceFile(path=path, display_path=display, raw=raw, text=text, encoding=encoding)
