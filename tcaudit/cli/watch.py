"""``tcaudit scan --watch``: scan, then scan again each time a scanned file or the config changes, as
ruff's ``check --watch``. Changes are found by polling each file's size and modification time (no
watcher library, no thread): a few hundred ``stat`` calls twice a second."""

from __future__ import annotations

import os
import time
from typing import Callable, TextIO

POLL_SECONDS = 0.5


def snapshot(paths: list[str]) -> dict[str, tuple[int, int] | None]:
    """Each path's (size, mtime in ns), None for one that cannot be read (removed since)."""
    out: dict[str, tuple[int, int] | None] = {}
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            out[path] = None
        else:
            out[path] = (stat.st_size, stat.st_mtime_ns)
    return out


def watch(
    scan: Callable[[], int],
    files: Callable[[], list[str]],
    messages: TextIO,
    *,
    wait: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
) -> int:
    """Run ``scan``, then again whenever what ``files`` lists (asked anew each time: a new file in a
    scanned folder counts) changes. Returns the last scan's exit code when interrupted (Ctrl-C) or after
    ``rounds`` scans (for tests; None: until interrupted)."""
    code = 0
    done = 0
    try:
        print("tcaudit: watching for changes (Ctrl-C stops)", file=messages, flush=True)
        while True:
            seen = snapshot(files())
            code = scan()
            done += 1
            if rounds is not None and done >= rounds:
                return code
            while True:
                wait(POLL_SECONDS)
                now = snapshot(files())
                if now != seen:
                    break
            print("tcaudit: a file changed; scanning again", file=messages, flush=True)
    except KeyboardInterrupt:
        return code
