"""Read a source file's text with everything needed to write it back byte-faithfully."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tcaudit.atomic import replace_atomically
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


def write_atomically(path: Path, data: bytes, expected: bytes | None = None) -> None:
    """Write ``data`` to the file ``path`` stands for (through symlinks: a link stays a link).

    A temporary file beside the target, given the target's mode and owner, is renamed over it: a
    reader never sees a half-written file and a crash leaves the original intact. Where the rename
    would change the file's identity in a way that shows (another owner this process cannot give
    the new file, or hard links that would keep the old text), the file is rewritten in place, with
    a backup beside it until the new text is on disk (:func:`_write_in_place`).

    ``expected``: the bytes the new text was made from. When the file holds anything else by the time
    it would be replaced (an edit saved while fix ran), nothing is written (NotWritable).
    """
    target = real_path(path)
    status = check_writable(target)
    backup = backup_path(target)
    if backup.exists():
        raise NotWritable(f"an interrupted fix left its backup {backup.name} beside it: compare the two, "
                          "remove the backup, then run fix again")
    if status.st_nlink > 1:
        if expected is not None:
            _still_as_read(target, expected)
        _write_in_place(target, data, backup)
        return

    def as_the_original(fd: int) -> None:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, stat.S_IMODE(status.st_mode))
        if hasattr(os, "fchown") and (status.st_uid, status.st_gid) != (os.geteuid(), os.getegid()):
            try:
                os.fchown(fd, status.st_uid, status.st_gid)
            except PermissionError:
                raise _KeepInode from None

    still_as_read = (lambda: _still_as_read(target, expected)) if expected is not None else None
    try:
        replace_atomically(target, data, prepare=as_the_original, check=still_as_read, sync=True,
                           suffix=".tcaudit-tmp")
    except _KeepInode:
        if expected is not None:
            _still_as_read(target, expected)
        _write_in_place(target, data, backup)


class _KeepInode(Exception):
    """The new file could not be given the old one's owner: rewrite the old one instead."""


def backup_path(target: Path) -> Path:
    """Where an in-place rewrite keeps the original until the new text is on disk."""
    return target.with_name(f".{target.name}.tcaudit-backup")


def _still_as_read(target: Path, expected: bytes) -> None:
    try:
        now = target.read_bytes()
    except OSError as exc:
        raise NotWritable(f"cannot read it again before writing: {exc.strerror or exc}") from None
    if now != expected:
        raise NotWritable("it changed on disk while fix ran (an editor saved it?): nothing written; "
                          "run fix again")


def _write_in_place(target: Path, data: bytes, backup: Path) -> None:
    """Rewrite the file's own inode (its hard links see the new text): the original goes to
    ``backup`` first (written and renamed into place, then synced), the file is rewritten, and the
    backup is removed once the new text is synced. A failure on the way puts the original back; a
    process killed on the way leaves the backup, which the next fix of the file reports."""
    original = target.read_bytes()
    replace_atomically(backup, original, sync=True, suffix=".tcaudit-tmp")
    try:
        with open(target, "r+b") as out:
            out.write(data)
            out.truncate()
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        with open(target, "r+b") as out:
            out.write(original)
            out.truncate()
            out.flush()
            os.fsync(out.fileno())
        backup.unlink()
        raise
    backup.unlink()


__all__ = ["NotWritable", "SourceText", "SourceError", "backup_path", "check_writable", "read_text", "real_path", "write_atomically"]
