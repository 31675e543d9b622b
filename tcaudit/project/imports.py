"""Where an import of a training script leads inside its project, and which project files a script
depends on (for the scan cache: a changed imported module invalidates the scripts that import it). Python's
own parser and the file system only: a scan answered from the cache loads no LibCST.

Python's rules, as far as a scanner can follow them without running anything: an absolute import is
looked up beside the entry script (``sys.path[0]``), then at the project root and in its ``src/``
folder; a relative import from the importing module's package. A module under ``site-packages`` or
``dist-packages``, in a virtual environment, or outside those folders is not the project's: the
project model stops there (a library's code is the library's business, and its size is unbounded).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tcaudit.source.errors import SourceError
from tcaudit.source.inert import note_read
from tcaudit.source.parsing import read_file_bytes

# Folders whose modules are never the project's: installed packages and virtual environments.
_NOT_PROJECT = frozenset({"site-packages", "dist-packages", ".venv", "venv", ".tox", ".nox", "node_modules", "__pycache__"})
# A project module larger than this is not followed (generated code, vendored data as Python).
MAX_MODULE_BYTES = 2_000_000
# How many modules one scan follows from one entry file at most (a monorepo's whole tree is not read).
MAX_MODULES = 200


def is_project_file(path: Path) -> bool:
    return not any(part in _NOT_PROJECT for part in path.parts)


# Files that mark a project's root folder (where a ``src/`` layout's ``src`` sits).
_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def project_root(entry: Path) -> Path | None:
    """The nearest folder at or above ``entry``'s that holds a project marker (``pyproject.toml``,
    ``setup.py``, ``setup.cfg``, ``.git``)."""
    try:
        folder = entry.resolve().parent
    except (OSError, RuntimeError):
        return None
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in _ROOT_MARKERS):
            return candidate
    return None


def search_roots(entry: Path, root: Path | None) -> tuple[Path, ...]:
    """Where an absolute import of ``entry`` is looked up: its own folder (``sys.path[0]``), then its
    project's root folder and that root's ``src/`` (a ``src/`` layout installed in development mode),
    then the configured root and its ``src/``, in that order."""
    out: list[Path] = []
    nearest = project_root(entry)
    for folder in (entry.parent, nearest, nearest / "src" if nearest is not None else None,
                   root, root / "src" if root is not None else None):
        if folder is None:
            continue
        try:
            resolved = folder.resolve()
        except (OSError, RuntimeError):
            continue
        if resolved not in out and resolved.is_dir():
            out.append(resolved)
    return tuple(out)


# Where imports led in the analysis running in this thread (:func:`looking_up_once`), by (roots,
# importer, module name).
_LOOKED_UP: "ContextVar[dict[tuple[tuple[Path, ...], Path, str], Path | None] | None]" = ContextVar(
    "tcaudit_imports_looked_up", default=None)


@contextlib.contextmanager
def looking_up_once() -> Iterator[None]:
    """While the block runs (one file's analysis), each import's module file is looked for on disk once:
    the rules ask where a name leads for every call of a file (1,700 times on a 2,000-line file, each a
    look at the disk). The next analysis looks again (files come and go between them)."""
    if _LOOKED_UP.get() is not None:  # an analysis inside another: the outer one's
        yield
        return
    token = _LOOKED_UP.set({})
    try:
        yield
    finally:
        _LOOKED_UP.reset(token)


def module_file(roots: tuple[Path, ...], importer: Path, dotted: str) -> Path | None:
    """The project file an import of ``dotted`` from ``importer`` loads (``.pkg.mod``: relative to
    ``importer``'s package), or None when it is not a project module."""
    looked_up = _LOOKED_UP.get()
    if looked_up is None:
        return _module_file(roots, importer, dotted)
    key = (roots, importer, dotted)
    if key not in looked_up:
        looked_up[key] = _module_file(roots, importer, dotted)
    return looked_up[key]


def _module_file(roots: tuple[Path, ...], importer: Path, dotted: str) -> Path | None:
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
        bases = tuple(root for root in roots if parts[0] in top_names(root))
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


_TOP_NAMES: dict[Path, tuple[int, frozenset[str]]] = {}


def top_names(folder: Path) -> frozenset[str]:
    """The module and package names directly in ``folder`` (``utils`` for ``utils.py`` or ``utils/``),
    listed again only when the folder changes: most imports (``torch``, ``numpy``) are ruled out
    without a look at the disk."""
    note_read(folder)
    try:
        stamp = folder.stat().st_mtime_ns
    except OSError:
        return frozenset()
    cached = _TOP_NAMES.get(folder)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    names = set()
    try:
        for child in os.scandir(folder):
            name = child.name
            if name.endswith(".py"):
                names.add(name[:-3])
            elif "." not in name and name not in _NOT_PROJECT:
                names.add(name)
    except OSError:
        pass
    frozen = frozenset(names)
    _TOP_NAMES[folder] = (stamp, frozen)
    return frozen


# An import statement at the start of a line: ``from .pkg import a, b as c`` (names in parentheses may
# span lines) or ``import x.y as z, w``.
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]*))", re.MULTILINE
)


@functools.lru_cache(maxsize=64)
def imported_names(text: str) -> tuple[str, ...]:
    """Every module an ``import`` statement of ``text`` names, with its leading dots for a relative
    import, and ``pkg.name`` for ``from pkg import name`` (which may be a submodule). Read from the
    text line by line, not parsed: a warm scan asks this of every file, and an import-looking line in
    a string only adds a name that resolves to nothing (or one more dependency to key the cache by)."""
    out: list[str] = []
    for match in _IMPORT.finditer(text):
        base, names, plain = match.groups()
        if plain is not None:
            for part in plain.split(","):
                name = part.split(" as ")[0].strip()
                if _DOTTED.fullmatch(name):
                    out.append(name)
            continue
        if not base or (names or "").strip().startswith("*"):
            if base:
                out.append(base)
            continue
        out.append(base)
        for part in (names or "").strip("() \t\\").replace("\n", " ").split(","):
            name = part.split(" as ")[0].strip().strip("()")
            if _DOTTED.fullmatch(name) and "." not in name:
                out.append(f"{base}.{name}" if not base.endswith(".") else f"{base}{name}")
    return tuple(out)


_DOTTED = re.compile(r"[A-Za-z_][\w.]*")


@dataclass
class Dependencies:
    """The project modules a file imports, directly or through them (sorted), and one digest of their
    paths and contents: it changes when any of them does."""

    files: list[Path] = field(default_factory=list)
    digest: str = ""


@dataclass
class _Imports:
    key: tuple[int, int, int]
    digest: str
    names: tuple[str, ...]


_IMPORTS: dict[Path, _Imports] = {}


def read_small(path: Path, limit: int = MAX_MODULE_BYTES) -> bytes | None:
    """The bytes of a regular file of at most ``limit`` bytes (tcaudit's one safe read: never a FIFO,
    socket or device), or None."""
    key = stat_key(path)
    if key is None or key[1] > limit:
        return None
    try:
        raw = read_file_bytes(path)
    except SourceError:
        return None
    return raw if len(raw) <= limit else None


def stat_key(path: Path) -> tuple[int, int, int] | None:
    """(modification time, size, inode) of a file, None where it cannot be read: a file is read again
    only when this changes."""
    try:
        stat = path.stat()
    except OSError:
        note_read(path, None)
        return None
    key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    note_read(path, key)  # an editor's next scan reuses this one only while the file stays so
    return key


def forget_imports() -> None:
    _IMPORTS.clear()
    _TOP_NAMES.clear()


def _imports_of(path: Path) -> _Imports | None:
    """A project file's imports and content digest, read from its text (no parser), again only when
    the file changed: what the scan cache's key needs, cheaply."""
    key = stat_key(path)
    if key is None or key[1] > MAX_MODULE_BYTES:
        return None
    cached = _IMPORTS.get(path)
    if cached is not None and cached.key == key:
        return cached
    raw = read_small(path)
    if raw is None:
        return None
    entry = _Imports(key, hashlib.sha256(raw).hexdigest(), imported_names(raw.decode("utf-8", "replace")))
    _IMPORTS[path] = entry
    return entry


def dependencies(entry: Path, text: str, root: Path | None) -> Dependencies:
    """The project modules ``entry`` (whose text is ``text``) imports, directly or through them;
    ``entry`` itself is not among them."""
    roots = search_roots(entry, root)
    try:
        start = entry.resolve()
    except (OSError, RuntimeError):
        start = entry
    seen: set[Path] = {start}
    todo: list[tuple[Path, tuple[str, ...]]] = [(start, imported_names(text))]
    found: list[tuple[Path, str]] = []
    while todo and len(found) < MAX_MODULES:
        importer, names = todo.pop()
        for dotted in names:
            target = module_file(roots, importer, dotted)
            if target is None or target in seen:
                continue
            seen.add(target)
            imports = _imports_of(target)
            if imports is None:
                continue
            found.append((target, imports.digest))
            todo.append((target, imports.names))
    found.sort()
    hasher = hashlib.sha256()
    for path, digest in found:
        hasher.update(os.fsencode(path) + b"\0" + digest.encode())
    return Dependencies([path for path, _ in found], hasher.hexdigest() if found else "")
