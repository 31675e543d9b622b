"""The base class every script rule derives from, and the registry that finds them."""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.catalog import RuleSpec, load_catalog
from tcaudit.findings import Finding, Fix, Location, Severity

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.script.facts import ScriptFacts

_RULE_MODULE = re.compile(r"^tc\d{3}_\w+$")


@dataclass(frozen=True)
class RuleContext:
    settings: "Settings"


class ScriptRule:
    """A check over one file's :class:`ScriptFacts`.

    ``triggers`` are regular expressions of which at least one must occur in the file's text for
    the rule to possibly fire; the engine skips parsing files that match no enabled rule's trigger.
    They must be necessary conditions (an alias still spells the imported name somewhere).
    """

    id: ClassVar[str]
    triggers: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.spec: RuleSpec = load_catalog()[self.id]
        self._trigger_res = [re.compile(t) for t in self.triggers]

    def may_match(self, text: str) -> bool:
        return not self._trigger_res or any(t.search(text) for t in self._trigger_res)

    def check(self, facts: "ScriptFacts", context: RuleContext) -> Iterator[Finding]:
        raise NotImplementedError

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


def discover_script_rules() -> dict[str, type[ScriptRule]]:
    """Every ``tcaudit/script/tcNNN_*.py`` module's ScriptRule subclass, by rule id."""
    import tcaudit.script as package

    found: dict[str, type[ScriptRule]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not _RULE_MODULE.match(info.name):
            continue
        module = importlib.import_module(f"tcaudit.script.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ScriptRule) and value is not ScriptRule:
                if getattr(value, "__module__", None) == module.__name__:
                    if value.id in found:
                        raise RuntimeError(f"two implementations of {value.id}")
                    found[value.id] = value
    return found


def dotted(node: cst.CSTNode | None) -> str | None:
    return get_full_name_for_node(node) if node is not None else None
