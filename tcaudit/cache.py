"""Per-file scan results on disk, so that a re-scan only analyses the files that changed.

An entry holds one file's script-rule findings before any filtering (per-file-ignores, suppression
comments and baselines are applied on every run, from the current config and text). Its key hashes
everything those findings depend on:

* the file's bytes, its absolute path and the path the report shows;
* the namespace: the cache format, tcaudit's version and the size and modification time of every
  file of its code and rule catalog (an editable install changes without a version bump), the
  Python version (``ast.parse`` decides TC000) and LibCST's, the enabled rule set, and every
  setting a rule may read.

``tcaudit fix`` keeps its result per file beside them (``fix-vN/``), keyed the same way plus the fix
classes, the file's ignores and what the model audit measured: a second ``fix`` of an unchanged file
reads it instead of fixing again.

The model audit (TC1) is not cached here: it depends on the user's model code and installed packages,
not only on the scanned file; :mod:`tcaudit.model.model_cache` keeps its results in this folder,
keyed by the slice that builds each model and checked against the files the build imported.

Writes go to a temporary file in the entry's folder and are renamed over the entry
(``os.replace``), so concurrent scans never see half an entry. Anything unreadable (a truncated or
corrupted entry, another format, a foreign key) is a miss, never an error. Like ruff's, the folder
holds a ``CACHEDIR.TAG`` and a ``.gitignore`` of ``*``.

Every entry is sealed with an HMAC-SHA256 under a per-user key kept outside any project
(``$XDG_CACHE_HOME/tcaudit/cache-key``, mode 0600, made on first use): an entry committed to a
repository or edited by hand (its findings emptied, so that a scan would say "All clear") fails the
check and is a miss, rewritten by the scan. Where the key cannot be made or read, nothing is cached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tcaudit import __version__, runtime_facts
from tcaudit.atomic import replace_atomically
from tcaudit.findings import Finding, Fix, FixClass, Location, Related, RenderedPlan, Severity, TextEdit

if TYPE_CHECKING:
    from tcaudit.config import Settings

CACHE_DIR_NAME = ".tcaudit_cache"
FORMAT = 3
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by tcaudit.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)
# Settings applied after the cached stage (filters), replaced by the enabled rule set, or only
# locating files; every other field is part of the key, so a new setting is keyed by default.
_SETTINGS_NOT_KEYED = frozenset(
    {"select", "extend_select", "ignore", "per_file_ignores", "exclude", "force_exclude", "fail_on",
     "config_path", "root", "cache_dir", "model_budget", "verbose", "sort", "respect_gitignore"}
)


def user_cache_dir() -> Path:
    """tcaudit's folder in the user's cache (``$XDG_CACHE_HOME/tcaudit``, ``~/.cache/tcaudit``), read
    at call time: outside every project, where what a repository holds cannot reach."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tcaudit"


_KEYS: dict[str, bytes | None] = {}


def _user_key() -> bytes | None:
    """The per-user key that seals cache entries, made on first use (32 random bytes, 0600, created
    with O_EXCL and linked into place, so two first scans agree on one); None where it cannot be."""
    path = user_cache_dir() / "cache-key"
    where = str(path)
    if where in _KEYS:
        return _KEYS[where]
    key = None
    try:
        try:
            key = bytes.fromhex(path.read_text(encoding="ascii").strip())
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="ascii") as out:
                    out.write(os.urandom(32).hex() + "\n")
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass  # another scan made it first: read theirs
            finally:
                os.unlink(tmp)
            key = bytes.fromhex(path.read_text(encoding="ascii").strip())
        if len(key) < 32:
            key = None
    except (OSError, ValueError):
        key = None
    _KEYS[where] = key
    return key


def seal(payload: bytes) -> bytes | None:
    """``payload`` with its HMAC under the user's key in front (hex, one line); None without a key."""
    key = _user_key()
    if key is None:
        return None
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii") + b"\n" + payload


def unseal(blob: bytes) -> bytes | None:
    """The payload of a sealed entry, or None when its HMAC does not check (forged, another user's,
    truncated) or there is no key."""
    key = _user_key()
    mac, _, payload = blob.partition(b"\n")
    if key is None or not hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii")):
        return None
    return payload


class CacheError(Exception):
    """The cache folder cannot be created or written; the scan goes on without a cache."""


@dataclass(frozen=True)
class CachedFile:
    findings: list[Finding]
    parsed: bool


@dataclass(frozen=True)
class CachedFix:
    """``tcaudit fix``'s result for one version of a file: the text it writes, the rules whose fixes
    it made, the fixes it declined (findings at the lines of the fixed text, with the reason) and the
    findings the fixed text still has (``fix --apply``'s exit code)."""

    fixed: str
    applied: list[str]
    declined: list[tuple[Finding, str]]
    remaining: list[Finding] = field(default_factory=list)


def is_cache_folder(folder: Path) -> bool:
    """Whether ``folder`` is a cache tcaudit made: a real folder (not a symlink) holding tcaudit's
    ``CACHEDIR.TAG``. ``tcaudit clean`` removes nothing else."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        return (folder / "CACHEDIR.TAG").read_text(encoding="utf-8", errors="replace").startswith(CACHEDIR_TAG[:80])
    except OSError:
        return False


def cache_folders(roots: "list[Path]", configured: "Path | None" = None) -> list[Path]:
    """The tcaudit caches ``tcaudit clean`` removes: every ``.tcaudit_cache`` folder under ``roots`` (symlinks
    not followed, nothing looked for inside a cache) and ``configured`` (the settings' ``cache-dir``)."""
    found: dict[Path, None] = {}
    if configured is not None and is_cache_folder(configured):
        found[configured.resolve()] = None
    for root in roots:
        if root.name == CACHE_DIR_NAME and is_cache_folder(root):
            found[root.resolve()] = None
            continue
        for folder, subfolders, _ in os.walk(root):
            keep = []
            for name in subfolders:
                path = Path(folder) / name
                if name == CACHE_DIR_NAME and is_cache_folder(path):
                    found[path.resolve()] = None
                elif not path.is_symlink():
                    keep.append(name)
            subfolders[:] = keep
    return list(found)


def default_cache_dir(settings: "Settings") -> Path:
    """``.tcaudit_cache`` beside the config file, or in the working folder when there is none."""
    return settings.root / CACHE_DIR_NAME


def _code_fingerprint() -> str:
    """Size and modification time of every file of tcaudit's code and rule catalog."""
    from tcaudit.catalog import rules_dir

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for folder, patterns in ((package, ("*.py", "*.json")), (rules_dir(), ("*.toml",))):
        try:
            files = sorted(p for pattern in patterns for p in folder.rglob(pattern) if "__pycache__" not in p.parts)
        except OSError:
            files = []
        for path in files:
            try:
                stat = path.stat()
            except OSError:
                continue
            digest.update(f"{path.relative_to(folder).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _libcst_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("libcst")
    except metadata.PackageNotFoundError:
        return "unknown"


def _settings_key(settings: "Settings") -> dict[str, str]:
    return {f.name: repr(getattr(settings, f.name)) for f in fields(settings) if f.name not in _SETTINGS_NOT_KEYED}


def namespace(settings: "Settings", enabled_rules: list[str]) -> str:
    parts = {
        "format": FORMAT,
        "tcaudit": __version__,
        "code": _code_fingerprint(),
        "python": sys.version,
        "libcst": _libcst_version(),
        "rules": sorted(enabled_rules),
        "settings": _settings_key(settings),
        # Rules that read what a verify run measured (TC508) must not be answered from before it.
        "verify-results": runtime_facts.fingerprint(settings.root),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# -- finding <-> JSON, exactly: tuples stay tuples, dict keys keep their types -----------------------
class _NotCacheable(Exception):
    pass


def _encode(value: Any) -> Any:
    # Exact types only: an enum that compares equal to an int or str would come back as one.
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is int or kind is float:
        return value
    if kind is list:
        return ["L", [_encode(v) for v in value]]
    if kind is tuple:
        return ["T", [_encode(v) for v in value]]
    if kind is dict:
        return ["D", [[_encode(k), _encode(v)] for k, v in value.items()]]
    raise _NotCacheable(kind.__name__)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        tag, items = value
        if tag == "L":
            return [_decode(v) for v in items]
        if tag == "T":
            return tuple(_decode(v) for v in items)
        if tag == "D":
            return {_decode(k): _decode(v) for k, v in items}
        raise ValueError(f"unknown tag {tag!r}")
    return value


def _finding_to_json(finding: Finding) -> dict[str, Any]:
    loc = finding.location
    fix = finding.fix
    return {
        "rule": finding.rule,
        "name": finding.name,
        "severity": int(finding.severity),
        "location": [loc.path, loc.line, loc.column, loc.end_line, loc.end_column],
        "message": finding.message,
        "fix": None if fix is None else {
            "class": fix.fix_class.value,
            "description": fix.description,
            "available": fix.available,
            "reason": fix.reason,
            "edit": None if fix.plan is None else _encode(fix.plan.to_dict()),
            "option": fix.option,
            "edits": None if fix.edits is None else [edit.to_dict() for edit in fix.edits],
        },
        "details": _encode(finding.details),
        "source_line": finding.source_line,
        "scope": finding.scope,
        "follows": finding.follows,
        "explanation": finding.explanation,
        "related": [[r.location.path, r.location.line, r.location.column, r.location.end_line,
                     r.location.end_column, r.message, r.mirror] for r in finding.related],
    }


def _finding_from_json(data: dict[str, Any]) -> Finding:
    path, line, column, end_line, end_column = data["location"]
    raw_fix = data["fix"]
    fix = None
    if raw_fix is not None:
        fix = Fix(
            fix_class=FixClass(raw_fix["class"]),
            description=raw_fix["description"],
            available=raw_fix["available"],
            reason=raw_fix["reason"],
            plan=None if raw_fix["edit"] is None else RenderedPlan(_decode(raw_fix["edit"])),
            option=raw_fix["option"],
            edits=None if raw_fix.get("edits") is None else tuple(TextEdit.from_dict(e) for e in raw_fix["edits"]),
        )
    return Finding(
        rule=data["rule"],
        name=data["name"],
        severity=Severity(data["severity"]),
        location=Location(path, line, column, end_line, end_column),
        message=data["message"],
        fix=fix,
        details=_decode(data["details"]),
        source_line=data["source_line"],
        scope=data["scope"],
        follows=data.get("follows"),
        explanation=data.get("explanation", ""),
        related=tuple(Related(Location(*r[:5]), r[5], r[6]) for r in data.get("related", ())),
    )


class ScanCache:
    """One cache folder, seen through one namespace (tcaudit's code, the rules and the settings)."""

    def __init__(self, directory: Path, namespace: str) -> None:
        self.directory = directory
        self.namespace = namespace
        self.entries = directory / f"scan-v{FORMAT}" / namespace[:24]

    @classmethod
    def open(cls, directory: Path, settings: "Settings", enabled_rules: list[str]) -> "ScanCache":
        """Create the folder (with CACHEDIR.TAG and .gitignore) if needed; CacheError if it cannot."""
        cache = cls(directory, namespace(settings, enabled_rules))
        try:
            cache.entries.mkdir(parents=True, exist_ok=True)
            for name, text in (("CACHEDIR.TAG", CACHEDIR_TAG), (".gitignore", "# Created by tcaudit.\n*\n")):
                marker = directory / name
                if not marker.is_file():
                    write_atomic(marker, text.encode("utf-8"))
            probe = tempfile.NamedTemporaryFile(dir=cache.entries, prefix=".probe-", delete=True)
            probe.close()
        except OSError as exc:
            raise CacheError(f"cannot use cache folder {directory}: {exc.strerror or exc}") from None
        return cache

    def key(self, absolute_path: str, display_path: str, raw: bytes, facts: str = "") -> str:
        """``facts``: a digest of what else the rules read for this file (the model audit's profiles)."""
        digest = hashlib.sha256()
        digest.update(self.namespace.encode())
        digest.update(b"\0" + facts.encode())
        digest.update(b"\0" + absolute_path.encode("utf-8", "surrogateescape"))
        digest.update(b"\0" + display_path.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(raw)
        return digest.hexdigest()

    def _entry(self, key: str) -> Path:
        return self.entries / f"{key}.json"

    def load(self, key: str) -> CachedFile | None:
        """The entry for ``key``, or None for a miss (absent, unreadable, corrupted or foreign)."""
        try:
            data = json.loads(unseal(self._entry(key).read_bytes()))  # None (forged): a TypeError, a miss
            if data["format"] != FORMAT or data["key"] != key:
                return None
            return CachedFile([_finding_from_json(f) for f in data["findings"]], bool(data["parsed"]))
        except Exception:  # noqa: BLE001 - whatever is wrong with an entry, it is a miss
            return None

    def store(self, key: str, findings: list[Finding], parsed: bool) -> bool:
        """Write an entry; False (and nothing written) when a finding would not come back exactly
        or the folder cannot be written. Never raises."""
        try:
            encoded = [_finding_to_json(f) for f in findings]
            payload = json.dumps({"format": FORMAT, "key": key, "parsed": parsed, "findings": encoded})
            if [_finding_from_json(f) for f in json.loads(payload)["findings"]] != findings:
                return False
            sealed = seal(payload.encode("utf-8"))
            if sealed is None:
                return False
            write_atomic(self._entry(key), sealed)
        except (_NotCacheable, OSError, ValueError, TypeError):
            return False
        return True

    # -- ``tcaudit fix``'s results, keyed like the scan's (plus the fix classes and options) ---------
    def _fix_entry(self, key: str) -> Path:
        return self.entries.parent.parent / f"fix-v{FORMAT}" / self.namespace[:24] / f"{key}.json"

    def load_fix(self, key: str) -> CachedFix | None:
        """What ``tcaudit fix`` made of the file for ``key`` (:meth:`key` with the fix's own facts),
        or None for a miss."""
        try:
            data = json.loads(unseal(self._fix_entry(key).read_bytes()))
            if data["format"] != FORMAT or data["key"] != key:
                return None
            return CachedFix(
                fixed=data["fixed"],
                applied=list(data["applied"]),
                declined=[(_finding_from_json(f), str(reason)) for f, reason in data["declined"]],
                remaining=[_finding_from_json(f) for f in data["remaining"]],
            )
        except Exception:  # noqa: BLE001 - whatever is wrong with an entry, it is a miss
            return None

    def store_fix(self, key: str, entry: CachedFix) -> bool:
        try:
            declined = [[_finding_to_json(f), reason] for f, reason in entry.declined]
            payload = json.dumps({"format": FORMAT, "key": key, "fixed": entry.fixed, "applied": entry.applied,
                                  "declined": declined, "remaining": [_finding_to_json(f) for f in entry.remaining]})
            stored = json.loads(payload)
            if [_finding_from_json(f) for f, _ in stored["declined"]] != [f for f, _ in entry.declined]:
                return False
            if [_finding_from_json(f) for f in stored["remaining"]] != list(entry.remaining):
                return False
            sealed = seal(payload.encode("utf-8"))
            if sealed is None:
                return False
            path = self._fix_entry(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, sealed)
        except (_NotCacheable, OSError, ValueError, TypeError):
            return False
        return True


def open_cache(settings: "Settings", directory: "str | Path | None" = None, *, warn=None) -> "ScanCache | None":
    """The result cache ``scan`` and ``fix`` share: in ``directory`` (``--cache-dir``), else the
    config's ``cache-dir``, else beside the config file. None when the folder cannot be used; ``warn``
    is then told why (the command goes on without the cache)."""
    folder = Path(directory).expanduser() if directory else (settings.cache_dir or default_cache_dir(settings))
    try:
        return ScanCache.open(Path(folder), settings, settings.enabled_rules())
    except CacheError as exc:
        if warn is not None:
            warn(str(exc))
        return None


_UMASK: int | None = None


def _umask() -> int:
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def write_atomic(path: Path, data: bytes) -> None:
    """Write a cache file atomically (:func:`tcaudit.atomic.replace_atomically`), as readable as the
    user's other files: mkstemp makes 0600."""

    def readable(fd: int) -> None:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~_umask())

    replace_atomically(path, data, prepare=readable)
