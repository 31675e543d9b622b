"""The audit child's guard rail: a PEP 578 audit hook that refuses side effects of the user's code.

Building a model runs the user's constructor. In the process that builds it, this hook refuses
process creation (``os.system``, ``subprocess``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``),
network use (``socket.connect``, ``bind``, ``sendto``, name lookups), signals to other processes,
and writing, deleting, renaming or changing files outside the audit's private temporary folder.
A refused operation raises :class:`SandboxRefusal` (a ``PermissionError``) in the user's code, and
is recorded even when that code catches it: the model is then reported as not audited (TC100),
naming what was refused.

An audit hook is a guard rail, not a security boundary: native code (ctypes, a C extension) can do
anything without raising an audit event. Where the platform lets an unprivileged user create
namespaces (``unshare``), the audit process also runs without a network (see
:func:`tcaudit.model.sandbox.isolation_level`).
"""

from __future__ import annotations

import os
import sys

_PROCESS_EVENTS = frozenset({
    "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.startfile", "pty.spawn",
})
_NETWORK_EVENTS = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "urllib.Request", "ftplib.connect", "smtplib.connect",
})
# Events whose first argument is a path the operation changes.
_PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.mkdir", "os.utime",
    "shutil.rmtree", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
})
# Both paths change (copies write through ``open``, which is checked on its own).
_TWO_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.symlink"})
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_WATCHED = (
    _PROCESS_EVENTS | _NETWORK_EVENTS | _PATH_EVENTS | _TWO_PATH_EVENTS | _SIGNAL_EVENTS | {"open"}
)


class SandboxRefusal(PermissionError):
    """An operation the model's code may not do while tcaudit builds it."""


class Guard:
    def __init__(self, private_dir: str) -> None:
        self.private_dir = os.path.realpath(private_dir)
        self.refused: list[str] = []
        self.active = False

    def _private(self, path: object) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor: whoever opened it was checked then
        try:
            real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return real == os.devnull or real == self.private_dir or real.startswith(self.private_dir + os.sep)

    def _refuse(self, what: str) -> None:
        if len(self.refused) < 20:
            self.refused.append(what)
        raise SandboxRefusal(f"tcaudit's model sandbox refused {what}")

    def __call__(self, event: str, args: tuple) -> None:
        if event not in _WATCHED or not self.active:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and path is not None and not self._private(path):
                self._refuse(f"writing {os.fsdecode(path)}")  # type: ignore[arg-type]
        elif event in _PROCESS_EVENTS:
            detail = args[0] if event == "os.system" else (args[1] if event == "subprocess.Popen" and len(args) > 1 else "")
            self._refuse(f"starting a process ({event}{f': {_short(detail)}' if detail else ''})")
        elif event in _NETWORK_EVENTS:
            if event == "socket.getaddrinfo" and len(args) > 1:
                target = f"{_short(args[0])}:{args[1]}"
            else:
                target = args[1] if len(args) > 1 and event.startswith("socket.") else (args[0] if args else "")
            self._refuse(f"network access ({event} {_short(target)})")
        elif event in _SIGNAL_EVENTS:
            pid = args[0] if args else None
            if pid not in (os.getpid(), 0):
                self._refuse(f"sending a signal to process {pid} ({event})")
        elif event in _PATH_EVENTS:
            if event == "os.mkdir" and args and _is_dir(args[0]):
                return  # ``os.makedirs(..., exist_ok=True)`` of a folder that exists changes nothing
            if args and not self._private(args[0]):
                self._refuse(f"changing {os.fsdecode(args[0])} ({event})")
        elif event in _TWO_PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not self._private(path):
                    self._refuse(f"changing {os.fsdecode(path)} ({event})")


def _is_dir(path: object) -> bool:
    try:
        return os.path.isdir(path)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _short(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def install(private_dir: str) -> Guard:
    """Install the hook for the rest of this process's life (audit hooks cannot be removed)."""
    guard = Guard(private_dir)
    sys.dont_write_bytecode = True  # imports of the user's modules must not write __pycache__
    import tempfile

    tempfile.tempdir = guard.private_dir  # what torch or the user put in "temp" stays private
    os.environ["TMPDIR"] = guard.private_dir
    sys.addaudithook(guard)
    guard.active = True
    return guard


def describe(guard: Guard, level: str) -> str:
    refused = "; ".join(dict.fromkeys(guard.refused))
    return (
        f"the model's code tried to do what a model build must not, and tcaudit's sandbox ({level}) "
        f"refused it: {refused}"
    )
