"""The audit child's second layer: a PEP 578 audit hook that refuses side effects of the user's code.

Building a model runs the user's constructor. In the process that builds it, this hook refuses
process creation (``os.system``, ``subprocess``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``, the
``_posixsubprocess`` call behind ``multiprocessing``'s spawn), network use (``socket.connect``,
``bind``, ``sendto``, name lookups), signals to other processes, writing, deleting, renaming or
changing files outside the audit's private temporary folder (``dir_fd``-relative calls included),
``sqlite3`` databases outside it, and the garbage collector's views of all objects (through which
code could find and change the hook's state). A refused operation raises :class:`SandboxRefusal`
(a ``PermissionError``) in the user's code, and is written at once to a pipe the audit's parent
reads: the parent, not the model's process, decides that the model is not audited (TC100), so code
that catches the refusal, or replaces ``json.dump`` to report success, is still reported.

The hook keeps no state the model's code can reach: it is a closure over immutable values and the
functions it needs (no attribute to flip, no list to empty), and the objects that would lead to it
(``gc.get_objects``, ``gc.get_referrers``, ``gc.get_referents``) are refused. It remains a second
layer: native code (ctypes, a C extension) raises no audit event, and code that rewrites the
standard library can mislead it. What holds against those is the first layer, the namespaces and
the read-only file system of :mod:`tcaudit.model.jail`, where the platform allows them.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

_PROCESS_EVENTS = frozenset({
    "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.startfile", "pty.spawn",
})
_NETWORK_EVENTS = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "urllib.Request", "ftplib.connect", "smtplib.connect",
})
# Events whose first argument is a path the operation changes, and the position of their dir_fd.
_PATH_EVENTS = {
    "os.remove": 1, "os.rmdir": 1, "os.truncate": None, "os.chmod": 2, "os.chown": 3, "os.mkdir": 2,
    "os.utime": 4, "shutil.rmtree": 1, "os.chflags": None, "os.lchflags": None, "os.setxattr": None,
    "os.removexattr": None,
}
# Both paths change (copies write through ``open``, which is checked on its own), with their dir_fds.
_TWO_PATH_EVENTS = {"os.rename": (2, 3), "os.link": (2, 3), "os.symlink": (None, 2)}
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg"})
# The collector's views of every object: the way to the hook's closure and to the worker's frames.
_INTROSPECTION_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_WATCHED = frozenset(
    _PROCESS_EVENTS | _NETWORK_EVENTS | set(_PATH_EVENTS) | set(_TWO_PATH_EVENTS) | _SIGNAL_EVENTS
    | _INTROSPECTION_EVENTS | {"open", "sqlite3.connect", "object.__setattr__", "import", "tcaudit.refused"}
)
# Raised by the stand-ins this module puts where an operation has no audit event of its own.
_REFUSED_EVENT = "tcaudit.refused"
MAX_REFUSALS = 20
# The exit code of a model's process whose report channel was closed or replaced under the hook.
REPORT_LOST = 70


class SandboxRefusal(PermissionError):
    """An operation the model's code may not do while tcaudit builds it."""


def make_hook(private_dir: str, report_fd: int | None = None,
              readable: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None = None
              ) -> Callable[[str, tuple], None]:
    """The audit hook for a process whose one writable place is ``private_dir``. Each refusal is
    written as a line to ``report_fd`` (the parent's pipe) before it is raised; a process whose
    channel is gone ends at once (exit :data:`REPORT_LOST`). ``readable``: (visible, hidden, blanked)
    of the file system view's plan; opening a hidden or blanked file for reading is refused too."""
    visible, hidden, blanked = readable or ((), (), ())
    check_reads = readable is not None
    private = os.path.realpath(private_dir)
    prefix = private + os.sep
    realpath, fsdecode, isabs, join, isdir = os.path.realpath, os.fsdecode, os.path.isabs, os.path.join, os.path.isdir
    write, exit_now, getpid, readlink = os.write, os._exit, os.getpid, os.readlink
    watched, process_events, network_events = _WATCHED, _PROCESS_EVENTS, _NETWORK_EVENTS
    path_events, two_path_events, signal_events = dict(_PATH_EVENTS), dict(_TWO_PATH_EVENTS), _SIGNAL_EVENTS
    introspection, write_flags, devnull, refusal = _INTROSPECTION_EVENTS, _WRITE_FLAGS, os.devnull, SandboxRefusal
    refused_event, short, is_dir = _REFUSED_EVENT, _short, _is_dir
    count = [0]  # how many refusals were written (never read back by anyone but this hook)

    def resolve(path: object, dir_fd: object = None) -> str | None:
        try:
            text = fsdecode(path)  # type: ignore[arg-type]
            if not isabs(text) and isinstance(dir_fd, int) and dir_fd >= 0:
                text = join(readlink(f"/proc/self/fd/{dir_fd}"), text)
            return realpath(text)
        except (TypeError, ValueError, OSError):
            return None

    def is_private(path: object, dir_fd: object = None, relative_ok: bool = True) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor: whoever opened it was checked then
        if not relative_ok and not isabs(fsdecode(path)):  # type: ignore[arg-type]
            return False  # ``open`` does not say which dir_fd a relative path is relative to
        real = resolve(path, dir_fd)
        return real is not None and (real == devnull or real == private or real.startswith(prefix))

    def under(path: str, folders: tuple[str, ...]) -> bool:
        for folder in folders:
            if path == folder or folder == "/" or path.startswith(folder + "/"):
                return True
        return False

    def may_read(path: object) -> bool:
        if isinstance(path, int) or is_private(path):
            return True
        real = resolve(path)
        if real is None:
            return True  # nothing is opened
        if under(real, blanked):
            return False
        return under(real, visible) or not under(real, hidden)

    def refuse(what: str) -> None:
        if count[0] < MAX_REFUSALS:
            count[0] += 1
            if report_fd is not None:
                try:
                    write(report_fd, (what[:300].replace("\n", " ") + "\n").encode("utf-8", "replace"))
                except OSError:
                    exit_now(REPORT_LOST)
        raise refusal(f"tcaudit's model sandbox refused {what}")

    def hook(event: str, args: tuple) -> None:
        if event not in watched:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writes and path is not None and not is_private(path, relative_ok=False):
                refuse(f"writing {short(path)}")
            elif check_reads and not writes and path is not None and not may_read(path):
                refuse(f"reading {short(path)}, which the sandbox's view hides")
        elif event == refused_event:
            refuse(str(args[0]) if args else "an operation")
        elif event == "import":
            if args and args[0] == "_posixsubprocess":
                refuse("importing _posixsubprocess again (the way back to an unguarded fork_exec)")
        elif event == "object.__setattr__":
            if args and (args[0] is hook or args[0] is refusal):
                refuse("changing the sandbox's audit hook")
        elif event in introspection:
            refuse(f"reading the interpreter's objects ({event})")
        elif event == "sqlite3.connect":
            database = args[0] if args else None
            if database not in (":memory:", b":memory:", "", None) and not is_private(database):
                refuse(f"writing the database {short(database)} (sqlite3.connect)")
        elif event in process_events:
            detail = args[0] if event == "os.system" else (args[1] if event == "subprocess.Popen" and len(args) > 1 else "")
            refuse(f"starting a process ({event}{f': {short(detail)}' if detail else ''})")
        elif event in network_events:
            if event == "socket.getaddrinfo" and len(args) > 1:
                target = f"{short(args[0])}:{args[1]}"
            else:
                target = args[1] if len(args) > 1 and event.startswith("socket.") else (args[0] if args else "")
            refuse(f"network access ({event} {short(target)})")
        elif event in signal_events:
            pid = args[0] if args else None
            if pid not in (getpid(), 0):
                refuse(f"sending a signal to process {pid} ({event})")
        elif event in path_events:
            position = path_events[event]
            dir_fd = args[position] if position is not None and len(args) > position else None
            if event == "os.mkdir" and args and dir_fd in (None, -1) and is_dir(args[0], isdir):
                return  # ``os.makedirs(..., exist_ok=True)`` of a folder that exists changes nothing
            if args and not is_private(args[0], dir_fd):
                refuse(f"changing {short(args[0])} ({event})")
        elif event in two_path_events:
            for path, position in zip(args[:2], two_path_events[event]):
                dir_fd = args[position] if position is not None and len(args) > position else None
                if isinstance(path, (str, bytes, os.PathLike)) and not is_private(path, dir_fd):
                    refuse(f"changing {short(path)} ({event})")

    return hook


def _is_dir(path: object, isdir: Callable[[object], bool]) -> bool:
    try:
        return isdir(path)
    except (TypeError, ValueError):
        return False


def _short(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def install(private_dir: str, report_fd: int | None = None, readable: str | None = None) -> None:
    """Install the hook for the rest of this process's life (audit hooks cannot be removed). Nothing
    is returned: no reference to the hook stays in the caller's frame for the model's code to find.
    ``readable``: the view's plan as JSON (:class:`tcaudit.model.jail.Plan`), whose hidden places are
    not opened for reading."""
    places = None
    if readable:
        import json

        plan = json.loads(readable)
        places = tuple(tuple(str(p).rstrip("/") or "/" for p in plan[key]) for key in ("visible", "hidden", "blanked"))
    hook = make_hook(private_dir, report_fd, places)  # type: ignore[arg-type]
    sys.dont_write_bytecode = True  # imports of the user's modules must not write __pycache__
    import tempfile

    tempfile.tempdir = os.path.realpath(private_dir)  # what torch or the user put in "temp" stays private
    os.environ["TMPDIR"] = tempfile.tempdir
    try:
        import _posixsubprocess  # behind subprocess (audited) and multiprocessing's spawn (not audited)

        # A stand-in made of builtins only (no closure leading back to the hook): it raises the
        # event the hook refuses.
        _posixsubprocess.fork_exec = functools.partial(
            sys.audit, _REFUSED_EVENT, "starting a process (_posixsubprocess.fork_exec: multiprocessing's spawn)")
    except ImportError:  # pragma: no cover - not POSIX
        pass
    sys.addaudithook(hook)


def describe(refused: list[str], level: str) -> str:
    return (
        f"the model's code tried to do what a model build must not, and tcaudit's sandbox ({level}) "
        f"refused it: {'; '.join(dict.fromkeys(refused))}"
    )
