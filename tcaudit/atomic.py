"""Replace a file so that no reader ever sees half of it: the one way tcaudit writes a file it keeps
(a fixed script, a cache entry, a fix's backup)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def replace_atomically(
    target: Path,
    data: bytes,
    *,
    prepare: Callable[[int], None] | None = None,
    check: Callable[[], None] | None = None,
    sync: bool = False,
    suffix: str = ".tmp",
) -> None:
    """Write ``data`` to a temporary file beside ``target`` and rename it over ``target``. A failure
    anywhere (``prepare`` or ``check`` raising included) removes the temporary file and leaves
    ``target`` as it was. ``prepare(fd)``: give the new file its mode and owner before the rename;
    ``sync``: on disk (``fsync``) before the rename; ``check()``: a last look before the rename (raise to
    keep the old file); ``suffix``: how the temporary file's name ends, for a crash's leftovers to be
    found by."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:16]}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if prepare is not None:
                prepare(out.fileno())
            if sync:
                os.fsync(out.fileno())
        if check is not None:
            check()
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
