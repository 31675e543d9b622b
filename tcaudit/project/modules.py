"""The modules of a project: where an import of a training script leads inside the project, each such
module read and parsed once per process (and again only when its file changes), and which files a
script depends on (for the scan cache: a changed imported module invalidates the scripts that import
it).

Python's own rules, as far as a scanner can follow them without running anything: an absolute import
is looked up beside the entry script (``sys.path[0]``), then at the project root and in its ``src/``
folder; a relative import from the importing module's package. A module under ``site-packages`` or
``dist-packages``, in a virtual environment, or outside those folders is not the project's: the
project model stops there (a library's code is the library's business, and its size is unbounded).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from tcaudit.script.facts import ScriptFacts
from tcaudit.source.errors import SourceError
from tcaudit.source.discovery import display_path
from tcaudit.source.parsing import SourceFile, read_source

# Folders whose modules are never the project's: installed packages and virtual environments.
_NOT_PROJECT = frozenset({"site-packages", "dist-packages", ".venv", "venv", ".tox", ".nox", "node_modules", "__pycache__"})
# A project module larger than this is not followed (generated code, vendored data as Python).
MAX_MODULE_BYTES = 2_000_000
# How many modules one scan follows from one entry file at most (a monorepo's whole tree is not read).
MAX_MODULES = 200


def is_project_file(path: Path) -> bool:
    return not any(part in _NOT_PROJECT for part in path.parts)


def search_roots(entry: Path, root: Path | None) -> tuple[Path, ...]:
    """Where an absolute import of ``entry`` is looked up: its own folder, then the project root and
    the root's ``src/`` (a ``src/`` layout), in that order."""
    out: list[Path] = []
    for folder in (entry.parent, root, root / "src" if root is not None else None):
        if folder is None:
            continue
        try:
            resolved = folder.resolve()
        except (OSError, RuntimeError):
            continue
        if resolved not in out and resolved.is_dir():
            out.append(resolved)
    return tuple(out)


def module_file(roots: tuple[Path, ...], importer: Path, dotted: str) -> Path | None:
    """The project file an import of ``dotted`` from ``importer`` loads (``.pkg.mod``: relative to
    ``importer``'s package), or None when it is not a project module."""
    if dotted.startswith("."):
        level = len(dotted) - len(dotted.lstrip("."))
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        rest = dotted.lstrip(".")
        parts = rest.split(".") if rest else []
        bases: tuple[Path, ...] = (base,)
    else:
        parts = dotted.split(".")
        bases = roots
    for base in bases:
        target = base.joinpath(*parts)
        candidates = ([target.with_name(target.name + ".py")] if parts else []) + [target / "__init__.py"]
        for candidate in candidates:
            try:
                if candidate.is_file() and is_project_file(candidate):
                    return candidate.resolve()
            except OSError:
                continue
    return None


@dataclass(eq=False)
class ProjectModule:
    """One module of the project, read and parsed (``facts``: the same facts the rules read of a
    scanned file)."""

    path: Path  # resolved
    source: SourceFile = field(repr=False)
    digest: str

    @functools.cached_property
    def facts(self) -> ScriptFacts:
        return ScriptFacts(self.source)

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
    key: tuple[int, int, int]
    module: ProjectModule | None


_MODULES: dict[Path, _Entry] = {}
_STATS = {"parsed": 0, "reused": 0}


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


def load_module(path: Path) -> ProjectModule | None:
    """The project module at ``path`` (resolved), parsed once per process and again only when the
    file changed (its modification time, size or inode); None when it cannot be read or parsed
    (the scan of that file, if it is scanned, says why)."""
    key = _stat_key(path)
    if key is None:
        _MODULES.pop(path, None)
        return None
    cached = _MODULES.get(path)
    if cached is not None and cached.key == key:
        _STATS["reused"] += 1
        return cached.module
    module = None
    if key[1] <= MAX_MODULE_BYTES:
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
    _MODULES.clear()
    _STATS.update(parsed=0, reused=0)


def imported_names(text: str) -> list[str]:
    """Every module an ``import`` statement of ``text`` names, with its leading dots for a relative
    import, and ``pkg.name`` for ``from pkg import name`` (which may be a submodule). Python's own
    parser: cheap, and enough to list dependencies."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.append(base)
            for alias in node.names:
                if alias.name != "*":
                    out.append(f"{base}.{alias.name}" if base and not base.endswith(".") else f"{base}{alias.name}")
    return out


@dataclass
class Dependencies:
    files: list[Path] = field(default_factory=list)

    @property
    def digest(self) -> str:
        """One digest of the dependencies' paths and contents (changes when any of them does)."""
        hasher = hashlib.sha256()
        for path in self.files:
            hasher.update(os.fsencode(path))
            module = load_module(path)
            hasher.update((module.digest if module is not None else "unreadable").encode())
        return hasher.hexdigest()


def dependencies(entry: Path, text: str, root: Path | None) -> Dependencies:
    """The project modules ``entry`` (whose text is ``text``) imports, directly or through them,
    sorted; ``entry`` itself is not among them."""
    roots = search_roots(entry, root)
    try:
        start = entry.resolve()
    except (OSError, RuntimeError):
        start = entry
    seen: set[Path] = {start}
    todo: list[tuple[Path, str]] = [(start, text)]
    found: list[Path] = []
    while todo and len(found) < MAX_MODULES:
        importer, importer_text = todo.pop()
        for dotted in imported_names(importer_text):
            target = module_file(roots, importer, dotted)
            if target is None or target in seen:
                continue
            seen.add(target)
            module = load_module(target)
            if module is None:
                continue
            found.append(target)
            todo.append((target, module.source.text))
    return Dependencies(sorted(found))
