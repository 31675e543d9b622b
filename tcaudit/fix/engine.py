"""Apply every applicable fix to a file, to a fixed point, behind a safety net.

A round analyses the current text once. Each rule with fixes due runs its codemod on that analysis,
and its change becomes text edits of that text (tcaudit/rewrite/textedits.py); the edits of rules
whose changes do not overlap are made together. A rule whose change overlaps one made earlier in the
round, or that follows (``after``) a rule changing the file this round and is worded for that rule's
result, is made after them, on a fresh analysis by that rule alone. A fix that waits for another
rule's fix (``FollowsFix``) is made once that fix is. A round that changes nothing ends the loop: the
rounds needed are at most the depth of the ``after`` declarations (plus one for a structural
conversion's companions). Output that does not parse or compile is never kept, nor an edit that
brings about what another rule's declined fix protects against.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tcaudit.config import Settings
from tcaudit.engine import (analyse_source, candidate_rules, cannot_analyse, collecting_less_often, instantiate_rules,
                            silenced, syntax_error)
from tcaudit.findings import Finding, FixClass, FollowsFix
from tcaudit.fix.textio import NotWritable, SourceText, read_text, source_text, write_atomically
from tcaudit.rewrite.textedits import line_map
from tcaudit.source.parsing import SourceError, SourceFile, decode_source
from tcaudit.source.suppressions import directives
from tcaudit.structural import companion_enabled
from tcaudit.unused_suppressions import Usage

# LibCST, the rules and the codemods load with the first file that has to be fixed: a fix answered
# from the cache needs none of them (BENCHMARKS.md, "Fix speed").
if TYPE_CHECKING:
    import libcst as cst

    from tcaudit.cache import ScanCache
    from tcaudit.model_profile import AuditedModels
    from tcaudit.rules.base import Codemod
    from tcaudit.rules.situations import Protection
    from tcaudit.script.facts import ScriptFacts

MAX_ROUNDS = 6


def discover_codemods() -> "dict[str, type[Codemod]]":
    """Every rule's fix, by rule id (imported with the first file that has to be fixed)."""
    from tcaudit.rules import registry

    return registry.discover_codemods()


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
    rounds: int = 0  # the rounds that changed the text (each from one analysis of the text before it)
    # Why the fixes made were undone as a whole (a notebook whose fixed script cannot be written back
    # into its cells): one line for the user, the file left as it was.
    notice: str | None = None

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

    def place(self, line: int, applied: bool) -> str:
        """Line ``line`` of the file's text as the file shows it: ``12``, or in a notebook ``cell 3:12``.
        ``applied``: a line of the fixed text (written by ``--apply``), else of the original."""
        notebook = self.source.notebook if self.source is not None else None
        if notebook is None:
            return str(line)
        if applied and self.changed:
            from tcaudit.source.notebook import Notebook

            notebook = Notebook.parse(self.source.encode(self.fixed))
        where = notebook.cell_position(line)
        return f"cell {where[0]}:{where[1]}" if where is not None else str(line)

    def in_cells(self, text: str) -> str:
        """A message naming lines of the original text, with a notebook's lines named by cell."""
        notebook = self.source.notebook if self.source is not None else None
        return notebook.cell_lines_in(text) if notebook is not None else text

    def diff(self) -> str:
        if self.source is not None and self.source.notebook is not None:
            return self.source.notebook.cell_diffs(self.fixed, self.path)
        return "".join(
            difflib.unified_diff(
                self.original.splitlines(keepends=True),
                self.fixed.splitlines(keepends=True),
                fromfile=self.path if self.path.startswith("/") else f"a/{self.path}",
                tofile=self.path if self.path.startswith("/") else f"b/{self.path}",
            )
        )


def _source_file(path: Path, display: str, text: str, source: SourceText, module=None) -> SourceFile:
    """``text`` (a version of ``source``'s) as a SourceFile; ``module``: its parse, where made already."""
    made = SourceFile(path=path, display_path=display, raw=source.raw, text=text, encoding=source.encoding)
    return made.with_module(module) if module is not None else made


def _analyse(path: Path, display: str, text: str, source: SourceText, rules, settings, models=None, facts=None,
             module=None):
    """(facts, findings) for one version of the file's text, filtered as scan filters them (per-file
    ignores, suppression comments); facts is None when no rule can match. Raises SourceError when
    the text does not parse. ``facts``: the text's, where they are made already. Opt-in fixes the
    settings do not ask for are not planned (``RuleContext.unplanned``)."""
    candidates = candidate_rules(rules, text, path, settings.root)
    if not candidates:
        return None, []
    sf = facts.source if facts is not None else _source_file(path, display, text, source, module)
    unplanned = settings.unasked_options
    facts, findings, errors = analyse_source(sf, candidates, settings, models, edits=False, facts=facts,
                                             unplanned=unplanned)
    if errors:
        raise FixAnalysisError(errors[0].splitlines()[0])
    usage = Usage(directives(text))
    return facts, [f for f in findings if not silenced(f, settings, usage)]


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
            return FileFix(display, source.text, hit.fixed, list(hit.applied), list(hit.declined), list(hit.remaining),
                           source=source)
    try:
        with collecting_less_often():  # a full collection per few allocations made a large file's fix superlinear
            result = _fix_source(path, source, settings, classes, display, models)
    except Exception as exc:  # noqa: BLE001 - this file is left as it was; the others are fixed
        return FileFix(display, source.text, source.text, error=f"not fixed: {cannot_analyse(exc).message}")
    if cache is not None and key is not None and result.error is None:
        from tcaudit.cache import CachedFix

        cache.store_fix(key, CachedFix(result.fixed, list(result.applied), list(result.declined),
                                       list(result.remaining)))
    return result


def fix_bytes(
    raw: bytes,
    display: str,
    settings: Settings,
    classes: frozenset[FixClass] = frozenset({FixClass.SAFE, FixClass.NUMERICS}),
    *,
    path: Path | None = None,
    models: "AuditedModels | None" = None,
) -> FileFix:
    """:func:`fix_file` on a text that is not on disk (stdin, an editor's buffer, the Python API):
    ``raw`` decoded by Python's rules; ``path``: the file it stands for (default ``display``)."""
    path = path if path is not None else Path(display)
    try:
        source = source_text(decode_source(raw, path, display))
    except SourceError as exc:
        return FileFix(display, "", "", error=f"not fixed: {exc.message}")
    return _fix_source(path, source, settings, classes, display, models)


def _fix_source(path: Path, source: SourceText, settings: Settings, classes: frozenset[FixClass], display: str,
                models: "AuditedModels | None") -> FileFix:
    """The fixes, then TC001's, then (a notebook) the check that the result goes back into its cells. A text
    Python cannot parse is not fixed, and says so (as scan's TC000), even where no rule's trigger occurs."""
    problem = syntax_error(_source_file(path, display, source.text, source))
    if problem is not None:
        return FileFix(display, source.text, source.text, error=f"not fixed: {problem.message}", source=source)
    result = _fix_text(path, source, settings, classes, display, models)
    remove_unused_suppressions(result, path, settings, classes, models)
    if source.notebook is not None and result.changed:
        problem = source.notebook.check(result.fixed)
        if problem is not None:  # each fix passed this check alone; together they may not
            result.notice = f"not fixed: {problem} ({', '.join(result.applied)}); left unchanged"
            result.fixed, result.applied = source.text, []
    return result


def remove_unused_suppressions(result, path: Path, settings, classes, models=None) -> None:
    """TC001's fix on the text ``fix_file`` made (a safe fix: ``classes`` must hold safe): the unused
    and unknown codes of its suppression comments removed, edits on those comments only. It runs
    last, on the fixed text, because whether a code silenced something is known only there."""
    from tcaudit.engine import unused_suppressions_in
    from tcaudit.rewrite.textedits import apply_edits, overlapping

    if result.error or result.source is None or FixClass.SAFE not in classes:
        return
    text = result.fixed
    raw = result.source.raw if result.source.notebook is not None else result.source.encode(text)
    source = SourceFile(path=path, display_path=result.path, raw=raw, text=text, encoding=result.source.encoding)
    edits: list = []
    for finding in unused_suppressions_in(source, settings, models):
        mine = list(finding.fix.edits or ())
        if mine and not overlapping(edits, mine):  # two directives of one comment: the next fix gets the other
            edits.extend(mine)
    if edits:
        fixed = apply_edits(text, edits)
        if result.source.notebook is not None and result.source.notebook.check(fixed) is not None:
            return
        result.fixed = fixed
        result.applied.append("TC001")


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
    from tcaudit.rules.base import in_rule_order

    ordered = in_rule_order(rules)
    rank = {rule.id: index for index, rule in enumerate(ordered)}
    leaders = {rule.id: set(type(rule).after) for rule in ordered}
    run = _Run(path, display, source, rules, settings, models, {rule: cls() for rule, cls in discover_codemods().items()})
    text = source.text
    for _ in range(MAX_ROUNDS):
        try:
            _, findings = run.analyse(text)
        except (SourceError, FixAnalysisError) as exc:
            result.error = f"not fixed: {exc.message if isinstance(exc, SourceError) else exc}"
            result.fixed = source.text
            return result
        run.guard(findings)
        by_rule: dict[str, list[Finding]] = {}
        for finding in findings:
            fix = finding.fix
            if fix is None or not fix_enabled(finding, classes, settings.fix_options):
                continue
            if not fix.available:
                run.decline(finding, fix.reason or "")
                continue
            if finding.rule not in run.codemods:
                continue
            by_rule.setdefault(finding.rule, []).append(finding)
        order = sorted(by_rule, key=lambda rule: rank.get(rule, len(rank)))
        # A rule's fix comes after the fixes of the rules it names in ``after`` (rules/base.in_rule_order).
        merged, sequential = run.merged_round(text, order, leaders)
        new_text = merged
        for rule_id in sequential:
            new_text = run.apply_one(new_text, rule_id)
        if new_text == text:
            break
        text = new_text
        result.rounds += 1
    result.fixed = text
    result.applied = sorted(run.applied, key=lambda rule: rank.get(rule, len(rank)))
    try:
        result.remaining = run.analyse(text)[1]
    except (SourceError, FixAnalysisError):
        result.remaining = []
    # Positions of the final text (a decline from an earlier round would carry that round's lines); the
    # lines a reason names, in the original text (a reason written on a text another fix had added lines
    # to would name the wrong line, in a notebook the wrong cell).
    remaining_by_key = {_decline_key(f): f for f in result.remaining}
    result.declined = [(remaining_by_key[k], lines_in_original(reason, run.declined_on.get(k, text), source.text,
                                                                 display))
                       for k, (_, reason) in run.declined.items() if k in remaining_by_key]
    return result


def lines_in_original(message: str, version: str, original: str, display: str) -> str:
    """``message`` (written on the text ``version``) with the lines it names (``line 90``, ``lines 90-91``,
    ``lines 3, 7 and 9``, ``train.py:90``) given as the lines of ``original`` they stand for."""
    import re

    if version == original or not message or not any(ch.isdigit() for ch in message):
        return message
    mapping = line_map(version, original)

    def moved(number: str) -> str:
        return str(mapping.get(int(number), int(number)))

    def lines(match: "re.Match") -> str:
        return match.group(1) + " " + re.sub(r"\d+", lambda m: moved(m.group(0)), match.group(2))

    message = re.sub(r"\b(lines?) (\d+(?:(?:-|, | and )\d+)*)\b", lines, message)
    return re.sub(re.escape(display) + r":(\d+)\b", lambda m: f"{display}:{moved(m.group(1))}", message)


class _Run:
    """One file's fix: its analyses, declines and the protections declined fixes ask for.

    A round analyses its text once. Every rule whose fix is due runs its codemod on that analysis,
    and the edits of rules whose changes neither overlap nor follow another change of the round
    (``after``) are made together; only the others are made one by one, each on a fresh analysis of
    the text before it, as a rule that reads another rule's outcome needs."""

    def __init__(self, path, display, source, rules, settings, models, codemods) -> None:
        self.path, self.display, self.source = path, display, source
        self.rules, self.settings, self.models = rules, settings, models
        self.codemods: "dict[str, Codemod]" = codemods
        self.declined: dict[tuple, tuple[Finding, str]] = {}
        # The text each decline's reason was written on (its line numbers count that text's lines).
        self.declined_on: dict[tuple, str] = {}
        self.current = source.text  # the text the last analysis was of: the findings being judged
        self.applied: list[str] = []
        self.analysed: dict[tuple, tuple] = {}
        self.parsed: dict[str, "ScriptFacts"] = {}  # the facts of the last texts whose facts were made
        self.modules: dict[str, "cst.Module"] = {}  # the parse of the last texts the codemods made
        # What declined fixes protect against, from every round so far: a later round's edit may not
        # bring it about either (the round's own scan already declines fixes that say they would).
        self.guarded: "dict[tuple, Protection]" = {}

    def analyse(self, version: str, only: str | None = None):
        """(facts, findings) of ``version`` with every rule, or with rule ``only`` (the rules it reads
        run as it asks): each version is analysed once, and a round's merged text is the next round's."""
        self.current = version
        full = self.analysed.get((version, None))
        if full is not None:
            return full
        key = (version, only)
        if key not in self.analysed:
            if len(self.analysed) > 4:
                self.analysed.clear()
            rules = self.rules if only is None else [rule for rule in self.rules if rule.id == only]
            self.analysed[key] = _analyse(
                self.path, self.display, version, self.source, rules, self.settings, self.models,
                facts=self.parsed.get(version), module=self.modules.get(version),
            )
            if self.analysed[key][0] is not None:
                self.remember(self.analysed[key][0])
        return self.analysed[key]

    def remember(self, facts: "ScriptFacts") -> None:
        if len(self.parsed) > 4:
            self.parsed.clear()
        self.parsed[facts.source.text] = facts

    def parse(self, version: str) -> "tuple[cst.Module | None, str | None]":
        """``_parsed`` of ``version``, kept for the analysis of that text."""
        module = self.modules.get(version)
        if module is not None:
            return module, None
        module, problem = _parsed(version, self.display)
        if module is not None:
            if len(self.modules) > 8:
                self.modules.clear()
            self.modules[version] = module
        return module, problem

    def facts_of(self, version: str) -> "ScriptFacts":
        """The facts of ``version``, without running the rules (raises SourceError where it does not parse)."""
        if version not in self.parsed:
            from tcaudit.script.facts import ScriptFacts

            self.remember(ScriptFacts(_source_file(self.path, self.display, version, self.source, self.modules.get(version))))
        return self.parsed[version]

    def guard(self, findings: list[Finding]) -> None:
        from tcaudit.rules.situations import protections

        for protection in protections(findings):
            self.guarded.setdefault((protection.situation, protection.rule), protection)

    def decline(self, finding: Finding, reason: str) -> None:
        self.declined[_decline_key(finding)] = (finding, reason)
        self.declined_on[_decline_key(finding)] = self.current

    def _due(self, findings: list[Finding], rule_id: str) -> list[Finding]:
        """``rule_id``'s findings whose fix is due now (not waiting for another rule's fix) and refused
        by no protection."""
        from tcaudit.rules.situations import refusing

        kept = []
        for finding in findings:
            if finding.rule != rule_id or finding.fix is None or not finding.fix.available:
                continue
            if isinstance(finding.fix.plan, FollowsFix):  # made once the fix it waits for is made
                continue
            protection = refusing(finding, self.guarded.values())
            if protection is not None:
                self.decline(finding, protection.refusal())
            else:
                kept.append(finding)
        return kept

    def _codemod(self, facts, findings: list[Finding], rule_id: str, quiet: bool = False) -> "tuple[str, cst.Module] | None":
        """(new text, its module) of ``rule_id``'s codemod on ``findings`` of ``facts``, behind the
        compile and structure checks; None where it fails or is refused (the findings declined, unless
        ``quiet``: the codemod only tells where the rule would edit)."""
        if quiet:
            declined = dict(self.declined)
            try:
                return self._codemod(facts, findings, rule_id)
            finally:
                self.declined = declined
        from tcaudit.rules.base import Refused, made_by

        try:
            return made_by(self.codemods[rule_id], facts, findings, self.settings, rule_id, self.cells_problem)
        except Refused as refused:
            return self._refuse(findings, refused.reason)

    def cells_problem(self, text: str) -> str | None:
        """In a notebook, why ``text`` cannot be written back into its cells (a fix that spans them);
        None where it can, and in a script."""
        notebook = self.source.notebook
        return notebook.check(text) if notebook is not None else None

    def _refuse(self, findings: list[Finding], reason: str) -> None:
        for finding in findings:
            self.decline(finding, reason)
        return None

    def merged_round(self, text: str, order: list[str], leaders: dict[str, set[str]]) -> tuple[str, list[str]]:
        """(the text with the round's independent fixes made together, the rules left to make one by
        one after them, in order). A rule is left when its change overlaps another's in this round,
        when it follows (``after``) a rule changing the file this round, or when the fixes made
        together break what a decline protects."""
        from tcaudit.rewrite.textedits import apply_edits, edits_between, overlapping
        from tcaudit.script.guards import structural_refusal

        facts, findings = self.analyse(text)
        changes: list[tuple[str, tuple]] = []  # (rule, its edits of ``text``), rules made together
        held: list[tuple[str, tuple]] = []  # rules made one by one, with their edits where known
        for rule_id in order:
            follows = any(rule in leaders.get(rule_id, ()) for rule, _ in (*changes, *held))
            due = self._due(findings, rule_id)
            made = self._codemod(facts, due, rule_id, quiet=follows) if due else None
            edits = edits_between(text, made[0]) if made is not None else ()
            waiting = any(f.rule == rule_id and isinstance(f.fix.plan, FollowsFix) for f in findings if f.fix)
            if follows and (waiting or (due and not edits)):
                # Its fix is worded for the text with its leaders' fixes made (or fails without them):
                # made on that text, once they are. Its change here stands for where it edits.
                held.append((rule_id, edits))
                continue
            if not edits:
                continue
            if any(overlapping(edits, theirs) for _, theirs in (*changes, *held)):
                held.append((rule_id, edits))
                continue
            changes.append((rule_id, edits))
        if not changes:
            return text, [rule for rule, _ in held]
        merged = apply_edits(text, [edit for _, edits in changes for edit in edits])
        parsed, problem = self.parse(merged)
        if parsed is None and len(changes) == 1:
            self._refuse(self._due(findings, changes[0][0]), f"the rewrite did not parse ({problem}); left unchanged")
            return text, [rule for rule, _ in held]
        if parsed is None or (len(changes) > 1 and structural_refusal(facts.module, parsed) is not None):
            return text, list(order)  # each alone, as its checks decide
        problem = self.cells_problem(merged)
        if problem is not None:
            if len(changes) > 1:
                return text, list(order)  # each alone, as its checks decide
            self._refuse(self._due(findings, changes[0][0]), f"{problem}; left unchanged")
            return text, [rule for rule, _ in held]
        protection = self._brought_about({rule for rule, _ in changes}, facts, merged)
        if protection is not None:
            if len(changes) > 1:
                return text, list(order)  # each alone, as its checks decide
            self._refuse(self._due(findings, changes[0][0]), protection.refusal())
            return text, [rule for rule, _ in held]
        for rule_id, _ in changes:
            if rule_id not in self.applied:
                self.applied.append(rule_id)
        return merged, [rule for rule, _ in held]

    def apply_one(self, text: str, rule_id: str) -> str:
        """``text`` with ``rule_id``'s due fixes made, on a fresh analysis of it by that rule."""
        try:
            facts, findings = self.analyse(text, only=rule_id)
        except (SourceError, FixAnalysisError):
            return text
        if facts is None:
            return text
        due = self._due(findings, rule_id)
        if not due:
            return text
        made = self._codemod(facts, due, rule_id)
        if made is None or made[0] == text:
            return text
        parsed, problem = self.parse(made[0])
        if parsed is None:
            self._refuse(due, f"the rewrite did not parse ({problem}); left unchanged")
            return text
        problem = self.cells_problem(made[0])
        if problem is not None:
            self._refuse(due, f"{problem}; left unchanged")
            return text
        protection = self._brought_about({rule_id}, facts, made[0])
        if protection is not None:
            self._refuse(due, protection.refusal())
            return text
        if rule_id not in self.applied:
            self.applied.append(rule_id)
        return made[0]

    def _brought_about(self, rule_ids: set[str], before, new_text: str) -> "Protection | None":
        """The protection (of a rule other than ``rule_ids``) that the edit from ``before``'s text to
        ``new_text`` breaks, counting each protected situation on both sides; None when it breaks
        none or cannot be told."""
        from tcaudit.rules.situations import instances

        others = [p for p in self.guarded.values() if p.rule not in rule_ids]
        if not others:
            return None
        try:
            after = self.facts_of(new_text)
        except Exception:  # noqa: BLE001 - cannot be told: the edit's own checks decided
            return None
        for protection in others:
            if instances(protection.situation, after) > instances(protection.situation, before):
                return protection
        return None


def write_fix(result: FileFix, path: Path) -> None:
    assert result.source is not None and result.changed
    data = result.source.encode(result.fixed)
    write_atomically(path, data, expected=result.source.raw)


class WriteFailed(Exception):
    """One file of a group could not be written; the group's other files are as they were."""

    def __init__(self, display: str, reason: str) -> None:
        super().__init__(f"{display}: {reason}")
        self.display = display
        self.reason = reason


def write_fixes(group: "list[tuple[FileFix, Path]]") -> None:
    """Write the fixes of files that belong together (a script and the module where its DataLoader is
    built) all or none: each atomically, and where one cannot be written, those written before it get
    their original bytes back (each again atomically) and WriteFailed names the one that failed."""
    written: list[tuple[FileFix, Path]] = []
    for result, path in group:
        try:
            write_fix(result, path)
        except (NotWritable, OSError) as exc:
            reason = str(exc) if isinstance(exc, NotWritable) else f"cannot write it: {exc.strerror or exc}"
            for done, done_path in reversed(written):
                assert done.source is not None
                write_atomically(done_path, done.source.raw, expected=done.source.encode(done.fixed))
            raise WriteFailed(result.path, reason) from None
        written.append((result, path))


def fixed_elsewhere(result: FileFix, skip: "set[str]", root: Path) -> "dict[str, set[str]]":
    """The project modules (real paths, inside ``root``, not in ``skip``) where the fixes ``result``
    declines are made, by rule: a finding reported at the script's call whose code, and fix, sit in
    another module (its ``mirror`` related place: the DataLoader a helper builds). ``tcaudit fix`` of
    the script fixes those modules too, for those rules only."""
    from tcaudit.project.imports import is_project_file

    out: dict[str, set[str]] = {}
    for finding, _ in result.declined:
        for place in finding.related:
            if not place.mirror:
                continue
            module = Path(os.path.realpath(place.location.path))
            if str(module) in skip or not module.is_relative_to(root) or not is_project_file(module):
                continue
            out.setdefault(str(module), set()).add(finding.rule)
    return out
