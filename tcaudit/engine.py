"""Discover files → read and parse each once → run the enabled rules → filter the findings.

Data flows one way: paths → engine → findings → report. ``fix`` and ``verify`` reuse ``scan``.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tcaudit.catalog import load_catalog, matches_selector
from tcaudit.config import Settings
from tcaudit.findings import Finding, Location, Severity, assign_fingerprints
from tcaudit.script.rule import RuleContext, ScriptRule, discover_script_rules
from tcaudit.source.discovery import discover
from tcaudit.source.parsing import SourceError, SourceFile, python_syntax_error, read_source

# ``ignore`` must end the word: ``# tcaudit: ignore-file`` and ``# tcaudit: ignored`` are not line suppressions.
_SUPPRESS_LINE = re.compile(r"#\s*tcaudit:\s*ignore(?![-\w])(?:\[([^\]]*)\])?", re.IGNORECASE)
_SUPPRESS_FILE = re.compile(r"#\s*tcaudit:\s*ignore-file(?![-\w])(?:\[([^\]]*)\])?", re.IGNORECASE)


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    source: SourceFile | None = None
    parsed: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass
class ScanResult:
    findings: list[Finding]
    files_scanned: int
    files_parsed: int
    missing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suppressed: int = 0

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def max_severity(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)


def _parse_codes(group: str | None) -> tuple[str, ...] | None:
    """None means every rule (a bare ``# tcaudit: ignore``)."""
    if group is None:
        return None
    codes = tuple(c.strip().upper() for c in group.split(",") if c.strip())
    return codes or None


def _suppressed(finding: Finding, source: SourceFile | None, file_codes: list[tuple[str, ...] | None]) -> bool:
    for codes in file_codes:
        if codes is None or any(matches_selector(finding.rule, c) for c in codes):
            return True
    if source is None:
        return False
    for line_no in {finding.location.line, finding.location.end_line}:
        match = _SUPPRESS_LINE.search(source.line_text(line_no))
        if match:
            codes = _parse_codes(match.group(1))
            if codes is None or any(matches_selector(finding.rule, c) for c in codes):
                return True
    return False


def file_suppressions(source: SourceFile | None) -> list[tuple[str, ...] | None]:
    if source is None or "tcaudit:" not in source.text:
        return []
    return [_parse_codes(m.group(1)) for m in _SUPPRESS_FILE.finditer(source.text)]


def tc000(path: str, error: SourceError) -> Finding:
    spec = load_catalog()["TC000"]
    return Finding(
        rule="TC000",
        name=spec.name,
        severity=spec.severity,
        location=Location(path, error.line, error.column, error.line, error.column),
        message=error.message,
    )


def instantiate_rules(settings: Settings) -> list[ScriptRule]:
    enabled = set(settings.enabled_rules())
    return [cls() for rule_id, cls in sorted(discover_script_rules().items()) if rule_id in enabled]


def syntax_error(source: SourceFile) -> SourceError | None:
    return python_syntax_error(source.text, source.display_path)


def scan_file(
    path: Path,
    rules: list[ScriptRule],
    settings: Settings,
    display: str | None = None,
    check_syntax: bool = True,
) -> FileResult:
    """Scan one file with the given script rules. Never raises: problems become TC000 or errors."""
    display = display or path.as_posix()
    result = FileResult(display)
    try:
        source = read_source(path, display)
    except SourceError as exc:
        result.findings.append(tc000(display, exc))
        return result
    result.source = source
    candidates = [rule for rule in rules if rule.may_match(source.text)]
    if not candidates:
        # No rule can fire here, so LibCST is skipped; Python's own parser still catches broken files.
        if check_syntax:
            error = syntax_error(source)
            if error is not None:
                result.findings.append(tc000(display, error))
        return result
    try:
        source.module  # parse once; a syntax error is TC000
    except SourceError as exc:
        result.findings.append(tc000(display, exc))
        return result
    result.parsed = True
    from tcaudit.script.facts import ScriptFacts

    try:
        facts = ScriptFacts(source)
    except Exception as exc:  # noqa: BLE001 - an internal error must not hide the other files
        result.errors.append(f"{display}: internal error while analysing: {exc!r}\n{traceback.format_exc()}")
        return result
    context = RuleContext(settings)
    for rule in candidates:
        try:
            result.findings.extend(rule.check(facts, context))
        except Exception as exc:  # noqa: BLE001
            result.errors.append(f"{display}: internal error in {rule.id}: {exc!r}\n{traceback.format_exc()}")
    return result


def _display_path(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def scan(paths: list[str], settings: Settings, *, model_audit: bool = True) -> ScanResult:
    discovered = discover(paths, settings.exclude, settings.root, force_exclude=settings.force_exclude)
    if discovered.missing:
        # A path that does not exist is a usage error: report it before spending time on the others.
        return ScanResult(findings=[], files_scanned=0, files_parsed=0, missing=discovered.missing)
    rules = instantiate_rules(settings)
    check_syntax = "TC000" in settings.enabled_rules()
    file_results = [
        scan_file(path, rules, settings, _display_path(path), check_syntax) for path in discovered.files
    ]

    notes: list[str] = []
    findings: list[Finding] = []
    errors: list[str] = []
    for fr in file_results:
        findings.extend(fr.findings)
        errors.extend(fr.errors)

    enabled = set(settings.enabled_rules())
    if model_audit and any(rule.startswith("TC1") for rule in enabled):
        from tcaudit.model import run_model_audit  # imports no torch itself

        audit = run_model_audit([fr.source for fr in file_results if fr.source is not None], settings)
        findings.extend(audit.findings)
        notes.extend(audit.notes)
        errors.extend(audit.errors)

    sources = {fr.path: fr.source for fr in file_results}
    kept: list[Finding] = []
    suppressed = 0
    file_codes_cache: dict[str, list[tuple[str, ...] | None]] = {}
    for finding in findings:
        path = finding.location.path
        if finding.rule not in enabled:
            continue
        if any(matches_selector(finding.rule, s) for s in settings.ignored_for(path)):
            suppressed += 1
            continue
        source = sources.get(path)
        if path not in file_codes_cache:
            file_codes_cache[path] = file_suppressions(source)
        if _suppressed(finding, source, file_codes_cache[path]):
            suppressed += 1
            continue
        kept.append(finding)
    kept.sort(key=lambda f: f.sort_key)
    assign_fingerprints(kept, settings.root)
    return ScanResult(
        findings=kept,
        files_scanned=len(discovered.files),
        files_parsed=sum(1 for fr in file_results if fr.parsed),
        missing=discovered.missing,
        errors=errors,
        notes=notes,
        suppressed=suppressed,
    )
