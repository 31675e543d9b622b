"""Run the analysis of a file on a stack deep enough for anything Python itself accepts.

Python parses brackets nested up to 200 levels; LibCST's trees of such code are walked by
recursive visitors that need many frames per level, more than the default recursion limit (1000)
and, in native code, more than a main thread's 8 MiB stack. A worker thread with a large stack
and a raised recursion limit analyses those files like any other; what still overflows raises
RecursionError, which callers report for that file alone.
"""

from __future__ import annotations

import contextvars
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

DEEP_STACK_BYTES = 512 * 1024**2  # address space only: pages are touched as the recursion needs them
DEEP_RECURSION_LIMIT = 60_000

_LOCK = threading.Lock()
_STATE = threading.local()
# Deep calls running now (several threads may each run one: the editor server scans its documents side
# by side), and the recursion limit to restore when the last one ends.
_ACTIVE = [0, 0]


def call_with_deep_stack(function: Callable[..., T], *args, **kwargs) -> T:
    """``function(*args, **kwargs)``, run in a thread with a large stack; its exceptions re-raised here.
    The lock covers only starting the thread (the stack size is a process-wide setting), never the call,
    so a long analysis on one thread does not hold up another thread's. The call sees the caller's
    context variables."""
    outcome: dict[str, object] = {}
    context = contextvars.copy_context()  # the caller's context variables (an analysis's walk memo)

    def target() -> None:
        _STATE.deep = True
        try:
            outcome["value"] = context.run(function, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    if getattr(_STATE, "deep", False):  # already on a deep stack (a scan that audits its models)
        return function(*args, **kwargs)
    with _LOCK:  # stack size and recursion limit are process-wide settings
        if _ACTIVE[0] == 0:
            _ACTIVE[1] = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_ACTIVE[1], DEEP_RECURSION_LIMIT))
        _ACTIVE[0] += 1
        previous_stack = threading.stack_size()
        try:
            threading.stack_size(DEEP_STACK_BYTES)
            thread = threading.Thread(target=target, name="tcaudit-deep-stack", daemon=True)
            thread.start()
        except (ValueError, RuntimeError, MemoryError):  # no big thread stacks here: the plain call
            thread = None
            _leave()
        finally:
            threading.stack_size(previous_stack)
    if thread is None:
        return function(*args, **kwargs)
    try:
        thread.join()
    finally:
        with _LOCK:
            _leave()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _leave() -> None:
    """One deep call ended (under ``_LOCK``): the last one puts the recursion limit back."""
    _ACTIVE[0] -= 1
    if _ACTIVE[0] == 0:
        sys.setrecursionlimit(_ACTIVE[1])
