"""The enabled script rules, each imported only when a file's text needs it.

A rule module imports LibCST and the facts it checks; a scan that reads one trivial file, or only
files no trigger matches, needs none of them. So the engine starts from :data:`TRIGGER_TABLE`
(``tcaudit/rules/trigger_table.py``): each rule's module and its triggers, as plain data. The rule
module stays the one home of its triggers: the table is generated from the modules
(``python -m tcaudit.rules.registry --write``), and ``tests/test_rule_registry.py`` fails when the
two differ.

This module imports neither LibCST nor a rule module at import time.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Union

from tcaudit.rules.trigger_table import TRIGGER_TABLE
from tcaudit.source.triggers import all_of, all_of_parts

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.rules.base import ScriptRule

# One trigger as the table stores it: a regex, or the parts of an ``all_of`` regex (so that the
# engine can check them part by part, as it does for the rule's own).
StoredTrigger = Union[str, "tuple[str, ...]"]


def triggers_under(
    triggers: tuple[str, ...], structural_triggers: dict[str, tuple[str, ...]], structural_fixes: Iterable[str]
) -> tuple[str, ...]:
    """A rule's triggers under the structural conversions ``fix`` may make: each conversion the rule
    names in ``structural_triggers`` replaces ``triggers`` with its own (several are OR-ed)."""
    replaced = [pattern for option in sorted(set(structural_fixes)) for pattern in structural_triggers.get(option, ())]
    return tuple(replaced) if replaced else triggers


def _restore(stored: StoredTrigger) -> str:
    return all_of(*stored) if isinstance(stored, tuple) else stored


class LazyRule:
    """An enabled script rule known by its id and triggers; its module is imported, and the rule made
    and configured, the first time a file's triggers need it (:meth:`load`).

    ``triggers`` is None for a rule that decides in its own code whether a text may match (it
    overrides ``may_match`` or ``configure``): the engine loads it up front and asks it.
    """

    __slots__ = ("id", "module", "triggers", "settings", "_rule")

    def __init__(self, rule_id: str, module: str, triggers: tuple[str, ...] | None, settings: "Settings") -> None:
        self.id = rule_id
        self.module = module
        self.triggers = triggers
        self.settings = settings
        self._rule: "ScriptRule | None" = None

    @property
    def loaded(self) -> bool:
        return self._rule is not None

    def load(self) -> "ScriptRule":
        if self._rule is None:
            from tcaudit.rules.base import ScriptRule, defined_in

            module = importlib.import_module(f"tcaudit.rules.{self.module}")
            (cls,) = [c for c in defined_in(module, ScriptRule) if c.id == self.id]
            rule = cls()
            rule.configure(self.settings)
            self._rule = rule
        return self._rule

    def __repr__(self) -> str:
        return f"LazyRule({self.id}, {'loaded' if self.loaded else 'not loaded'})"


_LOADED: dict[str, tuple["Settings", "ScriptRule"]] = {}


def has_script_rule(rule_id: str) -> bool:
    """Whether ``rule_id`` has a script rule (the model audit's TC1 rules mostly do not)."""
    return rule_id in TRIGGER_TABLE


def load_rule(rule_id: str, settings: "Settings") -> "ScriptRule":
    """Rule ``rule_id``, made and configured for ``settings`` (kept for the last settings asked): for a
    rule that reads another's outcome (``RuleContext.findings_of``) without importing its module."""
    held = _LOADED.get(rule_id)
    if held is None or held[0] is not settings:
        module = TRIGGER_TABLE[rule_id][0]
        held = _LOADED[rule_id] = (settings, LazyRule(rule_id, module, None, settings).load())
    return held[1]


def lazy_rules(settings: "Settings") -> list[LazyRule]:
    """The rules ``settings`` enables, sorted by id, none imported yet (those whose triggers are code
    are loaded now)."""
    enabled = set(settings.enabled_rules())
    rules = []
    for rule_id, (module, triggers, structural) in sorted(TRIGGER_TABLE.items()):
        if rule_id not in enabled:
            continue
        if triggers is None:
            rule = LazyRule(rule_id, module, None, settings)
            rule.load()
        else:
            restored = tuple(_restore(t) for t in triggers)
            by_option = {option: tuple(_restore(t) for t in patterns) for option, patterns in structural.items()}
            rule = LazyRule(rule_id, module, triggers_under(restored, by_option, settings.structural_fixes), settings)
        rules.append(rule)
    return rules


# -- the table, generated from the rule modules ------------------------------------------------------
def _stored(pattern: str) -> StoredTrigger:
    parts = all_of_parts(pattern)
    return parts if parts is not None else pattern


def build_table() -> dict[str, tuple[str, tuple[StoredTrigger, ...] | None, dict[str, tuple[StoredTrigger, ...]]]]:
    """What :data:`TRIGGER_TABLE` must hold, read from the rule modules (imports them all)."""
    from tcaudit.rules.base import ScriptRule, discover_script_rules

    table = {}
    for rule_id, cls in sorted(discover_script_rules().items()):
        module = cls.__module__.rpartition(".")[2]
        own_code = cls.may_match is not ScriptRule.may_match or cls.configure is not ScriptRule.configure
        if own_code:
            table[rule_id] = (module, None, {})
            continue
        structural = {
            option: tuple(_stored(p) for p in patterns) for option, patterns in sorted(cls.structural_triggers.items())
        }
        table[rule_id] = (module, tuple(_stored(p) for p in cls.triggers), structural)
    return table


TABLE_PATH = Path(__file__).with_name("trigger_table.py")
TABLE_HEADER = '''"""Each script rule's module and triggers, for the engine to import a rule only when a file needs it.

Generated from the rule modules (their ``triggers`` and ``structural_triggers``) by
``python -m tcaudit.rules.registry --write``; do not edit. tests/test_rule_registry.py fails when
this differs from what the modules declare. A trigger is a regex, or a tuple of the regexes that
``all_of`` joined; ``None`` means the rule decides in its own code (it is imported up front).
"""

'''


def _literal(text: str) -> str:
    """``text`` as Python source, a raw string where that can spell it (regexes read better so)."""
    if text.isprintable() and '"' not in text and not text.endswith("\\"):
        return f'r"{text}"'
    return repr(text)


def _trigger_literal(stored: StoredTrigger) -> str:
    if isinstance(stored, tuple):
        return "(" + ", ".join(_literal(part) for part in stored) + ("," if len(stored) == 1 else "") + ")"
    return _literal(stored)


def render_table(table: dict | None = None) -> str:
    table = build_table() if table is None else table
    lines = [TABLE_HEADER.rstrip("\n"), "", "TRIGGER_TABLE = {"]
    for rule_id, (module, triggers, structural) in table.items():
        lines.append(f'    "{rule_id}": (')
        lines.append(f'        "{module}",')
        if triggers is None:
            lines.append("        None,")
        else:
            lines.append("        (")
            lines.extend(f"            {_trigger_literal(trigger)}," for trigger in triggers)
            lines.append("        ),")
        if structural:
            lines.append("        {")
            for option, patterns in structural.items():
                rendered = "".join(f"{_trigger_literal(p)}, " for p in patterns).rstrip()
                lines.append(f'            "{option}": ({rendered}),')
            lines.append("        },")
        else:
            lines.append("        {},")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    expected = render_table()
    if argv == ["--write"]:
        TABLE_PATH.write_text(expected, encoding="utf-8")
        print(f"wrote {TABLE_PATH}")
        return 0
    if argv == ["--check"]:
        if TABLE_PATH.read_text(encoding="utf-8") == expected:
            return 0
        print(f"{TABLE_PATH} is out of date: run python -m tcaudit.rules.registry --write", file=sys.stderr)
        return 1
    print("usage: python -m tcaudit.rules.registry --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
