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


def discover(
    paths: list[str],
    exclude: tuple[str, ...] = (),
    root: Path | None = None,
    *,
    force_exclude: bool = False,
) -> Discovered:
    """Expand files and folders into a sorted, de-duplicated list of ``.py``/``.pyi`` files.

    A file or folder named explicitly is always scanned (like ruff), a file even without a .py
    suffix, even when an exclude pattern matches it; excludes apply to what folders expand to.
    ``force_exclude`` applies them to explicit paths too, for callers such as pre-commit that pass
    every changed file.
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

        for dirpath, dirnames, filenames in os.walk(path, onerror=unreadable):
            here = Path(dirpath)
            dirnames[:] = sorted(
                name
                for name in dirnames
                if name not in SKIPPED_DIRS
                and not name.endswith(".egg-info")
                and not _is_venv(here / name)
                and not is_excluded(here / name, exclude, base)
            )
            for name in sorted(filenames):
                if not name.endswith((".py", ".pyi")):
                    continue
                file = here / name
                if is_excluded(file, exclude, base):
                    continue
                found.setdefault(identity(file), file)
    files = sorted(found.values(), key=lambda p: p.as_posix())
    return Discovered(files=files, missing=missing, warnings=warnings)
