"""The one rule registry: it walks the wings (``tcaudit/rules/<wing>/tcNNN_*.py``) and finds script
rules, model rules and fixes alike (:func:`rule_modules`), and gives the engine the enabled script
rules, each imported only when a file's text needs it.

A rule module imports LibCST and the facts it checks; a scan that reads one trivial file, or only
files no trigger matches, needs none of them. So the engine starts from :data:`TRIGGER_TABLE`
(``tcaudit/rules/trigger_table.py``): each rule's module and its triggers, as plain data. The rule
module stays the one home of its triggers: the table is generated from the modules
(``python -m tcaudit.rules.registry --write``), and ``tests/test_rule_registry.py`` fails when the
two differ.

This module imports neither LibCST nor a rule module at import time.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Union

from tcaudit.rules.trigger_table import MODEL_RULE_TABLE, TRIGGER_TABLE
from tcaudit.source.triggers import all_of, all_of_parts, triggers_under

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.model_profile import AuditedModels
    from tcaudit.rules.base import Codemod, ModelRule, RuleContext, ScriptRule

# One trigger as the table stores it: a regex, or the parts of an ``all_of`` regex (so that the
# engine can check them part by part, as it does for the rule's own).
StoredTrigger = Union[str, "tuple[str, ...]"]


def _restore(stored: StoredTrigger) -> str:
    return all_of(*stored) if isinstance(stored, tuple) else stored


class LazyRule:
    """An enabled script rule known by its id and triggers; its module is imported, and the rule made
    and configured, the first time a file's triggers need it (:meth:`load`).

    ``triggers`` is None for a rule that decides in its own code whether a text may match (it
    overrides ``may_match`` or ``configure``): the engine loads it up front and asks it.
    """

    __slots__ = ("id", "module", "triggers", "helper_triggers", "settings", "_rule")

    def __init__(self, rule_id: str, module: str, triggers: tuple[str, ...] | None, settings: "Settings",
                 helper_triggers: tuple[str, ...] = ()) -> None:
        self.id = rule_id
        self.module = module
        self.triggers = triggers
        self.helper_triggers = helper_triggers
        self.settings = settings
        self._rule: "ScriptRule | None" = None

    @property
    def loaded(self) -> bool:
        return self._rule is not None

    def load(self) -> "ScriptRule":
        if self._rule is None:
            from tcaudit.rules.base import ScriptRule

            rule = rule_class(self.module, ScriptRule, self.id)()
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


def context(
    settings: "Settings", models: "AuditedModels | None" = None, unplanned: frozenset[str] = frozenset()
) -> "RuleContext":
    """A :class:`~tcaudit.rules.base.RuleContext` whose rules read their leaders through this registry."""
    from tcaudit.rules.base import RuleContext

    return RuleContext(settings, models, unplanned=unplanned, load_rule=load_rule)


def model_rules(settings: "Settings") -> "list[ModelRule]":
    """The model rules ``settings`` enables, made, sorted by id: only their modules are imported."""
    from tcaudit.rules.base import ModelRule

    enabled = set(settings.enabled_rules())
    return [rule_class(module, ModelRule, rule_id)() for rule_id, module in sorted(MODEL_RULE_TABLE.items())
            if rule_id in enabled]


def rule_class(module: str, base: type, rule_id: str) -> type:
    """The subclass of ``base`` implementing ``rule_id`` in rule module ``module`` (a table's entry:
    ``amp.tc201_missing_autocast``), imported now."""
    from tcaudit.rules.base import defined_in

    (cls,) = [c for c in defined_in(importlib.import_module(f"tcaudit.rules.{module}"), base) if c.id == rule_id]
    return cls


def lazy_rules(settings: "Settings") -> list[LazyRule]:
    """The rules ``settings`` enables, sorted by id, none imported yet (those whose triggers are code
    are loaded now)."""
    enabled = set(settings.enabled_rules())
    rules = []
    for rule_id, (module, triggers, structural, helper) in sorted(TRIGGER_TABLE.items()):
        if rule_id not in enabled:
            continue
        if triggers is None:
            rule = LazyRule(rule_id, module, None, settings)
            rule.load()
        else:
            restored = tuple(_restore(t) for t in triggers)
            by_option = {option: tuple(_restore(t) for t in patterns) for option, patterns in structural.items()}
            rule = LazyRule(rule_id, module, triggers_under(restored, by_option, settings.structural_fixes), settings,
                            tuple(_restore(t) for t in helper))
        rules.append(rule)
    return rules


def any_helper_trigger(text: str) -> bool:
    """Whether a rule's ``helper_triggers`` occur in ``text``: then what the rules say about the file
    may depend on the project's training scripts that import it (the scan cache's key holds them)."""
    return any(re.search(pattern, text) for pattern in _helper_patterns())


@functools.lru_cache(maxsize=1)
def _helper_patterns() -> tuple[str, ...]:
    patterns = {_restore(t) for _, _, _, helper in TRIGGER_TABLE.values() for t in helper}
    return tuple(sorted(patterns))


# -- the rule modules, found in the wings -------------------------------------------------------------
RULE_MODULE = re.compile(r"^tc\d{3}_\w+$")


def rule_modules():
    """Every rule module (``tcaudit/rules/<wing>/tcNNN_*.py``), imported: the one walk over the wings
    that finds script rules, model rules and fixes alike."""
    import tcaudit.rules as package

    for info in pkgutil.walk_packages(package.__path__, prefix="tcaudit.rules."):
        if not info.ispkg and RULE_MODULE.match(info.name.rpartition(".")[2]):
            yield importlib.import_module(info.name)


def _by_id(base: type) -> dict[str, type]:
    """Every rule module's subclass of ``base`` (a rule base class), by rule id: one per id."""
    from tcaudit.rules.base import defined_in

    found: dict[str, type] = {}
    for module in rule_modules():
        for value in defined_in(module, base):
            if value.id in found:
                raise RuntimeError(f"two implementations of {value.id}")
            found[value.id] = value
    return found


def discover_script_rules() -> "dict[str, type[ScriptRule]]":
    """Every rule module's :class:`~tcaudit.rules.base.ScriptRule` subclass, by rule id."""
    from tcaudit.rules.base import ScriptRule

    return _by_id(ScriptRule)


def discover_codemods() -> "dict[str, type[Codemod]]":
    """Every rule module's fix, by rule id; a fix lives in the module of the rule it fixes."""
    from tcaudit.rules.base import Codemod, ScriptRule, defined_in

    found: dict[str, type[Codemod]] = {}
    for module in rule_modules():
        rules = {rule.id for rule in defined_in(module, ScriptRule)}
        for value in defined_in(module, Codemod):
            if value.rule not in rules:
                raise RuntimeError(f"{module.__name__}: the fix for {value.rule} must live in that rule's module")
            found[value.rule] = value
    return found


def discover_model_rules() -> "dict[str, type[ModelRule]]":
    """Every rule module's :class:`~tcaudit.rules.base.ModelRule` subclass (the TC1 rules' halves over
    the model audit's facts), by rule id."""
    from tcaudit.rules.base import ModelRule

    return _by_id(ModelRule)


# -- the table, generated from the rule modules ------------------------------------------------------
def _stored(pattern: str) -> StoredTrigger:
    parts = all_of_parts(pattern)
    return parts if parts is not None else pattern


def build_table() -> dict[str, tuple[str, tuple[StoredTrigger, ...] | None, dict[str, tuple[StoredTrigger, ...]],
                                     tuple[StoredTrigger, ...]]]:
    """What :data:`TRIGGER_TABLE` must hold, read from the rule modules (imports them all)."""
    from tcaudit.rules.base import ScriptRule

    table = {}
    for rule_id, cls in sorted(discover_script_rules().items()):
        module = cls.__module__.removeprefix("tcaudit.rules.")
        own_code = cls.may_match is not ScriptRule.may_match or cls.configure is not ScriptRule.configure
        if own_code:
            table[rule_id] = (module, None, {}, ())
            continue
        structural = {
            option: tuple(_stored(p) for p in patterns) for option, patterns in sorted(cls.structural_triggers.items())
        }
        table[rule_id] = (module, tuple(_stored(p) for p in cls.triggers), structural,
                          tuple(_stored(p) for p in cls.helper_triggers))
    return table


TABLE_PATH = Path(__file__).with_name("trigger_table.py")
TABLE_HEADER = '''"""Each script rule's module and triggers, for the engine to import a rule only when a file needs it,
and each model rule's module.

Generated from the rule modules (their ``triggers``, ``structural_triggers`` and ``helper_triggers``) by
``python -m tcaudit.rules.registry --write``; do not edit. tests/test_rule_registry.py fails when
this differs from what the modules declare. A trigger is a regex, or a tuple of the regexes that
``all_of`` joined; ``None`` means the rule decides in its own code (it is imported up front). Each
entry: (module, triggers, structural triggers by option, helper triggers).
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


def build_model_table() -> dict[str, str]:
    """What :data:`MODEL_RULE_TABLE` must hold: each model rule's module (imports them all)."""
    return {rule_id: cls.__module__.removeprefix("tcaudit.rules.") for rule_id, cls in sorted(discover_model_rules().items())}


def render_table(table: dict | None = None, model_table: dict | None = None) -> str:
    table = build_table() if table is None else table
    model_table = build_model_table() if model_table is None else model_table
    lines = [TABLE_HEADER.rstrip("\n"), "", "TRIGGER_TABLE = {"]
    for rule_id, (module, triggers, structural, helper) in table.items():
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
        if helper:
            lines.append("        (" + "".join(f"{_trigger_literal(p)}, " for p in helper).rstrip() + "),")
        else:
            lines.append("        (),")
        lines.append("    ),")
    lines.append("}")
    lines += ["", "# Each model rule's module (the TC1 rules' halves over the model audit's facts).", "MODEL_RULE_TABLE = {"]
    lines.extend(f'    "{rule_id}": "{module}",' for rule_id, module in model_table.items())
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- what the analysis reads of a text, for the editor's inert edits (tcaudit/source/inert.py) ---------

TEXT_TABLE_PATH = Path(__file__).with_name("text_table.py")
# The packages whose code reads a script's text: what the code is, the project, the rules.
_READERS = ("script", "project", "rules")
_RE_CALLS = frozenset({"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split"})
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
TEXT_TABLE_HEADER = '''"""What the script analysis reads of a text by pattern or by name, for the editor to tell an edit
that no rule can notice (tcaudit/source/inert.py): an edit whose changed lines match a pattern or hold
a word of these is analysed again.

Generated from the code of tcaudit/script, tcaudit/project and tcaudit/rules by
``python -m tcaudit.rules.registry --write``; do not edit (tests/test_rule_registry.py checks it).
``TEXT_PATTERNS``: every regular expression the analysis compiles or searches with (its source, and
``re`` flags as an int where given as ``re.X`` names); ``TEXT_WORDS``: every word-like string constant of
that code (a name a rule compares with, a key it reads); ``TEXT_PIECES``: the other short strings it
looks for in text with ``in``.
"""
'''


def build_text_table() -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """(patterns, words, pieces) read from the analysis's code (its syntax, nothing imported)."""
    import ast

    package = Path(__file__).resolve().parent.parent
    patterns: set[tuple[str, int]] = set()
    words: set[str] = set()
    pieces: set[str] = set()
    for folder in _READERS:
        for path in sorted((package / folder).rglob("*.py")):
            if path.name in ("trigger_table.py", "text_table.py", "registry.py"):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip: set[int] = set()
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    body = node.body
                    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                        skip.add(id(body[0].value))  # a docstring
                elif isinstance(node, ast.JoinedStr):
                    skip.update(id(part) for part in node.values)  # a message's pieces
                elif isinstance(node, ast.Call):
                    func = node.func
                    if (isinstance(func, ast.Attribute) and func.attr in _RE_CALLS and isinstance(func.value, ast.Name)
                            and func.value.id == "re" and node.args and isinstance(node.args[0], ast.Constant)
                            and isinstance(node.args[0].value, str)):
                        patterns.add((node.args[0].value, _flags(node)))
                        skip.add(id(node.args[0]))
                elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and isinstance(
                        node.left.value, str) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                    pieces.add(node.left.value)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    if _IDENTIFIER.fullmatch(node.value):
                        words.add(node.value)
                    else:  # dotted names and the like ("torch.cuda.amp", ".backward"): their words
                        if len(node.value) <= 80 and " " not in node.value.strip():
                            words.update(_IDENTIFIER.findall(node.value))
    for _rule_id, (_module, triggers, structural, helper) in build_table().items():
        stored = [*(triggers or ()), *(p for ps in structural.values() for p in ps), *helper]
        for trigger in stored:
            for part in (trigger if isinstance(trigger, tuple) else (trigger,)):
                patterns.add((part, 0))
    # Patterns and pieces that match any line of code (``\w+``, ``" "``) split names or text; they tell
    # nothing apart, so an edit matching them says nothing: left out.
    patterns = {(p, f) for p, f in patterns if not re.search(p, _ANY_CODE, f)}
    pieces = {piece for piece in pieces if piece not in _ANY_CODE}
    return sorted(patterns), sorted(words), sorted(pieces)


# A line of code no rule reads anything in: fresh names, numbers, arithmetic, a comment.
_ANY_CODE = "    zq0 = (zq1 + 2) * -zq2 / 3.5  # zq3: zq4, zq5.\n"


def _flags(call) -> int:
    """The ``re`` flags a call passes as ``re.I | re.M`` names (0 where none, or not by name)."""
    import ast

    value = 0
    for node in [*call.args[1:], *(k.value for k in call.keywords if k.arg == "flags")]:
        for name in ast.walk(node):
            if isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name) and name.value.id == "re":
                value |= int(getattr(re, name.attr, 0))
    return value


def render_text_table(table: tuple | None = None) -> str:
    patterns, words, pieces = build_text_table() if table is None else table
    lines = [TEXT_TABLE_HEADER.rstrip("\n"), "", "TEXT_PATTERNS = ("]
    lines.extend(f"    ({_literal(pattern)}, {flags})," for pattern, flags in patterns)
    lines += [")", "", "TEXT_WORDS = frozenset({"]
    lines.extend(f"    {word!r}," for word in words)
    lines += ["})", "", "TEXT_PIECES = ("]
    lines.extend(f"    {piece!r}," for piece in pieces)
    lines.append(")")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    expected = {TABLE_PATH: render_table(), TEXT_TABLE_PATH: render_text_table()}
    if argv == ["--write"]:
        for path, text in expected.items():
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    if argv == ["--check"]:
        stale = [path for path, text in expected.items() if not path.exists() or path.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"{path} is out of date: run python -m tcaudit.rules.registry --write", file=sys.stderr)
        return 1 if stale else 0
    print("usage: python -m tcaudit.rules.registry --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
