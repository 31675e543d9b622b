"""The modules of a project, each read and parsed once per process (and again only when its file
changes): what :mod:`tcaudit.project.symbols` looks names up in."""

from __future__ import annotations

import functools
import hashlib
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from tcaudit.project.imports import MAX_MODULE_BYTES, stat_key
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.discovery import display_path
from tcaudit.source.errors import SourceError
from tcaudit.source.parsing import SourceFile, read_source


@dataclass(eq=False)
class ProjectModule:
    """One module of the project, read and parsed (``facts``: the same facts the rules read of a
    scanned file)."""

    path: Path  # resolved
    source: SourceFile = field(repr=False)
    digest: str

    @functools.cached_property
    def facts(self) -> ScriptFacts:
        facts = ScriptFacts(self.source)
        _BY_FACTS[id(facts)] = self
        return facts

    @functools.cached_property
    def definitions(self) -> dict[str, cst.FunctionDef | cst.ClassDef]:
        """Module-level functions and classes by name (the last definition of a name wins, as at run time)."""
        out: dict[str, cst.FunctionDef | cst.ClassDef] = {}
        for statement in self.source.module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                out[statement.name.value] = statement
        return out

    @property
    def display_path(self) -> str:
        return self.source.display_path


@dataclass
class _Entry:
    key: tuple
    module: ProjectModule | None


_MODULES: dict[Path, _Entry] = {}
# Each module by the identity of its facts (weakly: a module read again replaces its entry).
_BY_FACTS: "weakref.WeakValueDictionary[int, ProjectModule]" = weakref.WeakValueDictionary()


def module_of(facts: ScriptFacts) -> ProjectModule | None:
    """The project module whose facts ``facts`` are; None for other facts (a scanned file's own, an
    editor buffer's), without reading anything."""
    module = _BY_FACTS.get(id(facts))
    return module if module is not None and module.__dict__.get("facts") is facts else None
_STATS = {"parsed": 0, "reused": 0}


def load_module(path: Path) -> ProjectModule | None:
    """The project module at ``path`` (resolved), parsed once per process and again only when the
    file changed (its modification time, size or inode); None when it cannot be read or parsed
    (the scan of that file, if it is scanned, says why)."""
    stat = stat_key(path)
    if stat is None:
        _MODULES.pop(path, None)
        return None
    # The working folder too: reports name the module relative to it.
    key = (*stat, os.getcwd())
    cached = _MODULES.get(path)
    if cached is not None and cached.key == key:
        _STATS["reused"] += 1
        return cached.module
    module = None
    if stat[1] <= MAX_MODULE_BYTES:
        try:
            source = read_source(path, display_path(path))
            source.module  # parse now: a module that does not parse is no module of the project model
            module = ProjectModule(path, source, hashlib.sha256(source.raw).hexdigest())
        except (SourceError, RecursionError, MemoryError, ValueError):
            module = None
    _STATS["parsed"] += 1
    _MODULES[path] = _Entry(key, module)
    return module


def parse_counts() -> dict[str, int]:
    """How many project modules this process parsed and how many times it reused one (for tests and
    the benchmark)."""
    return dict(_STATS)


def forget_modules() -> None:
    from tcaudit.project.imports import forget_imports

    _MODULES.clear()
    forget_imports()
    _STATS.update(parsed=0, reused=0)


