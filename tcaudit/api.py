"""tcaudit's Python API, for tools that embed it (editors, notebook front ends, CI bots).

    >>> from tcaudit import api
    >>> findings = api.scan("train.py", select=["TC2"], precision="bf16")
    >>> result = api.fix(open("train.py").read(), filename="train.py")
    >>> result.text, result.applied, result.declined

Stability: the names in ``__all__``, the parameters documented here and the fields of
:class:`~tcaudit.findings.Finding`, :class:`~tcaudit.findings.Location` and :class:`FixResult` are
public and keep their meaning across 0.x releases; a change that breaks them is announced a minor
release ahead with a ``DeprecationWarning``. Everything else in the package is internal, and so is
any attribute whose name starts with an underscore. Rule ids are stable (SPEC.md).

Settings are the config file's keys in snake case (``select``, ``extend_select``, ``ignore``,
``per_file_ignores``, ``precision``, ``gpu``, ``exec_models``, ``structural_fixes``, ``pad_dims``,
...): they are layered on top of the nearest ``pyproject.toml`` / ``tcaudit.toml`` as the command
line's flags are (``isolated=True`` reads no config file). ``tcaudit server`` and the command line
call these functions themselves.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence, Union

from tcaudit.config import API_ARGUMENTS, KNOWN_KEYS, ConfigError, Settings, load_settings
from tcaudit.findings import Finding, FixClass, Location, Severity, TextEdit, parse_classes
from tcaudit.source.incremental import IncrementalState

if TYPE_CHECKING:
    from tcaudit.engine import ScanResult
    from tcaudit.model_profile import AuditedModels

__all__ = [
    "Finding",
    "Findings",
    "FixClass",
    "FixResult",
    "IncrementalState",
    "Location",
    "Settings",
    "Severity",
    "TcauditError",
    "TextEdit",
    "fix",
    "load",
    "scan",
]

PathArg = Union[str, "os.PathLike[str]"]
# The name a text is reported under when the caller gives none.
TEXT_NAME = "<text>.py"


class TcauditError(Exception):
    """A problem with what the caller asked for: a path that does not exist, an unknown setting, an
    invalid config file. The message is one line, as the command line prints it."""


def load(paths: Iterable[PathArg] = (), *, config: PathArg | None = None, isolated: bool = False,
         **options: Any) -> Settings:
    """The settings a scan of ``paths`` runs with: the nearest config file upward from the first
    path (or ``config``), then ``options`` on top (config keys in snake case), and ``gpu = "auto"``
    made concrete from the GPU of this machine where nvidia-smi finds one."""
    overrides: dict[str, Any] = {}
    for key, value in options.items():
        name = key.replace("_", "-")
        if name not in KNOWN_KEYS:
            raise TcauditError(f"unknown setting {key!r} (the config keys, in snake case: "
                               f"{', '.join(sorted(k.replace('-', '_') for k in KNOWN_KEYS))})")
        overrides[name] = list(value) if isinstance(value, tuple) else value
    try:
        settings = load_settings([os.fspath(p) for p in paths], os.fspath(config) if config else None,
                                 overrides, isolated, overrides_from=API_ARGUMENTS)
    except ConfigError as exc:
        raise TcauditError(str(exc)) from None
    return with_detected_gpu(settings)


def with_detected_gpu(settings: Settings) -> Settings:
    """``gpu = "auto"`` made concrete: the GPU nvidia-smi (or an already imported torch) reports, so
    messages quote that GPU's figures and the fixes fit its features; left ``auto`` when none is found."""
    if settings.gpu != "auto":
        return settings
    from tcaudit import gpus

    found = gpus.detected()
    if found is None:
        return settings
    return dataclasses.replace(settings, gpu=found.setting, detected_gpu=found)


class Findings(list):
    """The findings of a scan, in line order (a ``list[Finding]``), with what else the scan said:
    ``notes`` (what it could not audit, the target GPU), ``errors`` (internal errors: a bug in
    tcaudit, one line each and a traceback) and ``result``, the whole scan result the reporters read."""

    def __init__(self, result: "ScanResult") -> None:
        super().__init__(result.findings)
        self.result = result
        self.notes: list[str] = list(result.notes)
        self.errors: list[str] = list(result.errors)

    @classmethod
    def empty(cls) -> "Findings":
        from tcaudit.engine import ScanResult

        return cls(ScanResult(findings=[], files_scanned=0, files_parsed=0))


def _is_text(value: Any) -> bool:
    """Whether ``scan``'s first argument is source text rather than a path: bytes are text; a ``str``
    is text when it has more than one line, a path otherwise (a mistyped path is an error, never a
    clean one-line "script")."""
    return isinstance(value, (bytes, bytearray)) or (isinstance(value, str) and "\n" in value)


def _settings(settings: Settings | None, paths: Sequence[PathArg], config, isolated, edits, options) -> Settings:
    if settings is not None and (options or config or isolated):
        raise TcauditError("pass either settings= or config=/isolated=/setting keywords, not both")
    chosen = settings if settings is not None else load(paths, config=config, isolated=isolated, **options)
    return dataclasses.replace(chosen, fix_edits=edits) if edits is not None else chosen


def scan(
    paths_or_text: "PathArg | bytes | Iterable[PathArg] | None" = None,
    *,
    text: "str | bytes | None" = None,
    filename: PathArg | None = None,
    settings: Settings | None = None,
    config: PathArg | None = None,
    isolated: bool = False,
    model_audit: bool = True,
    cache: bool = False,
    jobs: int = 1,
    edits: "bool | str | tuple[int, int] | None" = "lazy",
    models: "AuditedModels | None" = None,
    model_findings: Sequence[Finding] = (),
    incremental: "IncrementalState | None" = None,
    **options: Any,
) -> Findings:
    """Scan files or a text; the findings as ``tcaudit scan`` reports them (filtered by the config's
    per-file-ignores and the text's suppression comments), in line order.

    ``paths_or_text``: a path, a list of paths (files and folders, as on the command line), or
    source text (``bytes``, or a ``str`` of more than one line; a one-line ``str`` is a path, so pass
    a one-line text as ``text=``). ``filename``: the name a text is
    reported under and configured by (per-file-ignores, the config file found from it).

    Files get the model audit where the settings allow it (``exec_models``, the default, builds the
    models the scripts define in a sandbox; ``model_audit=False`` skips it). A text gets the script
    rules only; ``models`` and ``model_findings`` (from an earlier scan of the file on disk: see
    ``Findings.result``) let the rules decide with what the audit measured and merge its findings.
    ``cache``: answer unchanged files from the result cache ``tcaudit scan`` keeps. ``edits``: each
    available fix's text edits (``Finding.fix.edits``, what ``tcaudit fix`` would change for that finding
    alone). ``"lazy"`` (the default): made the first time ``finding.fix.edits`` is read, for that finding
    alone, on the smallest part of the module that holds it, so a scan costs what it costs without edits
    and each edit read costs one fix (until then the findings keep the file's analysis alive: pass
    ``edits=False`` for a large project whose edits you will not read); ``True``: made during the scan,
    every one; ``False``: none (``edits`` is None); for a text, ``(first, last)`` makes those of the
    findings on those lines during the scan (an editor's code action).
    ``settings``: settings from :func:`load`, instead of ``config``/``isolated``/keywords.
    ``incremental``: for a text scanned again and again as it is edited (an editor's buffer), one
    :class:`IncrementalState` per document, passed to each scan of it: only the top-level statements
    that changed since the last scan are parsed, and what the analysis found out about the others is
    reused; where the edit is one no rule can notice (a comment, spacing, a new local variable bound to
    numbers) and no other file the last scan read changed, its findings are moved to their new lines
    without analysing (``state.reused`` says so). The findings are the same as without it.
    Raises :class:`TcauditError` for a path that does not exist or an invalid setting."""
    from tcaudit import engine

    if text is not None and paths_or_text is not None:
        raise TcauditError("pass the text either as the first argument or as text=, not both")
    if text is None and paths_or_text is not None and _is_text(paths_or_text):
        text = paths_or_text  # type: ignore[assignment]
    edit_lines = tuple(edits) if isinstance(edits, (tuple, list)) else None
    if edit_lines is not None:
        edits = True
    elif edits not in (True, False, None, "lazy"):
        raise TcauditError(f"edits={edits!r}: expected True, False, \"lazy\" or (first line, last line)")
    if text is not None:
        display = os.fspath(filename) if filename is not None else TEXT_NAME
        chosen = _settings(settings, [display] if filename is not None else [], config, isolated, edits, options)
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        result = engine.scan_text(raw, display, chosen, path=Path(display), models=models,
                                  model_findings=model_findings, rules=_rules(chosen), edit_lines=edit_lines,
                                  incremental=incremental)
        return Findings(result)
    if paths_or_text is None:
        raise TcauditError("nothing to scan: pass paths or text")
    paths = [paths_or_text] if isinstance(paths_or_text, (str, os.PathLike)) else list(paths_or_text)
    names = [os.fspath(p) for p in paths]
    chosen = _settings(settings, names, config, isolated, edits, options)
    scan_cache = None
    if cache:
        from tcaudit.cache import open_cache

        scan_cache = open_cache(chosen)
    result = engine.scan(names, chosen, model_audit=model_audit, jobs=jobs, cache=scan_cache)
    if result.missing:
        raise TcauditError(f"no such file or directory: {', '.join(result.missing)}")
    return Findings(result)


_RULES = threading.local()


def _rules(settings: Settings) -> list:
    """The script rules for ``settings``, made once per settings and thread: an editor scans at every
    keystroke, and scans its documents side by side (a rule object is used by one scan at a time)."""
    from tcaudit.rules.registry import lazy_rules

    made: dict[Settings, list] = _RULES.__dict__.setdefault("by_settings", {})
    try:
        rules = made.get(settings)
    except TypeError:  # settings holding something unhashable: not kept
        return lazy_rules(settings)
    if rules is None:
        if len(made) > 8:
            made.clear()
        rules = made[settings] = lazy_rules(settings)
    return rules


@dataclass
class Declined:
    """A finding whose fix was not made, and why. ``where``: its line as the file shows it (``12``;
    in a notebook ``cell 3:12``); ``finding``'s own location counts lines of the whole text."""

    finding: Finding
    reason: str
    where: str = ""
    # Its line in the text given to :func:`fix` (as ``scan`` reports it): ``12``, ``cell 3:12``.
    where_original: str = ""


@dataclass
class FixResult:
    """What :func:`fix` made of a text."""

    text: str  # the fixed text: the input where nothing was fixed, or it could not be fixed
    original: str
    applied: list[str] = field(default_factory=list)  # the rule ids whose fixes changed the text
    declined: list[Declined] = field(default_factory=list)
    remaining: list[Finding] = field(default_factory=list)  # the fixed text's findings (unfiltered)
    error: str | None = None  # why nothing was fixed (the text does not parse, an internal error)
    notice: str | None = None  # why the fixes made were undone (a notebook's fix that spans cells)
    filename: str = TEXT_NAME
    data: bytes = b""  # the fixed text encoded as the input was (its coding line, its BOM)

    @property
    def changed(self) -> bool:
        return self.error is None and self.text != self.original

    def diff(self) -> str:
        """A unified diff of the change (empty where nothing changed), as ``tcaudit fix`` prints it."""
        import difflib

        name = self.filename
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.text.splitlines(keepends=True),
            fromfile=name if name.startswith("/") else f"a/{name}",
            tofile=name if name.startswith("/") else f"b/{name}",
        ))


def parse_fix_classes(classes: "str | Iterable[str | FixClass]") -> frozenset[FixClass]:
    """``"safe,numerics"``, ``["safe"]`` or FixClass members as the set of fix classes."""
    text = classes if isinstance(classes, str) else ",".join(str(c.value if isinstance(c, FixClass) else c)
                                                             for c in classes)
    try:
        return parse_classes(text)
    except ValueError as exc:
        raise TcauditError(str(exc)) from None


def fix(
    text: "str | bytes",
    *,
    filename: PathArg | None = None,
    classes: "str | Iterable[str | FixClass]" = ("safe", "numerics"),
    settings: Settings | None = None,
    config: PathArg | None = None,
    isolated: bool = False,
    models: "AuditedModels | None" = None,
    **options: Any,
) -> FixResult:
    """``tcaudit fix`` on a text: the fixes of ``classes`` (``"safe"``, ``"numerics"``) made, the
    opt-in ones where the settings ask (``structural_fixes=["compile"]``, ``pad_dims=True``).
    ``filename``: the name the text goes by (config discovery, per-file-ignores, messages).
    ``models``: what the model audit measured about the models the text builds, where known.
    Never raises for a text it cannot handle: ``FixResult.error`` says why and ``text`` is the input."""
    from tcaudit.fix.engine import fix_bytes
    from tcaudit.source.deep import call_with_deep_stack

    display = os.fspath(filename) if filename is not None else TEXT_NAME
    chosen = _settings(settings, [display] if filename is not None else [], config, isolated, None, options)
    chosen = dataclasses.replace(chosen, exec_models=False)
    fix_classes = parse_fix_classes(classes)
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    try:
        made = call_with_deep_stack(fix_bytes, raw, display, chosen, fix_classes, path=Path(display), models=models)
    except (RecursionError, MemoryError) as exc:
        original = raw.decode("utf-8", "replace")
        return FixResult(original, original, error=f"not fixed: cannot analyse ({type(exc).__name__}); left unchanged",
                         filename=display, data=raw)
    if made.error:
        original = made.original or raw.decode("utf-8", "replace")
        return FixResult(original, original, error=made.error, filename=display, data=raw)
    data = made.source.encode(made.fixed) if made.changed and made.source is not None else raw
    return FixResult(
        text=made.fixed,
        original=made.original,
        applied=list(made.applied),
        declined=[Declined(finding, made.in_cells(reason), made.place(finding.location.line, True),
                           made.place(made.original_line(finding.location.line), False))
                  for finding, reason in made.declined],
        notice=made.notice,
        remaining=list(made.remaining),
        filename=display,
        data=data,
    )
