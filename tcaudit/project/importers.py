"""The other direction of the project's imports: which training scripts of the project import a module.

A helper module (``utils/loss.py``, a loader factory) trains nothing itself; what it does wrong shows
only through the scripts that call it every step. The rules that judge a helper from its scripts'
point of view (TC601's per-step syncs, TC401/TC402's DataLoaders) find those scripts here, and the
engine reads a helper with them when a scan or an editor has the helper alone
(:func:`imported_by_training`, the rules' ``helper_triggers``). No LibCST here: the scan cache's key
(:func:`importers_digest`) is made before anything is parsed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tcaudit.project.imports import dependencies, is_project_file, project_root, read_small, stat_key

# How many files of the project are looked at for scripts that import a helper module.
MAX_IMPORTERS_LOOKED_AT = 400
# How many folders one walk for a module's scripts enters at most.
MAX_FOLDERS_WALKED = 2000
# Text a training script holds: a backward or an optimizer step.
_TRAINS_TEXT = ("backward(", ".step(")


def training_importers(module: Path, root: Path | None) -> list[Path]:
    """The project's Python files (beside ``module``'s package and under the project root, at most
    :data:`MAX_IMPORTERS_LOOKED_AT`) that train and import ``module`` directly or through others."""
    try:
        module = module.resolve()
    except (OSError, RuntimeError):
        return []
    if not is_project_file(module):
        return []  # an installed package's module: its users are not the project's scripts
    folders = {module.parent}
    nearest = project_root(module)
    for folder in (nearest, root):
        if folder is not None and module.is_relative_to(folder.resolve()):
            folders.add(folder.resolve())
    seen: set[Path] = set()
    out: list[Path] = []
    for folder in sorted(folders):
        for path, text in _training_files(folder):
            if path in seen or path == module:
                continue
            seen.add(path)
            if module in _imported_files(path, text, root):
                out.append(path)
    return out


# (script, root) -> (the script's stat key, the project files it imports with their stat keys): made
# again only when one of them changed, so the scripts' imports are resolved once for all the helpers
# of a scan rather than once per helper.
_IMPORTED: dict[tuple[Path, Path | None], tuple[object, frozenset[Path], list[tuple[Path, object]]]] = {}


def _imported_files(script: Path, text: str, root: Path | None) -> frozenset[Path]:
    key = stat_key(script)
    cached = _IMPORTED.get((script, root))
    if cached is not None and cached[0] == key and all(stat_key(dep) == state for dep, state in cached[2]):
        return cached[1]
    files = dependencies(script, text, root).files
    _IMPORTED[(script, root)] = (key, frozenset(files), [(dep, stat_key(dep)) for dep in files])
    return frozenset(files)


def imported_by_training(path: Path, root: Path | None) -> bool:
    """Whether a training script of the project imports the module at ``path``."""
    return bool(training_importers(path, root))


def importers_digest(path: Path, root: Path | None) -> str:
    """One digest over the training scripts that import ``path`` and their state on disk: what a helper's
    findings seen from those scripts depend on (a script that stops calling the helper changes it)."""
    parts = []
    for script in training_importers(path, root):
        parts.append(f"{script}:{stat_key(script)}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16] if parts else ""


_TEXTS: dict[Path, tuple[tuple[int, int, int], str | None]] = {}


def _training_files(folder: Path) -> list[tuple[Path, str]]:
    """(path, text) of the Python files under ``folder`` whose text trains (a backward or an optimizer
    step), at most :data:`MAX_IMPORTERS_LOOKED_AT` files and :data:`MAX_FOLDERS_WALKED` folders looked
    at; each file read again only when it changed. Only regular files that are not symlinks are read,
    and tcaudit's own private folders (``tcaudit-*``, which the model's sandbox writes) are not entered."""
    out: list[tuple[Path, str]] = []
    for path in _python_files(folder):
        key = stat_key(path)
        if key is None:
            continue
        cached = _TEXTS.get(path)
        if cached is None or cached[0] != key:
            raw = read_small(path)
            if raw is None:
                continue
            text = raw.decode("utf-8", "replace")
            cached = (key, text if any(mark in text for mark in _TRAINS_TEXT) else None)
            _TEXTS[path] = cached
        if cached[1] is not None:
            out.append((path.resolve(), cached[1]))
    return out


# folder -> (its folders walked with their modification times, the Python files found): walked again
# only when a folder changed (a file added, removed or renamed), so the many helper files of one scan
# share one walk.
_WALKS: dict[Path, tuple[list[tuple[str, int]], list[Path]]] = {}


def _python_files(folder: Path) -> list[Path]:
    walked = _WALKS.get(folder)
    if walked is not None and all(_mtime(d) == m for d, m in walked[0]):
        return walked[1]
    dirs: list[tuple[str, int]] = []
    files: list[Path] = []
    looked = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        if len(dirs) >= MAX_FOLDERS_WALKED:
            break
        dirs.append((dirpath, _mtime(dirpath)))
        dirnames[:] = sorted(d for d in dirnames if is_project_file(Path(d)) and not d.startswith((".", "tcaudit-")))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            looked += 1
            if looked > MAX_IMPORTERS_LOOKED_AT:
                break
            path = Path(dirpath, name)
            if not path.is_symlink():
                files.append(path)
        if looked > MAX_IMPORTERS_LOOKED_AT:
            break
    _WALKS[folder] = (dirs, files)
    return files


def _mtime(folder: str) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return -1
