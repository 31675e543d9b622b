"""The one error a file can raise while being read or parsed."""

from __future__ import annotations


class SourceError(Exception):
    """A file that cannot be read, decoded or parsed; reported as TC000."""

    def __init__(self, message: str, line: int = 1, column: int = 1):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
