"""Find the Python files to scan under the paths a user names."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

# Folders that are never user code: VCS data, virtual environments, caches and build outputs.
SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", ".env", "env", ".tox", ".nox", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tcaudit_cache", "build", "dist",
        "node_modules", "site-packages", ".eggs", ".hypothesis", ".ipynb_checkpoints",
    }
)


@dataclass(frozen=True)
class Discovered:
    files: list[Path]
    missing: list[str]
    # Folders that could not be listed: one line each, the scan goes on without them.
    warnings: list[str] = field(default_factory=list)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def identity(path: Path) -> str:
    """The key that makes a file found twice (through a symlink, or named twice) count once. A
    symlink loop or a path that cannot be resolved is its own key: reading it reports the problem."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # RuntimeError: "Symlink loop" on Python 3.11/3.12
        return os.path.abspath(path)


def _is_special(path: Path) -> bool:
    """A FIFO, socket or device file, or a symlink loop: something is there, but neither a file nor a folder."""
    try:
        return os.path.lexists(path) and not path.is_file() and not path.is_dir() and not _dangling(path)
    except OSError:
        return False


def _dangling(path: Path) -> bool:
    """A symlink to nothing: named on the command line, it is a path that does not exist."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _is_venv(path: Path) -> bool:
    try:
        return (path / "pyvenv.cfg").is_file()
    except OSError:  # a folder that cannot be searched: os.walk reports it
        return False


def is_excluded(path: Path, patterns: tuple[str, ...], root: Path) -> bool:
    """Exclude patterns match the file name, any path component, or the path relative to root."""
    if not patterns:
        return False
    try:
        rel = Path(identity(path)).relative_to(identity(root)).as_posix()
    except ValueError:
        rel = path.as_posix()
    parts = rel.split("/")
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, pattern + "/*"):
            return True
        if any(fnmatch.fnmatch(part, pattern) for part in parts):
            return True
    return False


# The files a folder expands to (``include``, as ruff's default less its pyproject.toml): scripts, stubs
# and Jupyter notebooks (tcaudit/source/notebook.py).
DEFAULT_INCLUDE = ("*.py", "*.pyi", "*.ipynb")


def is_included(path: Path, patterns: tuple[str, ...], root: Path) -> bool:
    """Include patterns match the file name or the path relative to root (``*.py``, ``scripts/*.pyw``)."""
    name = path.name
    try:
        rel = Path(identity(path)).relative_to(identity(root)).as_posix()
    except ValueError:
        rel = path.as_posix()
    return any(fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(rel, pattern.removeprefix("**/"))
               or fnmatch.fnmatch(rel, pattern) for pattern in patterns)


IGNORE_FILES = (".gitignore", ".ignore")


def _git_root(folder: Path) -> Path | None:
    """The top of the git work tree ``folder`` lies in (a ``.git`` folder or file), or None."""
    for candidate in (folder, *folder.parents):
        try:
            if (candidate / ".git").exists():
                return candidate
        except OSError:
            return None
    return None


class IgnoreFiles:
    """``.gitignore`` and ``.ignore`` files, as git and ripgrep (ruff's walker) read them: each file's
    patterns (gitwildmatch, via pathspec) apply below its folder, a deeper file's patterns after a
    shallower one's, and the last pattern that matches decides (``!keep.py`` re-includes). ``.gitignore``
    counts only inside a git work tree; ``.ignore`` also outside one. Files above the git work tree
    (or, outside one, above the project root) are not read."""

    def __init__(self, top: Path, in_git: bool) -> None:
        self.top = top
        self.names = IGNORE_FILES if in_git else (".ignore",)
        self._specs: dict[Path, list] = {}

    @classmethod
    def for_folder(cls, folder: Path, root: Path) -> "IgnoreFiles":
        folder = Path(identity(folder))
        git = _git_root(folder)
        if git is not None:
            return cls(git, True)
        project = Path(identity(root))
        return cls(project if folder.is_relative_to(project) else folder, False)

    def _specs_of(self, folder: Path) -> list:
        if folder not in self._specs:
            specs = []
            for name in self.names:
                try:
                    lines = (folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
                except OSError:  # no such file (the usual case), or one that cannot be read
                    continue
                from pathspec import GitIgnoreSpec

                specs.append(GitIgnoreSpec.from_lines(lines))
            self._specs[folder] = specs
        return self._specs[folder]

    def ignored(self, path: Path, is_dir: bool) -> bool:
        path = Path(identity(path))
        try:
            rel = path.relative_to(self.top)
        except ValueError:
            return False
        verdict = None
        folder = self.top
        for part in (None, *rel.parts[:-1]):
            if part is not None:
                folder = folder / part
            specs = self._specs_of(folder)
            if not specs:
                continue
            below = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
            for spec in specs:
                result = spec.check_file(below)
                if result.include is not None:
                    verdict = result.include
        return bool(verdict)


def discover(
    paths: list[str],
    exclude: tuple[str, ...] = (),
    root: Path | None = None,
    *,
    force_exclude: bool = False,
    respect_gitignore: bool = False,
    include: tuple[str, ...] = DEFAULT_INCLUDE,
) -> Discovered:
    """Expand files and folders into a sorted, de-duplicated list of the files ``include`` matches
    (``.py``, ``.pyi`` and ``.ipynb`` by default).

    A file or folder named explicitly is always scanned (like ruff), a file even without a .py
    suffix, even when an exclude pattern matches it; excludes apply to what folders expand to.
    ``force_exclude`` applies them to explicit paths too, for callers such as pre-commit that pass
    every changed file. ``respect_gitignore``: what folders expand to skips what ``.gitignore`` and
    ``.ignore`` files name (:class:`IgnoreFiles`); a file named explicitly is still scanned.
    """
    root = root or Path.cwd()
    found: dict[str, Path] = {}
    missing: list[str] = []
    warnings: list[str] = []
    for raw in paths:
        path = Path(raw)
        if _is_file(path) or _is_special(path):  # a FIFO named explicitly is reported, not waited on
            if not (force_exclude and is_excluded(path, exclude, root)):
                found.setdefault(identity(path), path)
            continue
        if not path.is_dir():
            missing.append(raw)
            continue
        # A folder named explicitly is scanned even inside an excluded one (``scan fixtures/`` with
        # ``exclude = ["fixtures"]``); patterns then apply to what lies below it.
        base = path if not force_exclude and is_excluded(path, exclude, root) else root
        def unreadable(error: OSError) -> None:
            where = Path(error.filename).as_posix() if error.filename else str(path)
            warnings.append(f"cannot read folder {where}: {error.strerror or error}; its files were not scanned")

        ignores = IgnoreFiles.for_folder(path, root) if respect_gitignore else None
        if ignores is not None and ignores.ignored(path, is_dir=True):
            ignores = None  # a folder named explicitly is scanned whole, even one .gitignore names (as excludes)
        for dirpath, dirnames, filenames in os.walk(path, onerror=unreadable):
            here = Path(dirpath)
            dirnames[:] = sorted(
                name
                for name in dirnames
                if name not in SKIPPED_DIRS
                and not name.endswith(".egg-info")
                and not _is_venv(here / name)
                and not is_excluded(here / name, exclude, base)
                and not (ignores is not None and ignores.ignored(here / name, is_dir=True))
            )
            for name in sorted(filenames):
                file = here / name
                if not is_included(file, include, base):
                    continue
                if is_excluded(file, exclude, base):
                    continue
                if ignores is not None and ignores.ignored(file, is_dir=False):
                    continue
                found.setdefault(identity(file), file)
    files = sorted(found.values(), key=lambda p: p.as_posix())
    return Discovered(files=files, missing=missing, warnings=warnings)


def display_path(path: Path) -> str:
    """``path`` relative to the working folder where it lies under it, as reports show it."""
    # A symlink to nothing is shown under its own name: its target's would name a file that is not there.
    key = os.path.abspath(path) if os.path.islink(path) and not os.path.exists(path) else identity(path)
    try:
        display = Path(key).relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        display = path.as_posix()
    # A file name that is not valid UTF-8 (kept by Python as lone surrogates) is shown with its
    # bytes escaped (``name_\xff.py``): every report format can encode that.
    return os.fsencode(display).decode("utf-8", "backslashreplace")
