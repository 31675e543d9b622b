"""Read a source file's text with everything needed to write it back byte-faithfully."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tcaudit.source.parsing import SourceError, read_source

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SourceText:
    path: Path
    raw: bytes
    text: str
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        """Encode new text the way the original was stored. LibCST keeps the file's own line
        endings (CRLF stays CRLF) in the text it generates, so only encoding and BOM matter here."""
        data = text.encode(self.encoding if self.encoding != "utf-8-sig" else "utf-8")
        return (BOM + data) if self.bom and not data.startswith(BOM) else data


def read_text(path: Path) -> SourceText:
    source = read_source(path)
    bom = source.raw.startswith(BOM)
    return SourceText(path=path, raw=source.raw, text=source.text, encoding=source.encoding, bom=bom)


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside the target, keep the mode, then rename over it: a reader
    never sees a half-written file and a crash leaves the original intact."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tcaudit-tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["SourceText", "SourceError", "read_text", "write_atomically"]
