"""What a name written in one module of the project stands for in another: a function, a class, a
method, a module or a module-level constant, followed through imports, re-exports (``from .loss
import compute_loss`` in a package's ``__init__.py``) and the objects a script builds (``trainer =
Trainer(...)`` ... ``trainer.fit()`` is ``Trainer.fit`` of the module that defines it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import libcst as cst

from tcaudit.project.imports import module_file, search_roots, top_names
from tcaudit.project.modules import ProjectModule, load_module, module_of
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import full_name

Kind = Literal["function", "class", "method", "module", "constant"]
# How many re-exports and construction steps a lookup follows.
MAX_DEPTH = 6


@dataclass(frozen=True, eq=False)
class Symbol:
    """A definition in a project module: ``node`` is the ``def`` or ``class`` (None for a module; the
    assigned value for a constant); ``owner`` the class of a method."""

    module: ProjectModule
    kind: Kind
    name: str
    node: cst.CSTNode | None = field(default=None, repr=False)
    owner: cst.ClassDef | None = field(default=None, repr=False)

    @property
    def facts(self) -> ScriptFacts:
        return self.module.facts

    @property
    def function(self) -> cst.FunctionDef | None:
        return self.node if isinstance(self.node, cst.FunctionDef) else None

    @property
    def line(self) -> int:
        return self.facts.line_of(self.node) if self.node is not None else 1



class Project:
    """The project seen from one entry file: what its imports lead to inside the project."""

    def __init__(self, facts: ScriptFacts, root: Path | None) -> None:
        self.entry = facts
        path = facts.source.path
        self.roots = search_roots(path, root)
        self.root = root
        # ``callee``'s answers, by the ids of the facts and the call node asked about, with those two.
        self._callees: dict[tuple[int, int], tuple[ScriptFacts, cst.CSTNode, Symbol | None]] = {}

    # -- names ---------------------------------------------------------------------------------------
    def symbol(self, facts: ScriptFacts, dotted: str | None) -> Symbol | None:
        """What ``dotted`` (as written in ``facts``' module) names in another project module, or None
        (a builtin, a library, a name of the module itself)."""
        qual = facts.resolve(dotted) if dotted else None
        if qual is None:
            return None
        return self._lookup(facts.source.path, qual, 0)

    def _lookup(self, importer: Path, qual: str, depth: int) -> Symbol | None:
        if depth > MAX_DEPTH:
            return None
        dots = len(qual) - len(qual.lstrip("."))
        parts = qual[dots:].split(".") if qual[dots:] else []
        for cut in range(len(parts), -1, -1):
            module_name = "." * dots + ".".join(parts[:cut])
            if not module_name:
                continue
            path = module_file(self.roots, importer, module_name)
            if path is None:
                continue
            module = load_module(path)
            if module is None:
                return None
            names = parts[cut:]
            if not names:
                return Symbol(module, "module", module_name.lstrip(".") or module.path.stem)
            return self._member(module, names, depth)
        return None

    def _member(self, module: ProjectModule, names: list[str], depth: int) -> Symbol | None:
        head, rest = names[0], names[1:]
        node = module.definitions.get(head)
        if isinstance(node, cst.FunctionDef):
            return Symbol(module, "function", head, node) if not rest else None
        if isinstance(node, cst.ClassDef):
            if not rest:
                return Symbol(module, "class", head, node)
            if len(rest) == 1:
                return self.method(Symbol(module, "class", head, node), rest[0], depth + 1)
            return None
        # A name the module imports from elsewhere (a package re-exporting its submodules' functions).
        qual = module.facts.resolve(head)
        if qual is not None:
            return self._lookup(module.path, ".".join([qual, *rest]), depth + 1)
        bindings = [b for b in module.facts.bindings_of(head) if b.ctx is module.facts.module_frame]
        if len(bindings) == 1 and not rest:
            return Symbol(module, "constant", head, bindings[0].value)
        return None

    def method(self, cls: Symbol, name: str, depth: int = 0) -> Symbol | None:
        """``name`` of the class ``cls`` or of a project class it derives from."""
        node = cls.node
        if not isinstance(node, cst.ClassDef) or depth > MAX_DEPTH:
            return None
        for statement in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return Symbol(cls.module, "method", name, statement, node)
        for base in node.bases:
            dotted = full_name(base.value)
            parent = self._class_named(cls.module, dotted, depth + 1)
            if parent is not None:
                found = self.method(parent, name, depth + 1)
                if found is not None:
                    return found
        return None

    def _class_named(self, module: ProjectModule, dotted: str | None, depth: int) -> Symbol | None:
        if not dotted:
            return None
        node = module.definitions.get(dotted)
        if isinstance(node, cst.ClassDef):
            return Symbol(module, "class", dotted, node)
        found = self.symbol(module.facts, dotted) if depth <= MAX_DEPTH else None
        return found if found is not None and found.kind == "class" else None

    # -- calls ---------------------------------------------------------------------------------------
    def callee(self, facts: ScriptFacts, call: CallSite) -> Symbol | None:
        """The function or method of another project module that ``call`` (a call written in
        ``facts``' module) runs: ``compute_loss(...)`` imported from ``utils.loss``,
        ``utils.get_data(args)``, ``Trainer(...)``'s ``__init__``, ``trainer.fit()`` on an object the
        module built from a project class. None for anything else. (Asked of every call of a file by
        several rules: answered once per call.)"""
        key = (id(facts), id(call.node))
        kept = self._callees.get(key)
        if kept is None or kept[0] is not facts or kept[1] is not call.node:
            found = self._callee(facts, call) if self.may_reach(facts) or module_of(facts) is not None else None
            kept = self._callees[key] = (facts, call.node, found)
        return kept[2]

    def may_reach(self, facts: ScriptFacts) -> bool:
        """Whether an import of ``facts``' file may lead into the project: a relative one, or one whose first
        name is a module or package of a search root. Where none does (a single-file script), no call of the
        file runs another module's code (only a project module's own methods, which ``callee`` finds from
        the module itself)."""
        def reaches(made: ScriptFacts) -> bool:
            tops = frozenset().union(*(top_names(root) for root in self.roots))
            names = [site.qualname for site in made.imports] + list(made.star_imports)
            return any(n.startswith(".") or n.split(".")[0] in tops for n in names)

        return facts.derived(("may reach the project from", self.roots), reaches)

    def _callee(self, facts: ScriptFacts, call: CallSite) -> Symbol | None:
        found = self.symbol(facts, call.name)
        if found is not None:
            if found.kind == "class":
                return self.method(found, "__init__")
            return found if found.kind in ("function", "method") else None
        receiver = call.receiver_name
        method = call.method
        if receiver in ("self", "cls") and method is not None:
            return self._own_method(facts, call, method)
        if receiver is None or method is None or "." in receiver:
            return None
        built = self.built_class(facts, receiver)
        return self.method(built, method) if built is not None else None

    def _own_method(self, facts: ScriptFacts, call: CallSite, name: str) -> Symbol | None:
        """``self.name(...)`` inside a method of a class of a project module (one this project model
        parsed: its facts are the module's own), as that class's (or a project base class's) method."""
        cls = call.ctx.class_def
        if cls is None:
            return None
        module = module_of(facts)
        if module is None:
            return None  # a scanned file's own methods: the rules follow those themselves
        return self.method(Symbol(module, "class", cls.name.value, cls), name)

    def built_class(self, facts: ScriptFacts, name: str) -> Symbol | None:
        """The project class every visible value of ``name`` is an instance of (``trainer =
        Trainer(...)``), or None."""
        classes: list[Symbol] = []
        for binding in facts.bindings_of(name):
            value = binding.value
            if not isinstance(value, cst.Call):
                return None
            found = self.symbol(facts, full_name(value.func))
            if found is None or found.kind != "class":
                return None
            classes.append(found)
        if not classes or any(c.node is not classes[0].node for c in classes):
            return None
        return classes[0]


def project_of(facts: ScriptFacts, root: Path | None) -> Project:
    """The project seen from ``facts``' file, made once per file's facts."""
    return facts.derived(Project, lambda made: Project(made, root))
