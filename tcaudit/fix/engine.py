"""Apply every applicable fix to a file, to a fixed point, behind a safety net.

Each round scans the current text with the enabled rules, hands each rule's fixable findings to
its codemod, and re-parses between codemods, so that several fixes on one file (and on one node:
TC202 and TC203 on the same GradScaler) compose the way ruff's do. A round that changes nothing
ends the loop. Output that does not parse or compile is never kept.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tcaudit.config import Settings
from tcaudit.catalog import matches_selector
from tcaudit.engine import analyse_source, candidate_rules, instantiate_rules
from tcaudit.findings import Finding, FixClass, FollowsFix
from tcaudit.fix.textio import SourceText, read_text, write_atomically
from tcaudit.rewrite.textedits import line_map
from tcaudit.source.parsing import SourceError, SourceFile
from tcaudit.source.suppressions import directives
from tcaudit.structural import companion_enabled

# LibCST, the rules and the codemods load with the first file that has to be fixed: a fix answered
# from the cache needs none of them (BENCHMARKS.md, "Fix speed").
if TYPE_CHECKING:
    import libcst as cst

    from tcaudit.cache import ScanCache
    from tcaudit.model_profile import AuditedModels
    from tcaudit.rules.base import Codemod
    from tcaudit.rules.situations import Protection

MAX_ROUNDS = 6


def discover_codemods() -> "dict[str, type[Codemod]]":
    """Every rule's fix, by rule id (imported with the first file that has to be fixed)."""
    from tcaudit.rules import base

    return base.discover_codemods()


@dataclass
class FileFix:
    path: str
    original: str
    fixed: str
    applied: list[str] = field(default_factory=list)  # rule ids whose codemod changed the file
    declined: list[tuple[Finding, str]] = field(default_factory=list)
    remaining: list[Finding] = field(default_factory=list)
    error: str | None = None
    source: SourceText | None = None

    @property
    def changed(self) -> bool:
        return self.error is None and self.fixed != self.original

    def original_line(self, line: int) -> int:
        """The line of the original text that line ``line`` of the fixed text stands for: the same line
        where the fix kept it, the next original line after code the fix inserted (the file on disk until
        ``--apply`` writes the fixed text)."""
        key = (self.fixed, self.original)
        if getattr(self, "_lines_for", None) != key:  # one diff per pair of texts, not one per line asked
            self._lines = line_map(self.fixed, self.original)
            self._lines_for = key
        found = self._lines.get(line)
        return found if found is not None else max(min(line, len(self.original.splitlines())), 1)

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.original.splitlines(keepends=True),
                self.fixed.splitlines(keepends=True),
                fromfile=self.path if self.path.startswith("/") else f"a/{self.path}",
                tofile=self.path if self.path.startswith("/") else f"b/{self.path}",
            )
        )


def _analyse(path: Path, display: str, text: str, source: SourceText, rules, settings, models=None):
    """(facts, findings) for one version of the file's text, filtered as scan filters them (per-file
    ignores, suppression comments); facts is None when no rule can match. Raises SourceError when
    the text does not parse."""
    candidates = candidate_rules(rules, text)
    if not candidates:
        return None, []
    sf = SourceFile(path=path, display_path=display, raw=source.raw, text=text, encoding=source.encoding)
    facts, findings, errors = analyse_source(sf, candidates, settings, models, edits=False)
    if errors:
        raise FixAnalysisError(errors[0].splitlines()[0])
    ignored = settings.ignored_for(display)
    found = directives(text)
    return facts, [
        f for f in findings
        if not found.suppresses(f) and not any(matches_selector(f.rule, s) for s in ignored)
    ]


class FixAnalysisError(Exception):
    """The analysis of one version of the file failed inside tcaudit: nothing is written."""


def fix_enabled(finding: Finding, classes: frozenset[FixClass], options: tuple[str, ...]) -> bool:
    """Whether a fix run with these classes and options (``Settings.fix_options``) edits ``finding``."""
    fix = finding.fix
    if fix is None:
        return False
    # A conversion leaves parts of its job to companion rules' fixes in the next round (the DDP
    # conversion: sampler, set_epoch, no_sync, bucket view); they run whatever ``--classes`` says.
    if companion_enabled(finding.rule, options):
        return True
    return fix.enabled(classes, options)


def _decline_key(finding: Finding) -> tuple[str, str, str]:
    """Identifies a finding across rounds: lines shift as fixes insert code, the line's text does not."""
    return (finding.rule, finding.message, " ".join(finding.source_line.split()))


def _parsed(code: str, display: str) -> "tuple[cst.Module | None, str | None]":
    """(the parsed module, None), or (None, why the code does not parse or compile)."""
    import libcst as cst

    try:
        module = cst.parse_module(code)
        compile(code, display, "exec", dont_inherit=True)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return module, None


def fix_file(
    path: Path,
    settings: Settings,
    classes: frozenset[FixClass] = frozenset({FixClass.SAFE, FixClass.NUMERICS}),
    display: str | None = None,
    models: "AuditedModels | None" = None,
    cache: "ScanCache | None" = None,
) -> FileFix:
    """``models``: what the model audit measured about the models the original file builds (scan's
    ``models_for``); every round decides with it, as scan did. ``cache``: the result cache scan uses;
    a file fixed before with the same text, settings, classes and model facts is answered from it."""
    display = display or path.as_posix()
    try:
        source = read_text(path)
    except SourceError as exc:
        return FileFix(display, "", "", error=f"not fixed: {exc.message}")
    key = None
    if cache is not None:
        key = cache.key(os.path.abspath(path), display, source.raw, _fix_facts(settings, classes, display, models))
        hit = cache.load_fix(key)
        if hit is not None:
            return FileFix(display, source.text, hit.fixed, list(hit.applied), list(hit.declined), source=source)
    result = _fix_text(path, source, settings, classes, display, models)
    if cache is not None and key is not None and result.error is None:
        from tcaudit.cache import CachedFix

        cache.store_fix(key, CachedFix(result.fixed, list(result.applied), list(result.declined)))
    return result


def _fix_facts(settings: Settings, classes: frozenset[FixClass], display: str, models: "AuditedModels | None") -> str:
    """What else a fix's result depends on beyond the cache's namespace: the classes, the file's ignores
    (applied to the findings fix acts on) and the model audit's facts."""
    return "\x1f".join((
        "fix", ",".join(sorted(str(c) for c in classes)), repr(settings.ignored_for(display)),
        models.digest() if models is not None else "",
    ))


def _fix_text(
    path: Path,
    source: SourceText,
    settings: Settings,
    classes: frozenset[FixClass],
    display: str,
    models: "AuditedModels | None",
) -> FileFix:
    result = FileFix(display, source.text, source.text, source=source)
    rules = instantiate_rules(settings)
    from tcaudit.rewrite.codemod import DeclineFix, FixContext
    from tcaudit.rules.base import in_rule_order
    from tcaudit.rules.situations import protections, refusing

    rank = {rule.id: index for index, rule in enumerate(in_rule_order(rules))}
    codemods: "dict[str, Codemod]" = {rule: cls() for rule, cls in discover_codemods().items()}
    text = source.text
    declined: dict[tuple, tuple[Finding, str]] = {}
    analysed: dict[str, tuple] = {}
    # What declined fixes protect against, from every round so far: a later round's edit may not
    # bring it about either (the round's own scan already declines fixes that say they would).
    guarded: "dict[tuple, Protection]" = {}

    def analyse(version: str):
        # Each version of the text is parsed and checked once: the round's first codemod and the
        # next round's scan reuse what the previous step computed.
        if version not in analysed:
            analysed.clear()
            analysed[version] = _analyse(path, display, version, source, rules, settings, models)
        return analysed[version]

    for _ in range(MAX_ROUNDS):
        try:
            _, findings = analyse(text)
        except SourceError as exc:
            result.error = f"not fixed: {exc.message}"
            result.fixed = source.text
            return result
        except FixAnalysisError as exc:
            result.error = f"not fixed: {exc}"
            result.fixed = source.text
            return result
        for protection in protections(findings):
            guarded.setdefault((protection.situation, protection.rule), protection)
        by_rule: dict[str, list[Finding]] = {}
        for finding in findings:
            fix = finding.fix
            if fix is None or not fix_enabled(finding, classes, settings.fix_options):
                continue
            if not fix.available:
                declined[_decline_key(finding)] = (finding, fix.reason or "")
                continue
            if finding.rule not in codemods:
                continue
            by_rule.setdefault(finding.rule, []).append(finding)
        changed = False
        # A rule's fix comes after the fixes of the rules it names in ``after`` (rules/base.in_rule_order).
        for rule_id in sorted(by_rule, key=lambda rule: rank.get(rule, len(rank))):
            try:
                facts, findings_now = analyse(text)
            except (SourceError, FixAnalysisError):
                break
            # Findings of the current text, so their positions match this module. A fix that follows
            # another rule's fix waits for the round after that one.
            current = [
                f for f in findings_now
                if f.rule == rule_id and f.fix is not None and f.fix.available and not isinstance(f.fix.plan, FollowsFix)
            ]
            kept = []
            for finding in current:
                protection = refusing(finding, guarded.values())
                if protection is not None:
                    declined[_decline_key(finding)] = (finding, protection.refusal())
                else:
                    kept.append(finding)
            current = kept
            if not current:
                continue
            context = FixContext(facts, settings)
            try:
                new_module = codemods[rule_id].apply(facts.module, current, context)
            except DeclineFix as exc:
                for finding in current:
                    declined[_decline_key(finding)] = (finding, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - one rule's failure must not cost the other fixes
                for finding in current:
                    declined[_decline_key(finding)] = (finding, f"internal error in the {rule_id} fix: {exc!r}")
                continue
            new_text = new_module.code
            if new_text == text:
                continue
            refusal = _edit_refusal(rule_id, facts, new_text, display, guarded.values(), analyse)
            if refusal is not None:
                for finding in current:
                    declined[_decline_key(finding)] = (finding, refusal)
                continue
            text = new_text
            changed = True
            if rule_id not in result.applied:
                result.applied.append(rule_id)
        if not changed:
            break
    result.fixed = text
    try:
        result.remaining = analyse(text)[1]
    except (SourceError, FixAnalysisError):
        result.remaining = []
    # Positions of the final text (a decline from an earlier round would carry that round's lines).
    remaining_by_key = {_decline_key(f): f for f in result.remaining}
    result.declined = [(remaining_by_key[k], reason) for k, (_, reason) in declined.items() if k in remaining_by_key]
    return result


def _edit_refusal(rule_id: str, before, new_text: str, display: str, guarded, analyse) -> str | None:
    """Why the edit from ``before``'s text to ``new_text`` is refused (it does not compile, adds code
    that never runs, uses a name before its import, or brings about what another rule's decline
    protects against), or None to keep it."""
    from tcaudit.script.guards import structural_refusal

    parsed, problem = _parsed(new_text, display)
    if parsed is None:
        return f"the rewrite did not compile ({problem}); left unchanged"
    refusal = structural_refusal(before.module, parsed)
    if refusal is not None:
        return refusal
    broken = _brought_about(rule_id, before, new_text, guarded, analyse)
    return broken.refusal() if broken is not None else None


def _brought_about(rule_id: str, before, new_text: str, guarded, analyse) -> "Protection | None":
    """The protection (of another rule) that the edit from ``before``'s text to ``new_text`` breaks,
    counting each protected situation on both sides; None when it breaks none or cannot be told."""
    from tcaudit.rules.situations import instances

    others = [p for p in guarded if p.rule != rule_id]
    if not others:
        return None
    try:
        after, _ = analyse(new_text)
    except (SourceError, FixAnalysisError):
        return None
    if after is None:
        return None
    for protection in others:
        if instances(protection.situation, after) > instances(protection.situation, before):
            return protection
    return None


def write_fix(result: FileFix, path: Path) -> None:
    assert result.source is not None and result.changed
    data = result.source.encode(result.fixed)
    write_atomically(path, data)
