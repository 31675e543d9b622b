"""What a rule is made of: the two bases (:class:`ScriptRule` over a script's facts, :class:`ModelRule`
over what the model audit measured), the contexts they read, a rule's fix (:class:`Codemod`) and the
one safety net every fix's text passes (:func:`made_by`). The registry that finds them is
:mod:`tcaudit.rules.registry`.

One module per rule (``tcaudit/rules/<wing>/tcNNN_name.py``) holds the rule's detection (a
:class:`ScriptRule`) and, where it has one, its fix (a :class:`Codemod`); ``rules/TCNNN.toml`` holds
its documentation and examples. The two halves meet through a typed :class:`FixPlan` per finding:
detection decides whether a fix is offered (or declined, and why) and which syntax nodes it edits;
the codemod only performs that edit. So ``scan`` promises exactly what ``fix`` does.
"""

from __future__ import annotations

import linecache
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

import libcst as cst

from tcaudit.catalog import RuleSpec, load_catalog
from tcaudit.costs import cost_note
from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan, Location, Related, Severity, TextEdit
from tcaudit.rewrite.codemod import FixContext
from tcaudit.source.syntax import full_name
from tcaudit.source.triggers import triggers_under

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.model.cost import Cost, CostModel
    from tcaudit.model.facts import ModelFacts, OpFact, Site
    from tcaudit.model_profile import AuditedModels
    from tcaudit.project.symbols import Project
    from tcaudit.project.values import Values
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import SourceFile

@dataclass(frozen=True)
class RuleContext:
    settings: "Settings"
    # What the model audit measured about the models this file builds; None where it did not run or
    # reach them (the rules then infer from the script's text).
    models: "AuditedModels | None" = None
    # Opt-in fixes (``Fix.option``: ``ddp``, ``dali``, ``compile``) the caller will not make: ``tcaudit
    # fix`` without the flag. Their findings are reported without planning them (``planned_fix``).
    unplanned: frozenset[str] = frozenset()
    # The findings of the rules already run on a text (the engine runs a rule's ``after`` first), by
    # (rule id, id of the facts), with the facts kept alive beside them; and the texts with a rule's
    # fixes made in memory.
    outcomes: dict = field(default_factory=dict, compare=False, repr=False)
    # How a rule that reads another's outcome gets that rule, made for ``settings``: the engine's
    # (``tcaudit.rules.registry.load_rule``), so that no rule module imports another.
    load_rule: "Callable[[str, Settings], ScriptRule] | None" = field(default=None, compare=False, repr=False)

    def cost(self, spec: RuleSpec, key: str) -> str:
        """The figure ``spec``'s rule quotes under ``key`` for the target GPU, naming the GPU
        (:func:`tcaudit.costs.cost_note`)."""
        return cost_note(spec, self.settings.target, key)

    def project(self, facts: "ScriptFacts") -> "Project":
        """The project seen from ``facts``' file: the modules it imports inside the project
        (:mod:`tcaudit.project`), made once per file."""
        from tcaudit.project.symbols import project_of

        return project_of(facts, self.settings.root)

    def values(self, facts: "ScriptFacts") -> "Values":
        """Values of names in ``facts``' project (:class:`tcaudit.project.values.Values`), deciding
        ``torch.cuda.is_available()`` and ``torch.cuda.is_bf16_supported()`` for the target GPU."""
        key = ("values", id(facts))
        if key not in self.outcomes:
            from tcaudit.project.values import Values

            target = self.settings.target
            assume = {"torch.cuda.is_available": True, "torch.cuda.is_bf16_supported": target.has_bf16}
            self.outcomes[key] = (facts, Values(self.project(facts), assume))
        return self.outcomes[key][1]

    def leader(self, rule_id: str) -> "ScriptRule":
        """Rule ``rule_id``, made for these settings, to read its outcome."""
        if self.load_rule is None:
            raise RuntimeError("this RuleContext was made without a rule loader (tcaudit.rules.registry.context)")
        return self.load_rule(rule_id, self.settings)

    def findings_of(self, rule_id: str, facts: "ScriptFacts") -> list[Finding]:
        """What rule ``rule_id`` (one the asking rule names in its ``after``) reports on ``facts``: the
        engine's result where it ran that rule on them, else the rule run now. [] when the settings do
        not enable it (its fix will not be made, so no rule may count on it)."""
        key = (rule_id, id(facts))
        if key not in self.outcomes:
            found: list[Finding] = []
            if rule_id in self.settings.enabled_rules():
                leader = self.leader(rule_id)
                if leader.may_match(facts.source.text):
                    found = list(leader.check(facts, self))
            self.outcomes[key] = (facts, found)
        return self.outcomes[key][1]

    def record(self, rule_id: str, facts: "ScriptFacts", findings: list[Finding]) -> None:
        """The engine's: ``rule_id``'s findings on ``facts``, for the rules that run after it."""
        self.outcomes[(rule_id, id(facts))] = (facts, list(findings))

    def fixable(self, rule_id: str, facts: "ScriptFacts") -> list[Finding]:
        """``findings_of`` whose fix is available (also one made in a later round, after the fix it
        waits for)."""
        return [f for f in self.findings_of(rule_id, facts) if f.fix is not None and f.fix.available]

    def compiles_trained_models(self, facts: "ScriptFacts") -> bool:
        """Whether ``fix --compile`` compiles every model this file trains: TC305 (which the asking rule
        names in its ``after``) reports them all with a fix it will make. False for ``scan`` and a plain
        ``fix``, and where TC305 declines a model (a recurrent one, one built in a loop): that one runs eager."""
        if "compile" not in self.settings.structural_fixes or "compile" in self.unplanned:
            return False
        found = self.findings_of("TC305", facts)
        return bool(found) and all(f.fix is not None and f.fix.available for f in found)

    def fixed_by(self, rule_id: str, facts: "ScriptFacts") -> "ScriptFacts | None":
        """The facts of ``facts``'s text with every available fix of ``rule_id`` made, in memory; None
        when it has none, or its fix fails or makes a text ``tcaudit fix`` would refuse."""
        key = ("fixed-by", rule_id, id(facts))
        if key not in self.outcomes:
            after = None
            theirs = [f for f in self.fixable(rule_id, facts) if f.waits_for is None]
            if theirs:
                after = text_with_fixes(facts, theirs, self.leader(rule_id), self.settings)
            self.outcomes[key] = (facts, after)
        return self.outcomes[key][1]


class ScriptRule:
    """A check over one file's :class:`ScriptFacts`.

    ``triggers`` are regular expressions of which at least one must occur in the file's text for
    the rule to possibly fire; the engine skips parsing files that match no enabled rule's trigger.
    They must be necessary conditions (an alias still spells the imported name somewhere).
    """

    id: ClassVar[str]
    triggers: ClassVar[tuple[str, ...]] = ()
    # The rules whose outcome this one reads (``context.findings_of``, ``context.fixed_by``) or whose
    # fix its own follows: the engine runs them first on each text, and ``fix`` makes their fixes
    # before this rule's in a round. No rule module imports another (tests/test_rule_leaves.py).
    after: ClassVar[tuple[str, ...]] = ()
    # The rules without whose fixes this rule's fix means nothing or is unsafe (TC403's non_blocking
    # copies need TC402's pinned memory): ``verify --attribute`` leaves them out of the patch together
    # (tcaudit/verify/attribution.py). A structural conversion's rules and companions go together too.
    fixed_with: ClassVar[tuple[str, ...]] = ()
    # Triggers that replace ``triggers`` when ``fix`` may make a structural conversion (by its name):
    # a rule that speaks for what the conversion will bring needs less text.
    structural_triggers: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Triggers for a helper module the project's training scripts import (a loss helper, a loader
    # factory), which ``triggers`` do not match because the training happens elsewhere: the engine
    # runs the rule on a file where one of these occurs when a training script of the project imports
    # it (tcaudit/project/importers.py); the rule then judges it from those scripts' point of view.
    helper_triggers: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.spec: RuleSpec = load_catalog()[self.id]

    def configure(self, settings: "Settings") -> None:
        """Adjust the rule to the settings it will run under, before any file is read. The engine
        knows a rule's triggers without importing it (tcaudit/rules/registry.py): a rule whose
        necessary text depends on a structural option says so in ``structural_triggers``; one that
        overrides this method is imported up front."""
        self.triggers = triggers_under(type(self).triggers, self.structural_triggers, settings.structural_fixes)

    def may_match(self, text: str) -> bool:
        return not self.triggers or any(re.search(t, text) for t in self.triggers)

    def check(self, facts: "ScriptFacts", context: RuleContext) -> Iterator[Finding]:
        raise NotImplementedError

    @classmethod
    def merge_model_findings(
        cls, script: list[Finding], model: list[Finding]
    ) -> tuple[list[Finding], list[Finding]]:
        """For a rule the model audit reports too (the TC1 rules with a script half: TC101, TC102,
        TC104): this rule's script findings and the audit's findings of the same id, made into one
        finding per thing reported; returns (script, model) findings to keep. Both by default."""
        return script, model

    @staticmethod
    def planned_fix(
        fix_class: FixClass,
        description: str,
        plan: "Callable[[], FixPlan]",
        *,
        option: str | None = None,
        context: RuleContext | None = None,
    ) -> Fix:
        """A fix whose plan is made now: ``plan()`` returns what the fix will edit, or raises
        :class:`DeclineFix` with the reason it cannot be done safely (then the finding says so, and
        the situations the decline protects against are kept on the fix). An opt-in fix that
        ``context`` says will not be made is left unplanned (``plan`` None: nothing can make it)."""
        if option is not None and context is not None and option in context.unplanned:
            return Fix(fix_class, description, option=option)
        try:
            made = plan()
        except DeclineFix as exc:
            return Fix(fix_class, description, available=False, reason=str(exc), option=option, protects=exc.protects)
        return Fix(fix_class, description, plan=made, option=option, creates=made.creates())

    def finding(
        self,
        facts: "ScriptFacts",
        node: cst.CSTNode,
        message: str,
        *,
        fix: Fix | None = None,
        severity: Severity | None = None,
        end_node: cst.CSTNode | None = None,
        details: dict | None = None,
        follows: str | None = None,
        explanation: str = "",
        related: "Sequence[Related]" = (),
    ) -> Finding:
        location = _location(facts, node, end_node)
        return Finding(
            rule=self.id,
            name=self.spec.name,
            severity=self.spec.severity if severity is None else severity,
            location=location,
            message=message,
            fix=fix,
            details=details or {},
            source_line=facts.source.line_text(location.line),
            scope=facts.scope_name(node),
            follows=follows,
            explanation=explanation,
            related=tuple(related),
        )

    @staticmethod
    def line_place(where: tuple[str, int], message: str) -> Related:
        """Line ``where`` = (display path, line) as a related place of a finding (where a value is set)."""
        path, line = where
        return Related(Location(path, line, 1, line, 1), message)

    @staticmethod
    def place(facts: "ScriptFacts", node: cst.CSTNode, message: str, *, mirror: bool = False) -> Related:
        """``node`` of ``facts``' file (another module of the project) as a related place of a finding;
        ``mirror``: the finding is also reported there when that file is scanned."""
        return Related(_location(facts, node), message, mirror)


def _location(facts: "ScriptFacts", node: cst.CSTNode, end_node: cst.CSTNode | None = None) -> Location:
    """Where ``node`` (through ``end_node``'s end) is in ``facts``' file, as reports give it."""
    start = facts.position(node)
    end = facts.position(end_node) if end_node is not None else start
    return Location(
        path=facts.source.display_path,
        line=start.start.line,
        column=start.start.column + 1,
        end_line=end.end.line,
        end_column=end.end.column + 1,
    )


class Codemod:
    """A rule's fix: performs the edits its findings' plans describe, and nothing else.

    ``apply`` gets the current module and the findings of this rule whose fix is available (each
    with its :class:`FixPlan`, made from this very module), and returns the new module. It keeps
    everything outside its edit untouched (LibCST preserves formatting and comments) and adds the
    imports it needs. Whether to fix was decided at detection; ``apply`` raises
    :class:`DeclineFix` only for what the plan could not foresee.
    """

    rule: ClassVar[str]
    # Whether the fix edits only what its findings' plans name (and adds module-level statements): then
    # scan's per-finding edits run it on the region of the module that holds those (made_in_region). A
    # fix that looks for more on its own (a conversion that guards every print) sets it False.
    edits_plan_only: ClassVar[bool] = True

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        raise NotImplementedError


def in_rule_order(rules: "Sequence[ScriptRule]") -> "list[ScriptRule]":
    """``rules`` by id, each preceded by the rules of its ``after`` (where they are among them), so a
    rule always runs after the rules whose outcome it reads."""
    by_id = {rule.id: rule for rule in rules}
    out: list[ScriptRule] = []
    placed: set[str] = set()

    def place(rule: "ScriptRule", path: tuple[str, ...]) -> None:
        if rule.id in placed:
            return
        if rule.id in path:
            raise RuntimeError(f"rules run after each other in a cycle: {' -> '.join((*path, rule.id))}")
        for leader in type(rule).after:
            if leader in by_id:
                place(by_id[leader], (*path, rule.id))
        placed.add(rule.id)
        out.append(rule)

    for rule_id in sorted(by_id):
        place(by_id[rule_id], ())
    return out


def after_depth(rules: "Sequence[ScriptRule]") -> int:
    """The most rules in one chain of ``after`` declarations among ``rules`` (1 where none declares one):
    the most rounds ``tcaudit fix`` needs for fixes that wait for each other."""
    by_id = {rule.id: rule for rule in rules}
    depth: dict[str, int] = {}
    for rule in in_rule_order(rules):  # leaders first
        depth[rule.id] = 1 + max((depth[leader] for leader in type(rule).after if leader in by_id), default=0)
    return max(depth.values(), default=0)


def codemod_of(rule: "ScriptRule") -> "Codemod | None":
    """The fix of ``rule``, from the rule's own module (imported already: the rule exists)."""
    cls = type(rule)
    cached = _CODEMODS.get(cls.id, _MISSING)
    if cached is _MISSING:
        import sys

        found = [c for c in defined_in(sys.modules[cls.__module__], Codemod) if c.rule == cls.id]
        cached = _CODEMODS[cls.id] = found[0]() if found else None
    return cached  # type: ignore[return-value]


_CODEMODS: dict[str, "Codemod | None"] = {}
_MISSING = object()


class Refused(Exception):
    """A fix that cannot be made on this text: the codemod declined or failed, or its text does not
    compile or breaks the structure (``reason`` says which, as ``tcaudit fix`` reports it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def made_by(
    codemod: Codemod,
    facts: "ScriptFacts",
    findings: "Sequence[Finding]",
    settings: "Settings",
    rule_id: str,
    check: "Callable[[str], str | None] | None" = None,
) -> "tuple[str, cst.Module]":
    """(text, module) after ``codemod`` fixes ``findings`` of ``facts``, behind the one safety net that
    ``tcaudit fix`` and scan's edits share: the text compiles, passes ``check`` (``fix``'s: a notebook's
    cells can hold it) and keeps the file's structure (no unreachable code, no name used before its
    import). Raises :class:`Refused` with the reason otherwise."""
    from tcaudit.rewrite.textedits import keep_lone_cr
    from tcaudit.script.guards import structural_refusal

    try:
        module = codemod.apply(facts.module, list(findings), FixContext(facts, settings))
        text = keep_lone_cr(facts.source.text, module.code)
    except DeclineFix as exc:
        raise Refused(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - one rule's failure must not cost the other fixes
        raise Refused(f"internal error in the {rule_id} fix: {exc!r}") from None
    if text == facts.source.text:
        return text, module
    try:
        compile(text, facts.source.display_path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Refused(f"the rewrite did not compile ({problem}); left unchanged") from None
    problem = check(text) if check is not None else None
    if problem is not None:
        raise Refused(f"{problem}; left unchanged")
    refusal = structural_refusal(facts.module, module)
    if refusal is not None:
        raise Refused(refusal)
    return text, module


def fixed_text(
    facts: "ScriptFacts", findings: "Sequence[Finding]", rule: "ScriptRule", settings: "Settings"
) -> str | None:
    """``facts``'s text after ``rule``'s fix of ``findings`` (findings of that rule, made from
    ``facts``), as :func:`made_by` makes it; None where the rule has no fix or it is refused."""
    codemod = codemod_of(rule)
    if codemod is None or not findings:
        return None
    made = made_in_region(codemod, facts, findings, settings, rule.id)
    if made is not None:
        return made[0]
    try:
        return made_by(codemod, facts, findings, settings, rule.id)[0]
    except Refused:
        return None


def fixed_edits(
    facts: "ScriptFacts", findings: "Sequence[Finding]", rule: "ScriptRule", settings: "Settings"
) -> "tuple[TextEdit, ...] | None":
    """:func:`fixed_text` as edits of ``facts``'s text (tcaudit/rewrite/textedits.py); where the region
    made it, found by comparing the region's code only (a whole 2,000-line text costs difflib far more
    than the fix)."""
    from tcaudit.rewrite.textedits import edits_between

    codemod = codemod_of(rule)
    if codemod is None or not findings:
        return None
    made = made_in_region(codemod, facts, findings, settings, rule.id)
    if made is not None:
        return made[1]
    try:
        text = made_by(codemod, facts, findings, settings, rule.id)[0]
    except Refused:
        return None
    return edits_between(facts.source.text, text)


def made_in_region(
    codemod: Codemod, facts: "ScriptFacts", findings: "Sequence[Finding]", settings: "Settings", rule_id: str
) -> "tuple[str, tuple[TextEdit, ...]] | None":
    """(:func:`made_by`'s text, its edits of the original text), made by running ``codemod`` on the
    smallest region of the module that holds the findings and their plans' nodes
    (tcaudit/rewrite/region.py) instead of on the whole module; None where the region cannot vouch for
    giving the same text (the caller then makes it on the whole module), including every refusal,
    which the whole module's run then decides and words."""
    from tcaudit.rewrite.region import imports_added, mentions, region_for
    from tcaudit.rewrite.textedits import apply_edits, edits_between, keep_lone_cr
    from tcaudit.script.guards import structural_refusal

    if not codemod.edits_plan_only:
        return None
    lines = [line for f in findings for line in (f.location.line, f.location.end_line)]
    region = region_for(facts, [f.fix.plan for f in findings if f.fix is not None], lines)
    if region is None:
        return None
    try:
        module = codemod.apply(region.module, list(findings), FixContext(facts, settings))
        code = keep_lone_cr(facts.source.text, module.code)
        text = region.spliced(code)
    except Exception:  # noqa: BLE001 - a decline or a failure: the whole module's run says which
        return None
    if text is None:
        return None
    if text == facts.source.text:
        return text, ()
    # The safety net on the region: the statements left out are the same before and after (and each
    # compiles on its own, as top-level defs and classes do), so what they add to the net's verdicts
    # cancels out, except module-level reads of a name the fix newly imports.
    try:
        compile(code, facts.source.display_path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    if structural_refusal(region.module, module) is not None:
        return None
    added = imports_added(region.module, module)
    if added and mentions(region.left_out(), added):
        return None
    edits = region.edits(code)
    if edits is None or apply_edits(facts.source.text, edits) != text:
        edits = edits_between(facts.source.text, text)
    return text, edits


def text_with_fixes(
    facts: "ScriptFacts", findings: "Sequence[Finding]", rule: "ScriptRule", settings: "Settings"
) -> "ScriptFacts | None":
    """The facts of :func:`fixed_text` (parsed anew); None where there is no such text."""
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import SourceError, SourceFile

    text = fixed_text(facts, findings, rule, settings)
    if text is None:
        return None
    if text == facts.source.text:
        return facts
    source = facts.source
    try:
        raw = text.encode(source.encoding if source.encoding != "utf-8-sig" else "utf-8", "surrogateescape")
        return ScriptFacts(SourceFile(source.path, source.display_path, raw, text, source.encoding))
    except (SourceError, ValueError, UnicodeError):
        return None


def defined_in(module, base: type) -> list[type]:
    return [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, base) and value is not base
        and getattr(value, "__module__", None) == module.__name__
    ]


def dotted(node: cst.CSTNode | None) -> str | None:
    return full_name(node) if node is not None else None


# -- the model rules (TC1): checks over what the model audit measured ------------------------------------
MINOR_SHARE = 0.01  # below 1% of the model's FLOPs (or time) a finding is info, whatever its rule


@dataclass
class ModelContext:
    """What a model rule may use besides the facts: settings, the cost model, and the scanned files."""

    settings: "Settings"
    facts: ModelFacts
    cost_model: CostModel
    sources: dict[str, "SourceFile"] = field(default_factory=dict)  # resolved absolute path → file
    # The script that builds this model never puts work on CUDA: no Tensor Core runs these layers where it
    # runs, so the alignment and precision advice is info, not a warning.
    cpu_only: bool = False

    def cost(self, spec: RuleSpec, key: str) -> str:
        """The figure ``spec``'s rule quotes under ``key`` for the target GPU, naming the GPU
        (:func:`tcaudit.costs.cost_note`)."""
        return cost_note(spec, self.settings.target, key)

    def display_path(self, path: str) -> str:
        source = self.sources.get(os.path.realpath(path))
        if source is not None:
            return source.display_path
        try:
            return os.path.relpath(path).replace(os.sep, "/") if not os.path.relpath(path).startswith("..") else path
        except ValueError:
            return path

    def line_text(self, path: str, line: int) -> str:
        source = self.sources.get(os.path.realpath(path))
        if source is not None:
            return source.line_text(line)
        return linecache.getline(path, line).rstrip("\n")

    def target_site(self) -> Site:
        """Where the model itself was constructed (or named, for a configured factory)."""
        from tcaudit.model.facts import Site  # the model package loads only where a model was audited

        target = self.facts.target
        construction = target.get("construction") or {}
        if self.facts.construction is not None and target.get("kind") == "factory":
            return self.facts.construction
        return Site(
            target.get("path", ""),
            int(construction.get("line", 1)),
            int(construction.get("column", 1)),
            int(construction.get("end_line", construction.get("line", 1))),
            int(construction.get("end_column", 0)),
        )

    def module_site(self, path: str | None) -> Site | None:
        """The construction line of a module, or of its nearest ancestor that has one."""
        while path is not None:
            module = self.facts.module(path)
            if module is not None and module.site is not None:
                return module.site
            if not path:
                break
            path = path.rpartition(".")[0]
        return None

    def op_site(self, op: OpFact) -> Site:
        """Where to report an op: the construction of the torch.nn layer that ran it; for code in the
        user's own forward (a matmul, a cast), the line that ran it."""
        module = self.facts.module(op.module)
        if module is not None and module.builtin and module.site is not None:
            return module.site
        if op.site is not None:
            return op.site
        return self.module_site(op.module) or self.target_site()


class ModelRule:
    """A check over one model's :class:`~tcaudit.model.facts.ModelFacts` (plain data from the audit child,
    never torch): the TC1 rules' half over what the model audit measured. The engine runs it
    (:func:`tcaudit.engine.run_model_audit`); a rule with a script half defines both classes in its module."""

    id: ClassVar[str]

    def __init__(self) -> None:
        self.spec: RuleSpec = load_catalog()[self.id]

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        raise NotImplementedError

    def severity_for(self, cost: Cost | None) -> Severity:
        """The catalog severity, lowered to info when the layer is under 1% of the model's FLOPs or
        runs within a kernel launch, fixed or not (a launch-bound step gains nothing from padding it)."""
        if cost is not None and cost.launch_bound:
            return Severity.INFO
        if cost is not None:
            share = cost.flop_share if cost.flop_share is not None else cost.time_share
            if share < MINOR_SHARE:
                return Severity.INFO
        return self.spec.severity

    def finding(
        self,
        context: ModelContext,
        site: Site,
        message: str,
        *,
        cost: Cost | None = None,
        severity: Severity | None = None,
        details: dict[str, Any] | None = None,
        explanation: str = "",
    ) -> Finding:
        path = context.display_path(site.path)
        end_line = site.end_line or site.line
        end_column = site.end_column if site.end_column else len(context.line_text(site.path, end_line)) + 1
        data: dict[str, Any] = {"model": context.facts.model_class or context.facts.target.get("label", "")}
        if details:
            data.update(details)
        if cost is not None:
            data.update(cost.details())
            data["cost_source"] = context.cost_model.source
        severity = severity if severity is not None else self.severity_for(cost)
        if context.cpu_only:
            severity = Severity.INFO
            data["script_uses_cuda"] = False
            explanation = " ".join(filter(None, (
                explanation, "Info: the script that builds this model never uses CUDA, so no GPU runs it there.")))
        return Finding(
            rule=self.id,
            name=self.spec.name,
            severity=severity,
            location=Location(path, site.line, site.column, end_line, max(end_column, 1)),
            message=message,
            details=data,
            source_line=context.line_text(site.path, site.line),
            scope=context.facts.model_class,
            explanation=explanation,
        )
