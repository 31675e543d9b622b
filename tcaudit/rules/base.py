"""What a script rule is made of, and the registry that finds them.

One module per rule (``tcaudit/rules/tcNNN_name.py``) holds the rule's detection (a
:class:`ScriptRule`) and, where it has one, its fix (a :class:`Codemod`); ``rules/TCNNN.toml`` holds
its documentation and examples. The two halves meet through a typed :class:`FixPlan` per finding:
detection decides whether a fix is offered (or declined, and why) and which syntax nodes it edits;
the codemod only performs that edit. So ``scan`` promises exactly what ``fix`` does.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.catalog import RuleSpec, load_catalog
from tcaudit.findings import Finding, Fix, FixClass, FixPlan, Location, Severity
from tcaudit.rewrite.codemod import DeclineFix, FixContext
from tcaudit.rules.registry import triggers_under

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.model_profile import AuditedModels
    from tcaudit.script.facts import ScriptFacts

_RULE_MODULE = re.compile(r"^tc\d{3}_\w+$")


@dataclass(frozen=True)
class RuleContext:
    settings: "Settings"
    # What the model audit measured about the models this file builds; None where it did not run or
    # reach them (the rules then infer from the script's text).
    models: "AuditedModels | None" = None


class ScriptRule:
    """A check over one file's :class:`ScriptFacts`.

    ``triggers`` are regular expressions of which at least one must occur in the file's text for
    the rule to possibly fire; the engine skips parsing files that match no enabled rule's trigger.
    They must be necessary conditions (an alias still spells the imported name somewhere).
    """

    id: ClassVar[str]
    triggers: ClassVar[tuple[str, ...]] = ()
    # Triggers that replace ``triggers`` when ``fix`` may make a structural conversion (by its name):
    # a rule that speaks for what the conversion will bring needs less text.
    structural_triggers: ClassVar[dict[str, tuple[str, ...]]] = {}

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

    @staticmethod
    def planned_fix(
        fix_class: FixClass,
        description: str,
        plan: "Callable[[], FixPlan]",
        *,
        option: str | None = None,
    ) -> Fix:
        """A fix whose plan is made now: ``plan()`` returns what the fix will edit, or raises
        :class:`DeclineFix` with the reason it cannot be done safely (then the finding says so, and
        the situations the decline protects against are kept on the fix)."""
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
    ) -> Finding:
        start = facts.position(node)
        end = facts.position(end_node) if end_node is not None else start
        location = Location(
            path=facts.source.display_path,
            line=start.start.line,
            column=start.start.column + 1,
            end_line=end.end.line,
            end_column=end.end.column + 1,
        )
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
    # Within a round codemods run by (order, rule id). A global setting inserted after the imports
    # (TF32) runs first: a later fix in the same round (autocast) may silence the rule that asked for it.
    order: ClassVar[int] = 0

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        raise NotImplementedError


def _rule_modules():
    import tcaudit.rules as package

    for info in pkgutil.iter_modules(package.__path__):
        if _RULE_MODULE.match(info.name):
            yield importlib.import_module(f"tcaudit.rules.{info.name}")


def defined_in(module, base: type) -> list[type]:
    return [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, base) and value is not base
        and getattr(value, "__module__", None) == module.__name__
    ]


def discover_script_rules() -> dict[str, type[ScriptRule]]:
    """Every ``tcaudit/rules/tcNNN_*.py`` module's ScriptRule subclass, by rule id."""
    found: dict[str, type[ScriptRule]] = {}
    for module in _rule_modules():
        for value in defined_in(module, ScriptRule):
            if value.id in found:
                raise RuntimeError(f"two implementations of {value.id}")
            found[value.id] = value
    return found


def discover_codemods() -> dict[str, type[Codemod]]:
    """Every rule module's fix, by rule id; a fix lives in the module of the rule it fixes."""
    found: dict[str, type[Codemod]] = {}
    for module in _rule_modules():
        rules = {rule.id for rule in defined_in(module, ScriptRule)}
        for value in defined_in(module, Codemod):
            if value.rule not in rules:
                raise RuntimeError(f"{module.__name__}: the fix for {value.rule} must live in that rule's module")
            found[value.rule] = value
    return found


def dotted(node: cst.CSTNode | None) -> str | None:
    return get_full_name_for_node(node) if node is not None else None
