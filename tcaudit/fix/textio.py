"""Read a source file's text with everything needed to write it back byte-faithfully."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tcaudit.source.parsing import SourceError, SourceFile, read_source

if TYPE_CHECKING:
    from tcaudit.source.notebook import Notebook

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SourceText:
    path: Path
    raw: bytes
    text: str
    encoding: str
    bom: bool
    # A Jupyter notebook: ``text`` is its virtual script, and ``encode`` writes the cells back.
    notebook: "Notebook | None" = None

    def encode(self, text: str) -> bytes:
        """Encode new text the way the original was stored. LibCST keeps the file's own line
        endings (CRLF stays CRLF) in the text it generates, so only encoding and BOM matter here.
        A notebook's new virtual script becomes the notebook's bytes with the changed code cells'
        sources (raises NotebookEditError where that cannot be done: tcaudit/source/notebook.py)."""
        if self.notebook is not None:
            return self.notebook.render(text)
        data = text.encode(self.encoding if self.encoding != "utf-8-sig" else "utf-8")
        return (BOM + data) if self.bom and not data.startswith(BOM) else data


def read_text(path: Path) -> SourceText:
    return source_text(read_source(path))


def source_text(source: SourceFile) -> SourceText:
    """What writing ``source``'s text back byte-faithfully needs."""
    bom = source.raw.startswith(BOM)
    return SourceText(path=source.path, raw=source.raw, text=source.text, encoding=source.encoding, bom=bom,
                      notebook=source.notebook)


class NotWritable(Exception):
    """A file ``fix --apply`` must not or cannot write; the message says why (one line)."""


def real_path(path: Path) -> Path:
    """The file a path stands for, through every symlink: the one to write."""
    return Path(os.path.realpath(path))


def check_writable(path: Path) -> os.stat_result:
    """The real file's status, or NotWritable when it may not be rewritten: no write bit for its
    owner (a 0444 file stays as it is, even for root, who could write it) or no write access."""
    target = real_path(path)
    try:
        status = os.stat(target)
    except OSError as exc:
        raise NotWritable(f"cannot read its status: {exc.strerror or exc}") from None
    if not stat.S_ISREG(status.st_mode):
        raise NotWritable("not a regular file")
    mode = stat.S_IMODE(status.st_mode)
    if not mode & stat.S_IWUSR or not os.access(target, os.W_OK):
        raise NotWritable(f"the file is read-only (mode {mode:04o})")
    return status


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to the file ``path`` stands for (through symlinks: a link stays a link).

    A temporary file beside the target, given the target's mode and owner, is renamed over it: a
    reader never sees a half-written file and a crash leaves the original intact. Where the rename
    would change the file's identity in a way that shows (another owner this process cannot give
    the new file, or hard links that would keep the old text), the file is rewritten in place.
    """
    target = real_path(path)
    status = check_writable(target)
    if status.st_nlink > 1:
        _write_in_place(target, data)
        return
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tcaudit-tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.chmod(tmp, stat.S_IMODE(status.st_mode))
            if hasattr(os, "fchown") and (status.st_uid, status.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(out.fileno(), status.st_uid, status.st_gid)
                except PermissionError:
                    raise _KeepInode from None
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except _KeepInode:
        os.unlink(tmp)
        _write_in_place(target, data)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _KeepInode(Exception):
    """The new file could not be given the old one's owner: rewrite the old one instead."""


def _write_in_place(target: Path, data: bytes) -> None:
    with open(target, "r+b") as out:
        out.write(data)
        out.truncate()
        out.flush()
        os.fsync(out.fileno())


__all__ = ["NotWritable", "SourceText", "SourceError", "check_writable", "read_text", "real_path", "write_atomically"]
