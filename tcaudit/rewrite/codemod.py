"""What every fix is built from: statement-level edits, parsing helpers, imports, and the
exception a fix raises when, looking closely, it cannot edit safely."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import libcst as cst

from tcaudit.config import Settings
from tcaudit.findings import DeclineFix
from tcaudit.script.facts import ScriptFacts


@dataclass
class FixContext:
    facts: ScriptFacts
    settings: Settings
    notes: list[str] = field(default_factory=list)


# -- statement-level editing --------------------------------------------------------------------


class StatementEditor(cst.CSTTransformer):
    """Insert statements before/after, replace or remove statements, found by identity.

    Works on any block (module body, indented block) so codemods can say "put this before that
    statement" without caring where it sits.
    """

    # Whether ``apply`` may visit only the statements that hold an edited node: set by a class whose
    # hooks change nothing but the nodes ``targets`` names (not inherited: a subclass with hooks of
    # its own is visited whole).
    targeted_visit = True

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[int, list[cst.BaseStatement]] = {}
        self.after: dict[int, list[cst.BaseStatement]] = {}
        self.replace: dict[int, list[cst.BaseStatement]] = {}

    def targets(self) -> set[int]:
        """The ids of the nodes this editor changes (statements it inserts at, replaces or removes)."""
        return {*self.before, *self.after, *self.replace}

    def apply(self, module: cst.Module) -> cst.Module:
        """``module.visit(self)``. An editor whose class sets ``targeted_visit`` visits only the
        module-level statements that hold a node it edits: the others would come out as they went in,
        and LibCST rebuilds every node it visits (a second or more per edit on a 2,000-line file)."""
        if not type(self).__dict__.get("targeted_visit"):
            return module.visit(self)
        from tcaudit.source.walk import walk

        wanted = self.targets()
        updated = []
        for statement in module.body:
            finder = _Holds(wanted)
            walk(statement, finder)
            updated.append(statement.visit(self) if finder.found else statement)
        return module.with_changes(body=self._rebuild(module.body, updated))

    def insert_before(self, target: cst.CSTNode, statements: Iterable[cst.BaseStatement]) -> None:
        self.before.setdefault(id(target), []).extend(statements)

    def insert_after(self, target: cst.CSTNode, statements: Iterable[cst.BaseStatement]) -> None:
        self.after.setdefault(id(target), []).extend(statements)

    def replace_with(self, target: cst.CSTNode, statements: Iterable[cst.BaseStatement]) -> None:
        self.replace[id(target)] = list(statements)

    def remove(self, target: cst.CSTNode) -> None:
        self.replace[id(target)] = []

    def _rebuild(self, original_body: Sequence[cst.CSTNode], updated_body: Sequence[cst.CSTNode]) -> list:
        out: list = []
        orphaned: list[cst.EmptyLine] = []  # blank lines and comments of removed statements
        if len(original_body) != len(updated_body):
            # A hook returned a FlattenSentinel or RemovalSentinel: pairing the statements would drop
            # or misplace the others. Edits go through before/after/replace instead.
            raise DeclineFix("internal error: a statement edit changed its block's length; nothing was rewritten")
        for original, updated in zip(original_body, updated_body):
            key = id(original)
            produced = list(self.before.get(key, []))
            if key in self.replace:
                replacement = list(self.replace[key])
                if not replacement and getattr(updated, "leading_lines", None):
                    orphaned.extend(updated.leading_lines)
                produced.extend(replacement)
            else:
                produced.append(updated)
            produced.extend(self.after.get(key, []))
            if orphaned and produced and hasattr(produced[0], "leading_lines"):
                produced[0] = produced[0].with_changes(leading_lines=[*orphaned, *produced[0].leading_lines])
                orphaned = []
            out.extend(produced)
        return out

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._rebuild(original_node.body, updated_node.body))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = self._rebuild(original_node.body, updated_node.body)
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return updated_node.with_changes(body=body)


class _Holds(cst.CSTVisitor):
    """Whether a tree holds one of the nodes ``wanted`` names (by id); stops at the first."""

    def __init__(self, wanted: set[int]) -> None:
        super().__init__()
        self.wanted = wanted
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found or id(node) in self.wanted:
            self.found = True
            return False
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        return None


class LoopWrapper(cst.CSTTransformer):
    """Puts loops, found by identity, under a ``with`` of the given context expression (``with
    torch.no_grad():``, ``with model.join():``); the comments and blank lines above a loop go above the
    ``with``."""

    def __init__(self, targets: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.targets = targets

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.BaseStatement:
        return self._wrap(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.BaseStatement:
        return self._wrap(original_node, updated_node)

    def _wrap(self, original_node: cst.For | cst.While, updated_node: cst.For | cst.While) -> cst.BaseStatement:
        context_expr = self.targets.get(id(original_node))
        if context_expr is None:
            return updated_node
        return cst.With(
            items=[cst.WithItem(context_expr)],
            body=cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])]),
            leading_lines=updated_node.leading_lines,
        )


def unique_name(facts: ScriptFacts, base: str, taken: Iterable[str] = ()) -> str:
    """``base``, or ``base2``, ``base3``...: the first that no binding or import of the file (nor
    ``taken``, the names an edit already chose) uses."""
    used = {b.target for b in facts.bindings} | {site.local for site in facts.imports} | set(taken)
    name, index = base, 2
    while name in used:
        name, index = f"{base}{index}", index + 1
    return name


def parse_statement(code: str, module: cst.Module) -> cst.BaseStatement:
    return cst.parse_statement(code, config=module.config_for_parsing)


def parse_expression(code: str, module: cst.Module) -> cst.BaseExpression:
    return cst.parse_expression(code, config=module.config_for_parsing)


def ensure_import(module: cst.Module, statement: str) -> cst.Module:
    """Add ``import X`` / ``from X import Y`` after the last top-level import unless an equal
    statement already exists anywhere at top level."""
    new = parse_statement(statement, module)
    code = module.code_for_node(new).strip()
    last_import = -1
    for index, item in enumerate(module.body):
        if isinstance(item, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in item.body
        ):
            if module.code_for_node(item).strip() == code:
                return module
            last_import = index
        elif last_import == -1 and _is_docstring_or_future(item):
            continue
    body = list(module.body)
    position = last_import + 1 if last_import >= 0 else _after_docstring(module)
    body.insert(position, new)
    return module.with_changes(body=body)


def _is_docstring_or_future(item: cst.CSTNode) -> bool:
    if isinstance(item, cst.SimpleStatementLine) and len(item.body) == 1:
        small = item.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
            return True
        if isinstance(small, cst.ImportFrom) and getattr(small.module, "value", None) == "__future__":
            return True
    return False


def _after_docstring(module: cst.Module) -> int:
    index = 0
    while index < len(module.body) and _is_docstring_or_future(module.body[index]):
        index += 1
    return index


def torch_import_name(facts: ScriptFacts) -> str | None:
    """The local name bound to the ``torch`` module itself, if the file imports it."""
    for site in facts.imports:
        if site.qualname == "torch" and site.ctx is facts.module_frame:
            return site.local
    return None
