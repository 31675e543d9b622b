"""What the scanner takes from the model's side of the sandbox, and how: never a path the model could
have replaced, never an unbounded read, never a parse without a depth limit.

The model's process shares one private folder with the scanner (``tcaudit-model-*``) and can create
anything there: a symlink to ``~/.bashrc`` under the name of the next job, a FIFO under the name of the
result, a hard link, ``/dev/zero`` named in a result. So the result and the log travel through
descriptors opened before the model's code runs (:mod:`tcaudit.model.worker` creates them as anonymous
memory files and forwards what they hold over its own pipe), the job travels over that pipe too, and
where a file in the folder must be read (one process per model, on platforms without ``fork``) it is
opened relative to the folder's descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and accepted only as a
regular file of ours, with one link, under a size cap. A result is parsed only below a nesting depth,
and the files it names (``depends_on``) and the places it points at (construction sites) are kept only
where they are regular files inside the model's own project folders, read through the same opener.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import Any, Iterable

MAX_RESULT_BYTES = 64 * 1024**2  # a result larger than this is not a model's facts: TC100
MAX_DEPTH = 64  # a model's facts nest about 6 deep
MAX_PROJECT_FILE = 16 * 1024**2  # a user's module named in depends_on larger than this is not hashed
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\[\]|\{\}")


class ChannelError(ValueError):
    """What came from the model's side is not what the scanner asked for (the reason is the message)."""


def nesting_depth_within(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects at most ``limit`` deep, found without
    recursion (strings removed, then the innermost pairs peeled off once per level)."""
    brackets = _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", raw))
    for _ in range(limit):
        if not brackets:
            return True
        brackets, peeled = _INNERMOST.subn(b"", brackets)
        if not peeled:
            return True  # unbalanced: json.loads says why
    return not brackets


def parse_untrusted(raw: bytes, limit: int = MAX_RESULT_BYTES) -> Any:
    """``raw`` as JSON, refused (ChannelError) past ``limit`` bytes, past :data:`MAX_DEPTH` levels, or
    when it is not JSON (invalid UTF-8, lone surrogates, NaN words included)."""
    if len(raw) > limit:
        raise ChannelError(f"the audit process wrote a result over {limit >> 20} MiB")
    if not nesting_depth_within(raw):
        raise ChannelError(f"the audit process wrote a result nested deeper than {MAX_DEPTH} levels")
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ChannelError(f"the audit process wrote a result that is not JSON ({type(exc).__name__})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_private(folder_fd: int, name: str, limit: int) -> bytes:
    """The bytes of ``name`` in the private folder open as ``folder_fd``: no symlink followed, no FIFO
    waited on, only a regular file owned by this user with one link, at most ``limit`` bytes
    (ChannelError otherwise)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(name, flags, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChannelError(f"{name} in the audit's folder is a symlink") from None
        raise ChannelError(f"{name} in the audit's folder cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ChannelError(f"{name} in the audit's folder is not a regular file")
        if info.st_nlink != 1 or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            raise ChannelError(f"{name} in the audit's folder is a link to another file")
        return read_capped(fd, limit, name)
    finally:
        os.close(fd)


def read_private_path(folder: str, name: str, limit: int) -> bytes:
    """:func:`read_private` where ``os.open`` takes a folder's descriptor, else (Windows: no FIFOs, no
    links a process without privileges can make) by its path, still checked to be a regular file."""
    if os.open in os.supports_dir_fd:
        folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            return read_private(folder_fd, name, limit)
        finally:
            os.close(folder_fd)
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise ChannelError(f"{name} in the audit's folder cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.path.islink(path):
            raise ChannelError(f"{name} in the audit's folder is not a regular file")
        return read_capped(fd, limit, name)
    finally:
        os.close(fd)


def read_capped(fd: int, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes from the start of the open file ``fd`` (ChannelError past it)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise ChannelError(f"{what} is over {limit >> 20} MiB")
    chunks, total = [], 0
    while total <= limit:
        chunk = os.pread(fd, min(1 << 20, limit + 1 - total), total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise ChannelError(f"{what} is over {limit >> 20} MiB")
    return b"".join(chunks)


def tail(fd: int, size: int = 4000) -> bytes:
    """The last ``size`` bytes of the open file ``fd`` (its log), however large it grew."""
    try:
        end = os.fstat(fd).st_size
        return os.pread(fd, size, max(0, end - size))
    except OSError:
        return b""


def inside(path: Any, folders: Iterable[str]) -> str | None:
    """``path``'s real path where it is an absolute path inside one of ``folders`` (real paths)."""
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        return None
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    for folder in folders:
        if folder and folder != os.sep and (real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)):
            return real
    return None


def project_file(path: Any, folders: Iterable[str], limit: int = MAX_PROJECT_FILE) -> str | None:
    """``path`` resolved, where it is a regular file of at most ``limit`` bytes inside ``folders``
    (the model's project): what a result may name as a file the build depends on."""
    real = inside(path, folders)
    if real is None:
        return None
    try:
        info = os.stat(real)
    except (OSError, ValueError):
        return None
    return real if stat.S_ISREG(info.st_mode) and info.st_size <= limit else None


def read_project_file(path: str, limit: int = MAX_PROJECT_FILE) -> bytes | None:
    """The bytes of a project file named by a result (already checked by :func:`project_file`), read
    without waiting on a FIFO or reading a device: None where it is no longer a regular file or too large."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return read_capped(fd, limit, path)
    except (OSError, ChannelError):
        return None
    finally:
        os.close(fd)
