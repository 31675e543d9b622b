"""Discover files → read and parse each once → run the enabled rules → filter the findings.

Data flows one way: paths → engine → findings → report. ``fix`` and ``verify`` reuse ``scan``.

Speed (BENCHMARKS.md, "Scan speed"): a file is parsed with LibCST only when the text trigger of an
enabled rule occurs in it; files are spread over worker processes (``jobs``), and a cache
(:mod:`tcaudit.cache`) answers for files whose content, path, settings and rules are unchanged.
Whatever the path a file takes (in-process, a worker, the cache), its findings are the same; the
filters (per-file-ignores, suppression comments) always run here, on the current text.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import signal
import sys
import traceback
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tcaudit import progress
from tcaudit.catalog import load_catalog, matches_selector
from tcaudit.config import Settings
from tcaudit.findings import Finding, Location, PendingEdits, Severity, assign_fingerprints, mirrored_at
from tcaudit.source.deep import call_with_deep_stack
from tcaudit.source.discovery import discover, display_path
from tcaudit.source.inert import recording_reads
from tcaudit.source.parsing import (
    SourceError,
    SourceFile,
    beyond_analysis,
    decode_source,
    python_syntax_error,
    read_file_bytes,
    read_source,
)
from tcaudit.source.suppressions import Directives, directives
from tcaudit.source.triggers import Trigger, answering_literals, trigger
from tcaudit.unused_suppressions import RULE as UNUSED_SUPPRESSION
from tcaudit.unused_suppressions import Usage, rules_that_ran, unused_suppressions

if TYPE_CHECKING:  # LibCST and the rules load on the first file that needs them, not for a cached scan
    from typing import Callable, Sequence

    from tcaudit.cache import ScanCache
    from tcaudit.model import ModelAuditResult
    from tcaudit.model.facts import ModelFacts
    from tcaudit.model_profile import AuditedModels
    from tcaudit.rules.base import ModelRule, ScriptRule
    from tcaudit.rules.registry import LazyRule
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.incremental import IncrementalState

# LibCST builds a tree of many small objects for each file, and Python's cyclic collector, at its
# default threshold (700 new containers), walks the young ones again and again meanwhile: a tenth
# of a scan's time on torchvision (BENCHMARKS.md, "Scan speed"). The trees are freed by reference
# counting, so collecting less often costs no memory to speak of (mypy raises it for the same reason).
GC_THRESHOLD = 50_000

# Below this many files to analyse, a scan runs in-process: starting workers would cost more than
# spreading the files saves.
PARALLEL_MIN_FILES = 16
# None: ``fork`` where it exists on Linux (cheap: the workers inherit what the parent imported), the
# platform's default elsewhere. Tests set "spawn" to check the other road.
START_METHOD: str | None = None

@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    source: SourceFile | None = None
    parsed: bool = False
    errors: list[str] = field(default_factory=list)
    # Set when reading the text again (for suppressions, the model audit) failed: do not retry.
    source_unreadable: bool = False


@dataclass
class ScanResult:
    findings: list[Finding]
    files_scanned: int
    files_parsed: int
    missing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suppressed: int = 0
    # Files whose script-rule findings came from the cache (their ``files_parsed`` share too).
    files_cached: int = 0
    # The target GPU as the command line resolved it (``{"setting", "name", "sm", "detected"}``);
    # None when the caller did not say.
    gpu: dict | None = None
    # The order the human formats list ``findings`` in (tcaudit/report/order.py): "impact" or "line";
    # ``findings`` itself is always in line order.
    sort: str = "impact"
    # ``scan --show-fixes``: the text report shows each finding's explanation (``Finding.explanation``).
    show_fixes: bool = False
    # The bytes of scanned files that are not on disk under their display path (a script read from
    # stdin), for the reporters' code frames.
    texts: dict[str, bytes] = field(default_factory=dict)
    # How many findings ``--baseline`` left out (the text report's summary says so).
    baselined: int = 0
    # ``scan -q``: the text report shows the findings only (no notes, no summary line), as ruff's --quiet.
    quiet: bool = False

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)


def tc000(path: str, error: SourceError) -> Finding:
    spec = load_catalog()["TC000"]
    return Finding(
        rule="TC000",
        name=spec.name,
        severity=spec.severity,
        location=Location(path, error.line, error.column, error.line, error.column),
        message=error.message,
    )


def instantiate_rules(settings: Settings) -> list["ScriptRule"]:
    from tcaudit.rules.registry import discover_script_rules

    enabled = set(settings.enabled_rules())
    rules = [cls() for rule_id, cls in sorted(discover_script_rules().items()) if rule_id in enabled]
    for rule in rules:
        rule.configure(settings)
    return rules


def candidate_rules(rules: "Sequence[ScriptRule | LazyRule]", text: str, path: Path | None = None,
                    root: "Path | None" = None) -> list["ScriptRule"]:
    """The rules whose triggers occur in ``text``: ``[r for r in rules if r.may_match(text)]``, with
    each distinct trigger (and each part of an ``all_of`` trigger) checked once per file, literal text
    first (tcaudit/source/triggers.py). A :class:`LazyRule` is known by its triggers until then: it is
    imported (:meth:`LazyRule.load`) only when they occur. ``path``: the file the text is, where a
    rule's ``helper_triggers`` occur instead: the rule runs when a training script of the project
    imports the file (decided once per file, only then: it walks the project)."""
    from tcaudit.rules.registry import LazyRule

    verdicts: dict[Trigger, bool] = {}  # triggers and all_of parts already decided for this text
    imported: bool | None = None
    out = []
    for rule in rules:
        if isinstance(rule, LazyRule):
            if rule.triggers is None:  # a rule that decides in its own code: loaded up front
                loaded = rule.load()
                if _own_may_match(loaded, text, verdicts):
                    out.append(loaded)
                continue
            if _triggers_occur(rule.triggers, text, verdicts):
                out.append(rule.load())
                continue
        elif _own_may_match(rule, text, verdicts):
            out.append(rule)
            continue
        if path is None or not rule.helper_triggers or not _triggers_occur(rule.helper_triggers, text, verdicts):
            continue
        if imported is None:
            from tcaudit.project.importers import imported_by_training

            imported = imported_by_training(path, root)
        if imported:
            out.append(rule.load() if isinstance(rule, LazyRule) else rule)
    return out


def _own_may_match(rule: "ScriptRule", text: str, verdicts: dict[Trigger, bool]) -> bool:
    from tcaudit.rules.base import ScriptRule

    if type(rule).may_match is not ScriptRule.may_match:  # a rule with its own test
        return rule.may_match(text)
    return _triggers_occur(rule.triggers, text, verdicts)


def _triggers_occur(triggers: tuple[str, ...], text: str, verdicts: dict[Trigger, bool]) -> bool:
    """``ScriptRule.may_match`` for these triggers, deciding each trigger (and part) once per text."""
    if not triggers:
        return True
    for pattern in triggers:
        check = trigger(pattern)
        verdict = verdicts.get(check)
        if verdict is None:
            verdict = verdicts[check] = check.search(text, verdicts)
        if verdict:
            return True
    return False


def cannot_analyse(exc: BaseException) -> SourceError:
    """The TC000 for a file whose analysis raised ``exc`` (too deep, out of memory, or a bug of
    tcaudit's, with its text): the scan goes on with the other files."""
    if isinstance(exc, RecursionError):
        return SourceError("cannot analyse: nesting too deep (RecursionError)")
    if isinstance(exc, MemoryError):
        return SourceError("cannot analyse: out of memory (MemoryError)")
    text = " ".join(str(exc).split())[:300]
    return SourceError(f"cannot analyse: internal error ({type(exc).__name__}: {text}); please report it")


def syntax_error(source: SourceFile) -> SourceError | None:
    """What stops a file's analysis before LibCST: Python's parser, or (generated-looking code) what
    CPython cannot compile or tcaudit cannot analyse in reasonable time."""
    return python_syntax_error(source.text, source.display_path) or beyond_analysis(source.text, source.display_path)


def scan_file(
    path: Path,
    rules: "Sequence[ScriptRule | LazyRule]",
    settings: Settings,
    display: str | None = None,
    check_syntax: bool = True,
    models: "AuditedModels | None" = None,
) -> FileResult:
    """Scan one file with the given script rules (``models``: what the model audit measured about the
    models it builds). Never raises: problems become TC000 or errors."""
    display = display or path.as_posix()
    try:
        source = read_source(path, display)
    except SourceError as exc:
        result = FileResult(display)
        result.findings.append(tc000(display, exc))
        return result
    return scan_source(source, rules, settings, check_syntax, models)


def scan_source(
    source: SourceFile,
    rules: "Sequence[ScriptRule | LazyRule]",
    settings: Settings,
    check_syntax: bool = True,
    models: "AuditedModels | None" = None,
    edit_lines: "tuple[int, int] | None" = None,
) -> FileResult:
    """:func:`scan_file` on a text already read (a file's, or an editor buffer's): the script rules'
    findings, unfiltered. Never raises: problems become TC000 or errors. ``edit_lines``: where the
    settings ask for the fixes' edits, only for the findings on these lines (first, last)."""
    display = source.display_path
    result = FileResult(display)
    result.source = source
    candidates = candidate_rules(rules, source.text, source.path, settings.root)
    if not candidates:
        # No rule can fire here, so LibCST is skipped; Python's own parser still catches broken files.
        if check_syntax:
            error = syntax_error(source)
            if error is not None:
                result.findings.append(tc000(display, error))
        return result
    try:
        facts, findings, errors = analyse_source(source, candidates, settings, models, edit_lines=edit_lines)
    except SourceError as exc:  # a syntax error is TC000
        result.findings.append(tc000(display, exc))
        return result
    result.parsed = True
    result.findings.extend(findings)
    result.errors.extend(errors)
    return result


def analyse_source(
    source: SourceFile,
    rules: list["ScriptRule"],
    settings: Settings,
    models: "AuditedModels | None" = None,
    *,
    edits: bool | None = None,
    facts: "ScriptFacts | None" = None,
    unplanned: frozenset[str] = frozenset(),
    edit_lines: "tuple[int, int] | None" = None,
) -> tuple["ScriptFacts | None", list[Finding], list[str]]:
    """Parse ``source`` once (a syntax error raises :class:`SourceError`), build its facts and run
    ``rules`` on them: (facts, findings, internal errors). An internal error in the facts or in one
    rule costs only that part: the other rules still report. ``edits``: give each available fix its
    text edits (tcaudit/planned_edits.py; default: ``settings.fix_edits``; ``"lazy"``: each made when
    first read); ``tcaudit fix``, which makes
    the fixes itself, never asks. ``facts``: those of ``source``, where the caller has them already.
    ``unplanned``: opt-in fixes (``Fix.option``) the caller will not make, so no rule plans them.
    ``edit_lines``: (first, last): edits only for the findings on those lines."""
    from tcaudit.project.imports import looking_up_once
    from tcaudit.source.memo import remembering

    source.module
    # One walk per question and node while the analysis runs (tcaudit/source/memo.py), one look at the disk
    # per import (tcaudit/project/imports.py).
    with remembering(), looking_up_once():
        return _analyse(source, rules, settings, models, edits, facts, unplanned, edit_lines)


def _analyse(
    source: SourceFile,
    rules: list["ScriptRule"],
    settings: Settings,
    models: "AuditedModels | None",
    edits: bool | None,
    facts: "ScriptFacts | None",
    unplanned: frozenset[str],
    edit_lines: "tuple[int, int] | None",
) -> tuple["ScriptFacts | None", list[Finding], list[str]]:
    from tcaudit.rules.base import in_rule_order
    from tcaudit.rules.registry import context as rule_context
    from tcaudit.rules.situations import block_created
    from tcaudit.script.facts import ScriptFacts

    display = source.display_path
    try:
        facts = facts if facts is not None else ScriptFacts(source)
    except Exception as exc:  # noqa: BLE001 - an internal error must not hide the other files
        return None, [], [f"{display}: internal error while analysing: {exc!r}\n{traceback.format_exc()}"]
    if not settings.plan_unasked:
        unplanned |= settings.unasked_options
    context = rule_context(settings, models, unplanned)
    findings: list[Finding] = []
    errors: list[str] = []
    # A rule runs after the rules whose outcome it reads (its ``after``), and reads theirs from here.
    for rule in in_rule_order(rules):
        try:
            found = list(rule.check(facts, context))
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{display}: internal error in {rule.id}: {exc!r}\n{traceback.format_exc()}")
            found = []
        context.record(rule.id, facts, found)
        findings.extend(found)
    # A fix that would bring about what another rule's decline protects against is declined too.
    findings = block_created(findings)
    wanted = settings.fix_edits if edits is None else edits
    if wanted:
        from tcaudit.planned_edits import with_edits

        try:
            findings = with_edits(facts, findings, rules, settings, context, edit_lines, lazy=wanted == "lazy")
        except Exception as exc:  # noqa: BLE001 - the findings stand without their edits
            errors.append(f"{display}: internal error while making the fixes' edits: {exc!r}\n{traceback.format_exc()}")
    return facts, findings, errors


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def scan(
    paths: list[str],
    settings: Settings,
    *,
    model_audit: bool = True,
    jobs: int = 1,
    cache: "ScanCache | None" = None,
    display_names: dict[str, str] | None = None,
    texts: dict[str, bytes] | None = None,
) -> ScanResult:
    """Scan ``paths``. ``jobs`` > 1 spreads the files over that many worker processes (when there
    are enough of them); ``cache`` answers for unchanged files and records the others.
    ``display_names``: the name a file named in ``paths`` is reported under (a temporary copy of a
    script read from stdin goes by ``--stdin-filename``); ``texts``: by display name, the bytes of
    files not on disk there, passed on to the reporters."""
    discovered = discover(paths, settings.exclude, settings.root, force_exclude=settings.force_exclude,
                          respect_gitignore=settings.respect_gitignore, include=settings.included)
    if discovered.missing:
        # A path that does not exist is a usage error: report it before spending time on the others.
        return ScanResult(findings=[], files_scanned=0, files_parsed=0, missing=discovered.missing)
    named = display_names or {}
    files, external = within_project(discovered.files, settings.root)
    displays = [named.get(str(path)) or display_path(path) for path in files]
    enabled = set(settings.enabled_rules())
    check_syntax = "TC000" in enabled

    # The model audit runs first where it runs at all: the script rules decide channels_last, cuDNN
    # benchmarking, compile and the precision with what it measured (tcaudit/model_profile.py).
    audit = run_audit(files, displays, settings, cache) if model_audit else None
    models_of: dict[str, "AuditedModels"] = {}
    if audit is not None:
        from tcaudit.model import audited_models

        models_of = handed_in(audited_models(audit.facts), settings)

    def models_for(path: Path) -> "AuditedModels | None":
        return models_of.get(os.path.realpath(path)) if models_of else None

    file_results: list[FileResult | None] = [None] * len(files)
    cached = 0
    with progress.current().stage("scanning", total=len(files), unit="files") as stage:
        if cache is not None:
            for index, path in enumerate(files):
                try:
                    raw = read_file_bytes(path)
                except SourceError:
                    continue  # scan_file reports it
                hit = cache.load(cache.key(os.path.abspath(path), displays[index], raw,
                                           _facts_key(path, raw, models_for(path), settings)))
                if hit is not None:
                    file_results[index] = FileResult(displays[index], list(hit.findings), parsed=hit.parsed)
                    cached += 1
            stage.advance(cached)
        todo = [index for index, fr in enumerate(file_results) if fr is None]
        if todo:
            tasks = [(files[index], displays[index], models_for(files[index])) for index in todo]
            for index, fr in zip(todo, _scan_files(tasks, settings, check_syntax, cache, jobs, stage.advance)):
                file_results[index] = fr
    results: list[FileResult] = file_results  # type: ignore[assignment] - every slot is filled now

    notes: list[str] = list(discovered.warnings)
    notes.extend(f"{display_path(path)}: not scanned: a symlink to a file outside the project ({settings.root}); "
                 "its text is not read for a report" for path in external)
    findings: list[Finding] = []
    errors: list[str] = []
    for fr in results:
        findings.extend(fr.findings)
        errors.extend(fr.errors)

    index_of = {display: index for index, display in enumerate(displays)}

    def source_of(index: int) -> SourceFile | None:
        # Files answered by the cache or a worker come back without their text; read it again.
        fr = results[index]
        if fr.source is None and not fr.source_unreadable:
            try:
                fr.source = read_source(files[index], displays[index])
            except SourceError:
                fr.source_unreadable = True
        return fr.source

    if audit is not None:
        findings = merge_model_findings(findings, audit.findings, settings)
        notes.extend(audit.notes)
        errors.extend(audit.errors)

    findings = mirrored(findings, index_of, source_of)
    not_analysed = {fr.path for fr in results if fr.errors}
    kept, suppressed = kept_findings(findings, displays, lambda display: source_of(index_of[display]),
                                     not_analysed, settings)
    assign_fingerprints(kept, settings.root)
    return ScanResult(
        findings=kept,
        files_scanned=len(files),
        files_parsed=sum(1 for fr in results if fr.parsed),
        missing=discovered.missing,
        errors=errors,
        notes=notes,
        suppressed=suppressed,
        files_cached=cached,
        sort=settings.sort,
        texts=dict(texts or {}),
    )


def within_project(files: "Sequence[Path]", root: "str | Path") -> "tuple[list[Path], list[Path]]":
    """(files to scan, files not to read): a file found inside the project that is a symlink to a file
    outside it (``train.py -> ~/.ssh/id_rsa``, ``/etc/...``) is reported by its name only, never read,
    so that none of its text reaches a report. Files named outside the project are the caller's choice."""
    real_root = os.path.realpath(root)
    inside, outside = [], []
    for path in files:
        found_inside = _under(os.path.abspath(path), real_root, os.path.abspath(root))
        if found_inside and not _under(os.path.realpath(path), real_root):
            outside.append(path)
        else:
            inside.append(path)
    return inside, outside


def _under(path: str, *folders: str) -> bool:
    return any(path == folder or path.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)


def mirrored(findings: list[Finding], index_of: dict[str, int],
             source_of: "Callable[[int], SourceFile | None]") -> list[Finding]:
    """``findings`` and, for each related place marked ``mirror`` (a helper's sync in another module
    that a training loop calls every step) in a file this scan covers, the finding again at that
    place, from the helper's point of view: its file's suppressions and per-file-ignores then apply
    to it, and a scan of the helper's folder shows it where the code is. One per place and rule."""
    out = list(findings)
    seen = {(f.rule, f.location.path, f.location.line, f.location.column) for f in findings}
    for finding in findings:
        for place in finding.related:
            loc = place.location
            key = (finding.rule, loc.path, loc.line, loc.column)
            if not place.mirror or loc.path == finding.location.path or loc.path not in index_of or key in seen:
                continue
            seen.add(key)
            source = source_of(index_of[loc.path])
            line_text = source.line_text(loc.line) if source is not None else ""
            out.append(mirrored_at(finding, loc, place.message, line_text))
    return out


# A line of the file named in a message ("line 90", "lines 90-91, 95").
_LINE_NAMED = re.compile(r"\b(lines? )(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)")


@dataclass
class _Kept:
    """One analysis of an editor's document (its findings before the filters), kept to stand for the
    next text where the edit is one no rule notices (tcaudit/source/inert.py): then its findings are
    moved to their new lines instead of analysing again."""

    settings: Settings
    models: object
    rules: tuple[str, ...]
    check_syntax: bool
    text: str
    outline: object  # the text's top-level statements (tcaudit/source/inert.py), parsed when first needed
    result: FileResult
    reads: dict  # what the analysis read besides the text (tcaudit/source/inert.py)

    @classmethod
    def of(cls, result: FileResult, settings: Settings, models: object, rules: "Sequence", check_syntax: bool,
           reads: dict, starts: "list[int] | None") -> "_Kept | None":
        """What to keep of an analysis (``starts``: its top-level statements' lines, where known)."""
        from tcaudit.source.inert import Outline

        if (not result.parsed or result.errors or result.source is None
                or any(f.rule == "TC000" for f in result.findings)):
            return None
        text = result.source.text
        outline = Outline.of_chunks(text, starts) if starts else None
        return cls(settings, models, tuple(rule.id for rule in rules), check_syntax, text, outline, result, reads)

    def reuse(self, source: SourceFile, settings: Settings, models: object, rules: "Sequence",
              check_syntax: bool) -> FileResult | None:
        """The findings for ``source`` without analysing it, where its edit from the kept text is inert
        and nothing else the analysis read changed; else None."""
        from tcaudit.source.inert import Outline, inert_edit, reads_unchanged

        if ((settings is not self.settings and settings != self.settings) or models is not self.models
                or check_syntax != self.check_syntax or tuple(rule.id for rule in rules) != self.rules
                or "\r" in source.text or not reads_unchanged(self.reads)):
            return None
        if self.outline is None:
            self.outline = Outline.parse(self.text)
        found = inert_edit(self.text, self.outline, source.text, _vocabulary())  # type: ignore[arg-type]
        if found is None:
            return None
        shift, outline = found
        again = _Analysis(source, rules, settings, check_syntax, models)
        moved = []
        for finding in self.result.findings:
            place = _moved_finding(finding, shift, self.result.source, source, again)  # type: ignore[arg-type]
            if place is None:
                return None
            moved.append(place)
        result = FileResult(self.result.path, moved, source=source, parsed=True)
        self.text, self.outline, self.result = source.text, outline, result
        return result


class _Analysis:
    """A whole analysis of a text, made the first time it is asked for: where a moved finding's fix
    edits would touch what the edit changed, its edits come from the text analysed again."""

    def __init__(self, source: SourceFile, rules: "Sequence", settings: Settings, check_syntax: bool,
                 models: object) -> None:
        self.args = (source, rules, settings, check_syntax, models)
        self.findings: list[Finding] | None = None

    def edits_of(self, rule: str, location: Location):
        if self.findings is None:
            source, rules, settings, check_syntax, models = self.args
            fresh = decode_source(source.text.encode("utf-8"), source.path, source.display_path)
            self.findings = call_with_deep_stack(scan_source, fresh, rules, settings, check_syntax, models).findings
        for finding in self.findings:
            if finding.rule == rule and finding.location == location and finding.fix is not None:
                return finding.fix.edits
        return None


_VOCABULARY = None


def _vocabulary():
    """What the analysis reads of a text (tcaudit/rules/text_table.py), compiled once."""
    global _VOCABULARY
    if _VOCABULARY is None:
        from tcaudit.rules.text_table import TEXT_PATTERNS, TEXT_PIECES, TEXT_WORDS
        from tcaudit.source.inert import Vocabulary

        _VOCABULARY = Vocabulary(TEXT_PATTERNS, TEXT_WORDS, TEXT_PIECES)
    return _VOCABULARY


def _moved_finding(finding: Finding, shift, old: SourceFile, new: SourceFile, again: _Analysis) -> Finding | None:
    """``finding`` of the old text where it is in the new one (its place, related places and fix
    edits moved), or None where that cannot be told."""
    import dataclasses

    location = finding.location
    if location.path != old.display_path and location.cell is None:
        return finding
    new_location = _moved_location(location, shift)
    if new_location is None:
        return None
    message, explanation = finding.message, finding.explanation
    # This file's places named by name and line ("train.py:42"; another module's lines do not move).
    own_place = re.compile(rf"(?<![\w.-]){re.escape(Path(old.display_path).name)}:\d")
    if shift.line_delta:
        texts = [_lines_moved(text, shift) for text in (message, explanation, *(p.message for p in finding.related))]
        if any(text is None or own_place.search(text) for text in texts):
            return None
        message, explanation = texts[0], texts[1]
    related = []
    for place in finding.related:
        if place.location.path != old.display_path:
            related.append(place)
            continue
        moved = _moved_location(place.location, shift)
        if moved is None:
            return None
        related.append(dataclasses.replace(place, location=moved))
    fix = finding.fix
    if fix is not None and shift.line_delta and (fix.reason or _LINE_NAMED.search(fix.description)):
        reason = None if fix.reason is None else _lines_moved(fix.reason, shift)
        description = _lines_moved(fix.description, shift)
        if description is None or (fix.reason is not None and reason is None) or own_place.search(
                f"{reason or ''} {description}"):
            return None
        fix = dataclasses.replace(fix, reason=reason, description=description, edits=fix.__dict__.get("_edits"))
    if fix is not None:
        pending = fix.pending_edits
        if pending is not None:
            fix = dataclasses.replace(fix, edits=PendingEdits(
                lambda: _moved_edits(pending.make(), shift, lambda: again.edits_of(finding.rule, new_location))))
        elif fix.edits is not None:
            edits = _moved_edits(fix.edits, shift, lambda: None)
            if edits is None:
                return None
            fix = dataclasses.replace(fix, edits=edits)
    source_line = finding.source_line
    if source_line == old.line_text(location.line):
        source_line = new.line_text(new_location.line)
    return dataclasses.replace(finding, location=new_location, related=tuple(related), fix=fix,
                               source_line=source_line, message=message, explanation=explanation)


def _lines_moved(text: str, shift) -> str | None:
    """``text`` with the lines it names ("line 90", "lines 90-91, 95") renumbered for the new text; None
    where one of them is a line the edit changed."""
    failed = False

    def number(match: re.Match) -> str:
        nonlocal failed
        place = shift.position(int(match.group(0)), 1)
        if place is None:
            failed = True
            return match.group(0)
        return str(place[0])

    def moved(match: re.Match) -> str:
        return match.group(1) + re.sub(r"\d+", number, match.group(2))

    out = _LINE_NAMED.sub(moved, text)
    return None if failed else out


def _moved_location(location: Location, shift) -> Location | None:
    import dataclasses

    span = shift.span(location.line, location.column, location.end_line, location.end_column)
    if span is None or location.cell is not None:
        return None
    return dataclasses.replace(location, line=span[0], column=span[1], end_line=span[2], end_column=span[3])


def _moved_edits(edits, shift, otherwise):
    """Text edits of the old text, moved into the new one; ``otherwise()`` where one touches or holds
    what the edit changed (made from the old text, it would undo the change)."""
    import dataclasses

    if edits is None:
        return None
    moved = []
    for edit in edits:
        if edit.cell is not None or not shift.clear_of(edit.line, edit.column, edit.end_line, edit.end_column):
            return otherwise()
        span = shift.span(edit.line, edit.column, edit.end_line, edit.end_column)
        if span is None:
            return otherwise()
        moved.append(dataclasses.replace(edit, line=span[0], column=span[1], end_line=span[2], end_column=span[3]))
    return tuple(moved)


def scan_text(
    raw: bytes,
    display: str,
    settings: Settings,
    *,
    path: Path | None = None,
    models: "AuditedModels | None" = None,
    model_findings: "Sequence[Finding]" = (),
    rules: "Sequence[ScriptRule | LazyRule] | None" = None,
    edit_lines: "tuple[int, int] | None" = None,
    incremental: "IncrementalState | None" = None,
) -> ScanResult:
    """Scan a text that is not (or not as it is now) on disk, such as a script read from stdin or an
    editor's buffer, exactly as :func:`scan` scans a file: the script rules, then the filters
    (per-file-ignores and suppression comments by ``display``, TC001). ``raw``: its bytes, decoded
    by Python's rules (PEP 263, BOM). ``path``: the file it stands for (default ``display``).
    ``models``/``model_findings``: what a model audit of the file on disk measured and found (the
    editor's last save): the script rules decide with those facts, and its findings are merged as
    scan merges them. ``rules``: the script rules to run (default: those ``settings`` enable,
    imported as their triggers occur); a caller scanning often passes the same ones each time.
    ``edit_lines``: (first, last): where the settings ask for edits, only those findings' edits.
    ``incremental``: what the last scan of this document kept (tcaudit/source/incremental.py): only
    the top-level statements that changed are parsed, and the walks over the others are reused."""
    from tcaudit.rules.registry import lazy_rules

    path = path if path is not None else Path(display)
    enabled = set(settings.enabled_rules())
    try:
        source = decode_source(raw, path, display)
    except SourceError as exc:
        result = FileResult(display, [tc000(display, exc)])
    else:
        chosen = rules if rules is not None else lazy_rules(settings)
        check_syntax = "TC000" in enabled
        keep = incremental is not None and source.notebook is None and edit_lines is None
        with incremental.claim() if incremental is not None else contextlib.nullcontext(False) as held:
            # Another scan of the document (a code action's beside the typing's) holds its state: this
            # one neither reuses nor keeps anything.
            keep = keep and held
            reused = None
            if held:
                incremental.reused = False
            if keep:
                if isinstance(incremental.kept, _Kept):
                    reused = incremental.kept.reuse(source, settings, models, chosen, check_syntax)
            if reused is not None:
                result = reused
                incremental.reused = True
            else:
                try:
                    with contextlib.ExitStack() as stack:
                        if incremental is not None:
                            stack.enter_context(incremental.analysing(source))
                        reads = stack.enter_context(recording_reads(path.parent if keep else None))
                        if held:  # the document's trigger literals, answered from its last text's
                            stack.enter_context(answering_literals(incremental.literals, source.text))
                        result = call_with_deep_stack(scan_source, source, chosen, settings, check_syntax, models,
                                                      edit_lines)
                except Exception as exc:  # noqa: BLE001 - a TC000 on this text, never the end of the scan
                    result = FileResult(display, [tc000(display, cannot_analyse(exc))])
                if keep:
                    incremental.kept = _Kept.of(result, settings, models, chosen, check_syntax, reads,
                                                incremental.statement_starts(source.text))
    findings = result.findings
    if model_findings:
        findings = merge_model_findings(findings, [f for f in model_findings if f.location.path == display], settings)
    kept, suppressed = kept_findings(findings, [display], lambda _: result.source,
                                     {display} if result.errors else set(), settings)
    assign_fingerprints(kept, settings.root)
    return ScanResult(
        findings=kept,
        files_scanned=1,
        files_parsed=int(result.parsed),
        errors=result.errors,
        suppressed=suppressed,
        sort=settings.sort,
        texts={display: raw},
    )


def silenced(finding: Finding, settings: Settings, usage: Usage) -> bool:
    """Whether the config's per-file-ignores (for the finding's file) or a suppression comment of the
    file (``usage``, which records the comments that silenced something) silence ``finding``: the one
    filter scan's reports and the fix engine's analyses apply."""
    if any(matches_selector(finding.rule, s) for s in settings.ignored_for(finding.location.path)):
        return True
    return usage.suppress(finding)


def kept_findings(
    findings: list[Finding],
    displays: list[str],
    source_of: "Callable[[str], SourceFile | None]",
    not_analysed: set[str],
    settings: Settings,
) -> tuple[list[Finding], int]:
    """(the findings a report shows, how many were suppressed): the enabled rules' findings less
    what per-file-ignores and suppression comments silence, plus TC001's unused suppressions.
    ``displays``: the files scanned; ``source_of(display)``: a file's text (None where unreadable);
    ``not_analysed``: the files whose analysis hit an internal error (TC001 says nothing there)."""
    enabled = set(settings.enabled_rules())
    kept: list[Finding] = []
    suppressed = 0
    usage_of: dict[str, Usage] = {}
    scanned = set(displays)

    def usage(path: str) -> Usage:
        if path not in usage_of:
            source = source_of(path) if path in scanned else None
            usage_of[path] = Usage(directives(source.text) if source is not None else Directives())
        return usage_of[path]

    for finding in findings:
        if finding.rule not in enabled:
            continue
        if silenced(finding, settings, usage(finding.location.path)):
            suppressed += 1
            continue
        kept.append(finding)
    if UNUSED_SUPPRESSION in enabled:
        not_analysed = set(not_analysed) | {f.location.path for f in findings if f.rule == "TC000"}
        for display in displays:
            ignored_here = settings.ignored_for(display)
            if any(matches_selector(UNUSED_SUPPRESSION, s) for s in ignored_here):
                continue
            source = source_of(display)
            if source is None or not usage(display).directives.found:
                continue
            ran = rules_that_ran(enabled, ignored_here, display not in not_analysed)
            for finding in unused_suppressions(display, source.text, usage(display), ran):
                if usage(display).suppress(finding):
                    suppressed += 1
                else:
                    kept.append(finding)
    kept = in_notebook_cells(kept, displays, source_of)
    kept.sort(key=lambda f: f.sort_key)
    return kept, suppressed


def in_notebook_cells(
    findings: list[Finding], displays: list[str], source_of: "Callable[[str], SourceFile | None]"
) -> list[Finding]:
    """The findings with those in notebooks moved from the virtual script's lines (where the rules,
    the cache and the suppression comments see them) to the code cells' (``Location.cell``): once, as
    the last step of a scan (tcaudit/source/notebook.py)."""
    from tcaudit.source.notebook import in_cells, is_notebook

    notebooks = {display for display in displays if is_notebook(Path(display))}
    if not notebooks:
        return findings
    out = []
    for finding in findings:
        source = source_of(finding.location.path) if finding.location.path in notebooks else None
        out.append(in_cells(finding, source.notebook) if source is not None and source.notebook is not None else finding)
    return out


def run_audit(
    files: list[Path], displays: list[str], settings: Settings, cache: "ScanCache | None" = None
) -> "ModelAuditResult | None":
    """The model audit of the models ``files`` build, where scan runs it (``model_audit_wanted``); fix
    and verify ask the same, so all three decide with the same facts. None where it does not run."""
    if not model_audit_wanted(settings):
        return None
    sources = []
    for path, display in zip(files, displays):
        try:
            sources.append(read_source(path, display))
        except SourceError:
            continue  # scan_file (or fix_file) reports it
    return call_with_deep_stack(
        run_model_audit, sources, settings, scan_cache=cache, script_uses_cuda=scripts_using_cuda(sources)
    )


def run_model_audit(
    sources: "list[SourceFile]",
    settings: Settings,
    *,
    limits=None,
    scan_cache=None,
    script_uses_cuda: "Callable[[str], bool] | None" = None,
) -> "ModelAuditResult":
    """The model audit: every model the sources build measured (:mod:`tcaudit.model`, in a sandbox,
    within ``settings.model_budget``), then judged by the enabled model rules. ``script_uses_cuda(path)``
    says whether the script at that real path may run on CUDA (None: assume so); a model built by a
    CPU-only script gets its advice as info."""
    from tcaudit.model import TORCH_MISSING_NOTE, ModelAuditResult, ModelsNotMeasured, measure_models, torch_available

    result = ModelAuditResult()
    if not settings.exec_models:
        return result
    if not torch_available():
        result.notes.append(TORCH_MISSING_NOTE)
        return result
    from tcaudit.rules.registry import model_rules

    rules = model_rules(settings)
    if not rules:
        return result
    try:
        measure_models(sources, settings, result, limits=limits, scan_cache=scan_cache)
    except ModelsNotMeasured:
        return result
    report(result.facts, rules, settings, sources, result, script_uses_cuda)
    if result.facts:
        from tcaudit.model.cost import table_notes

        result.notes.extend(f"model audit: {note}" for note in table_notes())
    return result


def report(
    facts_list: "list[ModelFacts]",
    rules: "Sequence[ModelRule]",
    settings: "Settings",
    sources,
    result: ModelAuditResult,
    script_uses_cuda: "Callable[[str], bool] | None" = None,
) -> None:
    """The model rules' findings on each model's facts, into ``result``, with the notes the capture
    left. An internal error about one model (in the audit child, or a rule raising on its facts) is a
    TC100 finding for that model, never a scan error: the other models and files are still reported."""
    from tcaudit.model.cost import CostModel
    from tcaudit.model.facts import ModelFacts
    from tcaudit.rules.base import ModelContext

    by_path = {os.path.realpath(str(source.path)): source for source in sources}
    not_audited = next((rule for rule in rules if rule.id == "TC100"), None)
    seen: set[tuple] = set()
    for facts in facts_list:
        target = facts.target
        try:
            context = ModelContext(settings, facts, CostModel(facts, settings.precision, settings.gpu), by_path)
            if script_uses_cuda is not None and target.get("kind") == "script" and target.get("path"):
                context.cpu_only = not script_uses_cuda(os.path.realpath(target["path"]))
            _notes(facts, context, result)
        except Exception as exc:  # noqa: BLE001 - a bug about one model must not end the scan
            result.notes.append(f"model audit of `{target.get('label', '?')}` ({target.get('path', '?')}) not "
                                f"reported: internal error: {exc!r} (a bug in tcaudit)")
            continue
        found: list[Finding] = []
        for rule in rules:
            try:
                found.extend(rule.check(facts, context))
            except Exception as exc:  # noqa: BLE001 - one rule's bug costs its findings on this model
                reason = f"internal error in {rule.id}: {exc!r}\n{traceback.format_exc()}"
                found.extend(_internal_error(ModelFacts.failed(target, reason, "error"), context, not_audited, result))
        if facts.status == "error" and not_audited is None:
            found.extend(_internal_error(facts, context, None, result))
        for finding in found:
            loc = finding.location
            key = (finding.rule, loc.path, loc.line, loc.column, finding.message)
            if key in seen:
                continue
            seen.add(key)
            result.findings.append(finding)


def _internal_error(facts: "ModelFacts", context, not_audited: "ModelRule | None",
                    result: "ModelAuditResult") -> "list[Finding]":
    """TC100's finding for a model the audit failed on by its own fault (``facts.status`` "error");
    where TC100 is not enabled, a note, so that the failure is still said."""
    if not_audited is not None:
        try:
            return list(not_audited.check(facts, context))
        except Exception:  # noqa: BLE001 - fall through to the note
            pass
    where = context.display_path(facts.target.get("path", "?"))
    label = facts.target.get("label") or "a model"
    first = next((line for line in facts.reason.splitlines() if line.strip()), facts.reason)
    result.notes.append(f"model audit of `{label}` ({where}) not done: {first} (a bug in tcaudit)")
    return []


def _notes(facts: "ModelFacts", context, result: ModelAuditResult) -> None:
    if facts.status != "ok":
        return
    site = context.target_site()
    where = f"{context.display_path(site.path)}:{site.line}"
    label = facts.target.get("label") or facts.model_class
    for note in facts.capture.notes:
        if facts.capture.method != "parameters":
            result.notes.append(f"model audit of `{label}` ({where}): {note}")
    if facts.capture.failures and facts.capture.method != "parameters":
        result.notes.append(
            f"model audit of `{label}` ({where}) used {facts.capture.method} after: " + "; ".join(facts.capture.failures)
        )


def audited_models_for(
    files: list[Path], settings: Settings, cache: "ScanCache | None" = None
) -> "dict[str, AuditedModels]":
    """What the model audit measures about the models the files build, by real path, where scan would
    run it (so that fix and verify decide as scan does); empty otherwise. ``cache``: scan's, whose
    model-audit entries answer for models whose code has not changed."""
    paths = [Path(path) for path in files]
    audit = run_audit(paths, [display_path(path) for path in paths], settings, cache)
    if audit is None:
        return {}
    from tcaudit.model import audited_models

    return handed_in(audited_models(audit.facts), settings)


def handed_in(models_of: "dict[str, AuditedModels]", settings: Settings) -> "dict[str, AuditedModels]":
    """``models_of`` (the audited models by the real path of the script that builds them) and, for each
    project module those scripts import that builds no audited model itself, the profiles of the models
    of every script that imports it (``AuditedModels.handed_in``): what a ``Trainer`` class in another
    module trains, for the rules that discount advice a launch-bound model cannot use."""
    if not models_of:
        return models_of
    from tcaudit.model_profile import AuditedModels
    from tcaudit.project.imports import dependencies, read_small

    given: dict[str, list] = {}
    for script, models in models_of.items():
        if models.handed_in:
            continue
        raw = read_small(Path(script))
        if raw is None:
            continue
        for module in dependencies(Path(script), raw.decode("utf-8", "replace"), settings.root).files:
            key = os.path.realpath(module)
            if key not in models_of:
                given.setdefault(key, []).extend(models.profiles)
    out = dict(models_of)
    for key, profiles in given.items():
        out[key] = AuditedModels(tuple(profiles), handed_in=True)
    return out


def scripts_using_cuda(sources: list[SourceFile]) -> "Callable[[str], bool]":
    """``uses_cuda(real path)`` for the model audit: whether the script that builds a model may run on
    CUDA (``ScriptFacts.uses_cuda``); a file it cannot read or parse counts as CUDA (no advice lowered)."""
    by_path = {os.path.realpath(str(source.path)): source for source in sources}
    answers: dict[str, bool] = {}

    def uses_cuda(path: str) -> bool:
        from tcaudit.script.facts import ScriptFacts

        if path not in answers:
            source = by_path.get(path)
            try:
                answers[path] = source is None or ScriptFacts(source).uses_cuda
            except SourceError:
                answers[path] = True
        return answers[path]

    return uses_cuda


def model_audit_wanted(settings: Settings) -> bool:
    """Whether scan (and fix, so that both decide alike) builds the scripts' models: allowed to run
    them, and a TC1 rule enabled."""
    return settings.exec_models and any(rule.startswith("TC1") for rule in settings.enabled_rules())


def merge_model_findings(script: list[Finding], model: list[Finding], settings: Settings) -> list[Finding]:
    """The script rules' findings and the model audit's, with each rule that reports from both
    (``ScriptRule.merge_model_findings``) making one finding per thing it reports."""
    from tcaudit.rules.registry import has_script_rule, load_rule

    out = [f for f in script if f.rule not in {m.rule for m in model}]
    for rule_id in sorted({f.rule for f in model}):
        mine = [f for f in script if f.rule == rule_id]
        theirs = [f for f in model if f.rule == rule_id]
        if mine and has_script_rule(rule_id):
            mine, theirs = type(load_rule(rule_id, settings)).merge_model_findings(mine, theirs)
        out.extend(mine)
        out.extend(theirs)
    return out


def _facts_key(path: Path, raw: bytes, models: "AuditedModels | None", settings: Settings) -> str:
    """What the rules read for a file besides its own bytes: the model audit's profiles and the project
    modules it imports (a changed imported module invalidates the files that import it)."""
    from tcaudit.project.imports import dependencies
    from tcaudit.rules.registry import any_helper_trigger

    if path.suffix == ".ipynb":
        try:
            text = decode_source(raw, path).text
        except SourceError:
            text = ""
    else:
        text = raw.decode("utf-8", "replace")
    models_key = models.digest() if models is not None else ""
    key = f"{models_key}/{dependencies(path, text, settings.root).digest}"
    if any_helper_trigger(text):  # a helper module: judged from the training scripts that import it
        from tcaudit.project.importers import importers_digest

        key += f"/{importers_digest(path, settings.root)}"
    return key


# -- analysing the files: in-process or in workers --------------------------------------------------
def _scan_one(
    path: Path,
    display: str,
    models: "AuditedModels | None",
    rules: "Sequence[ScriptRule | LazyRule]",
    settings: Settings,
    check_syntax: bool,
    cache: "ScanCache | None",
) -> FileResult:
    try:
        # Deeply nested code (which Python accepts up to 200 brackets) needs a deep stack to analyse.
        result = call_with_deep_stack(scan_file, path, rules, settings, display, check_syntax, models)
    except Exception as exc:  # noqa: BLE001 - whatever one file does to the analysis, the others are reported
        result = FileResult(display)
        result.findings.append(tc000(display, cannot_analyse(exc)))
        return result
    # Keyed by the bytes this scan read, so a file edited since the cache lookup is stored as it is
    # now. A file with an internal error is not stored: the next scan should show the error again.
    if cache is not None and result.source is not None and not result.errors:
        key = cache.key(os.path.abspath(path), display, result.source.raw, _facts_key(path, result.source.raw, models, settings))
        cache.store(key, result.findings, result.parsed)
    return result


def _scan_files(
    tasks: list[tuple[Path, str, "AuditedModels | None"]],
    settings: Settings,
    check_syntax: bool,
    cache: "ScanCache | None",
    jobs: int,
    done: "Callable[[], None]" = lambda: None,
) -> list[FileResult]:
    """FileResults in the order of ``tasks``; ``done()`` after each file (the progress display)."""
    from tcaudit.rules.registry import lazy_rules

    if jobs <= 1 or len(tasks) < PARALLEL_MIN_FILES:
        # Each rule is imported with the first file whose text needs it (most files need none).
        rules = lazy_rules(settings)
        results = []
        with collecting_less_often():
            for task in tasks:
                results.append(_scan_one(*task, rules, settings, check_syntax, cache))
                done()
        return results
    return _scan_parallel(tasks, settings, check_syntax, cache, jobs, done)


@contextmanager
def collecting_less_often():
    """The cyclic collector at :data:`GC_THRESHOLD` for the duration (a worker keeps it for good)."""
    before = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


# What a forked worker would otherwise import at its first parse, imported once in the parent before
# the fork: LibCST and the facts every rule reads (measured in BENCHMARKS.md, "Scan speed"). Each rule
# module is small and loads in the worker whose files need it.
_PARSE_MACHINERY = ("tcaudit.rules.base", "tcaudit.script.facts", "tcaudit.rules.situations")


@contextmanager
def _ready_to_fork(context):
    """The parent's part of a forked pool: the parse machinery imported once, and the parent's
    objects frozen while the workers run: the collector would otherwise walk (and so copy, page by
    page) what every worker inherited."""
    if context.get_start_method() != "fork":
        yield
        return
    for module in _PARSE_MACHINERY:
        importlib.import_module(module)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _mp_context():
    import multiprocessing

    if START_METHOD is not None:
        return multiprocessing.get_context(START_METHOD)
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


_WORKER_STATE: tuple | None = None


def _init_worker(settings: Settings, check_syntax: bool, cache: "ScanCache | None") -> None:
    global _WORKER_STATE
    # Ctrl-C is the parent's to handle: it cancels what is queued and waits for what is running.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    from tcaudit.rules.registry import lazy_rules

    _WORKER_STATE = (lazy_rules(settings), settings, check_syntax, cache)


def _scan_in_worker(path: Path, display: str, models: "AuditedModels | None") -> FileResult:
    assert _WORKER_STATE is not None
    rules, settings, check_syntax, cache = _WORKER_STATE
    result = _scan_one(path, display, models, rules, settings, check_syntax, cache)
    result.source = None  # the parent reads the text again if it needs it; a parsed tree is heavy to send
    return result


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _scan_parallel(
    tasks: list[tuple[Path, str, "AuditedModels | None"]],
    settings: Settings,
    check_syntax: bool,
    cache: "ScanCache | None",
    jobs: int,
    done: "Callable[[], None]" = lambda: None,
) -> list[FileResult]:
    results: dict[int, FileResult] = {}
    # Largest first: the slow files start early and the quick ones fill in around them.
    pending = sorted(range(len(tasks)), key=lambda i: (-_file_size(tasks[i][0]), i))
    with _ready_to_fork(_mp_context()):
        # A worker that dies (a crash in native code, the OOM killer) breaks the whole pool and every
        # file in flight with it. Try those once more in a fresh pool, then one process per file, so
        # that a file which kills its process costs only its own result.
        pending = _run_pool(tasks, pending, results, settings, check_syntax, cache, jobs, done)
        if pending:
            pending = _run_pool(tasks, pending, results, settings, check_syntax, cache, jobs, done)
        for index in pending:
            if _run_pool(tasks, [index], results, settings, check_syntax, cache, 1, done):
                display = tasks[index][1]
                results[index] = FileResult(
                    display,
                    errors=[f"{display}: internal error: the worker process scanning this file died "
                            "(a crash or the system running out of memory)"],
                )
                done()
    return [results[index] for index in range(len(tasks))]


def _run_pool(
    tasks: list[tuple[Path, str, "AuditedModels | None"]],
    indices: list[int],
    results: dict[int, FileResult],
    settings: Settings,
    check_syntax: bool,
    cache: "ScanCache | None",
    jobs: int,
    done: "Callable[[], None]" = lambda: None,
) -> list[int]:
    """Scan ``tasks[i]`` for i in ``indices`` in a pool of worker processes, into ``results``; returns
    the indices left without a result because a worker died."""
    # Imported here: a scan that runs in-process (one file, or a cached folder) never needs them.
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    executor = ProcessPoolExecutor(
        max_workers=max(1, min(jobs, len(indices))),
        mp_context=_mp_context(),
        initializer=_init_worker,
        initargs=(settings, check_syntax, cache),
    )
    try:
        futures = {}
        for index in indices:
            try:
                futures[executor.submit(_scan_in_worker, *tasks[index])] = index
            except BrokenProcessPool:
                break
        for future in as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
            except BrokenProcessPool:
                continue
            except Exception as exc:  # noqa: BLE001 - e.g. a result that could not be sent back
                display = tasks[index][1]
                results[index] = FileResult(
                    display, errors=[f"{display}: internal error in a scan worker: {exc!r}"]
                )
            done()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return [index for index in indices if index not in results]


def unused_suppressions_in(source: SourceFile, settings: Settings, models: "AuditedModels | None" = None) -> list[Finding]:
    """TC001's findings on one text, filtered as scan filters them: what ``tcaudit fix`` removes from
    the text it has fixed (scan computes them in its own filtering stage). Empty where TC001 is off
    for the file, or the text has no suppression comment, does not parse or hits an internal error."""
    from tcaudit.rules.registry import lazy_rules

    enabled = set(settings.enabled_rules())
    ignored_here = settings.ignored_for(source.display_path)
    if UNUSED_SUPPRESSION not in enabled or any(matches_selector(UNUSED_SUPPRESSION, s) for s in ignored_here):
        return []
    usage = Usage(directives(source.text))
    if not usage.directives.found:
        return []
    candidates = candidate_rules(lazy_rules(settings), source.text, source.path, settings.root)
    if not candidates:
        if syntax_error(source) is not None:
            return []
        findings: list[Finding] = []
    else:
        try:
            _, findings, errors = call_with_deep_stack(analyse_source, source, candidates, settings, models, edits=False)
        except (SourceError, RecursionError, MemoryError):
            return []
        if errors:
            return []
    for finding in findings:
        if finding.rule in enabled and not any(matches_selector(finding.rule, s) for s in ignored_here):
            usage.suppress(finding)
    ran = rules_that_ran(enabled, ignored_here, True)
    return [f for f in unused_suppressions(source.display_path, source.text, usage, ran) if not usage.suppress(f)]
