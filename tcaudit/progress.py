"""Progress for a person at a terminal: files scanned, models audited, the file being fixed, verify's
rounds and steps. A rich progress display on stderr, cleared when done (transient).

Shown only where someone watches: stderr is a terminal, the output format is one a person reads
(``text``, ``concise``), ``CI`` is not set (CI logs are not terminals, and some CI runners fake one)
and the terminal is not dumb. Everywhere else :func:`current` is a reporter that does nothing, and
rich is not even imported for it.

The commands open the display (:func:`showing`); the layers below only report to :func:`current`,
so the engine and the model audit know nothing about terminals.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext
from typing import IO, Any, Iterator, Mapping

# The formats a person reads; JSON, SARIF, JUnit and GitHub annotations are for programs and logs.
HUMAN_FORMATS = ("text", "concise")


def wanted(fmt: str | None, stream: IO[str] | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to show progress for output format ``fmt`` (None: a command without formats) on
    ``stream`` (default stderr)."""
    if fmt is not None and fmt not in HUMAN_FORMATS:
        return False
    env = os.environ if environ is None else environ
    if env.get("CI") or env.get("TERM") == "dumb":
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Stage:
    """One line of progress (``scanning 12/40 files``); this one does nothing. A context manager
    that ends the line on exit; a line not ended goes when the display does."""

    def advance(self, amount: int = 1) -> None:
        pass

    def show(self, detail: str) -> None:
        """Say what is being worked on now (a file, a model)."""

    def done(self) -> None:
        pass

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc_info) -> None:
        self.done()


class Progress:
    """Reports nothing: where no one watches."""

    console = None  # the console the display draws on; None when there is no display
    rich = None  # the rich.progress.Progress, for code that drives tasks itself (verify's runner)

    def stage(self, description: str, total: int | None, unit: str = "") -> Stage:
        return _NO_STAGE

    def paused(self) -> "Any":
        """Around writes to stdout, which the display would otherwise draw over."""
        return nullcontext()


_NO_STAGE = Stage()
_NO_PROGRESS = Progress()
_current: Progress = _NO_PROGRESS


def current() -> Progress:
    return _current


class _RichStage(Stage):
    def __init__(self, progress, task) -> None:
        self._progress, self._task = progress, task

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task, amount)

    def show(self, detail: str) -> None:
        from tcaudit.terminal import terminal_safe

        self._progress.update(self._task, detail=terminal_safe(detail, one_line=True))  # a file's name: no escapes

    def done(self) -> None:
        if self._task is not None:
            self._progress.refresh()  # the stage's last count is drawn once before it goes
            self._progress.remove_task(self._task)
            self._task = None


class RichProgress(Progress):
    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Display

        self.console = console
        self.rich = Display(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            console=console,
            transient=True,
            # stdout is the report's: what the program writes there must not land on stderr.
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def stage(self, description: str, total: int | None, unit: str = "") -> Stage:
        task = self.rich.add_task(description, total=total, unit=unit, detail="")
        self.rich.refresh()
        return _RichStage(self.rich, task)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.rich.stop()
        try:
            yield
        finally:
            self.rich.start()


@contextmanager
def showing(fmt: str | None, *, console=None) -> Iterator[Progress]:
    """Progress shown for the duration where :func:`wanted` says so, or always on ``console`` (a rich
    Console; tests pass one with ``force_terminal=True``). Yields the reporter :func:`current` returns."""
    global _current
    if console is None:
        if not wanted(fmt):
            yield _current
            return
        from rich.console import Console

        console = Console(file=sys.stderr, highlight=False, soft_wrap=True, emoji=False)
    reporter = RichProgress(console)
    previous, _current = _current, reporter
    reporter.rich.start()
    try:
        yield reporter
    finally:
        reporter.rich.stop()
        _current = previous
