"""Model-audit results on disk, so that a warm scan does not build and trace the models again.

An entry holds one model's :class:`~tcaudit.model.facts.ModelFacts`. Its key hashes the audit job
(the slice that builds the model: its statements, positions, input hints and precision), the scan
cache's namespace (tcaudit's code, the settings), and the versions of torch and torchvision, which
decide what a build and a trace give. The entry also lists the user's files the build imported
(sibling modules, a package's ``__init__``) with a digest of each: a change to any of them is a
miss. A failed build lists every Python file of the script's folder as well, since the import that
failed never reached the module table.

Entries live in ``models-v1/`` of the scan cache's folder (``.tcaudit_cache``) and are written
atomically; anything unreadable is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from tcaudit.cache import seal, unseal, write_atomic
from tcaudit.model.channel import read_project_file
from tcaudit.model.facts import ModelFacts

FORMAT = 1


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def _digest(path: str) -> str | None:
    """The file's digest, read through the channel's opener: a FIFO, a device or a file past the size
    cap (a result may name one) is no digest, never a read that blocks or does not end."""
    raw = read_project_file(path)
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


class ModelCache:
    """One folder of model-audit results, seen through one namespace."""

    def __init__(self, directory: Path, namespace: str) -> None:
        self.entries = directory / f"models-v{FORMAT}"
        self.namespace = "\0".join((namespace, _package_version("torch"), _package_version("torchvision")))

    def key(self, job: dict[str, Any]) -> str:
        digest = hashlib.sha256(self.namespace.encode())
        digest.update(json.dumps(job, sort_keys=True, default=str).encode())
        return digest.hexdigest()

    def load(self, job: dict[str, Any]) -> ModelFacts | None:
        key = self.key(job)
        try:
            data = json.loads(unseal((self.entries / f"{key}.json").read_bytes()))  # forged: a miss
            if data["format"] != FORMAT or data["key"] != key:
                return None
            if any(_digest(path) != digest for path, digest in data["files"].items()):
                return None
            return ModelFacts.from_json(data["facts"])
        except Exception:  # noqa: BLE001 - whatever is wrong with an entry, it is a miss
            return None

    def store(self, job: dict[str, Any], facts: ModelFacts) -> bool:
        """Remember a result; False when it should not be or cannot be. An internal error and an
        audit process that crashed or ran out of time (it reported no files: it never wrote its
        result) may go otherwise next time, so they are not remembered."""
        if facts.status == "error" or not facts.depends_on:
            return False
        files = set(facts.depends_on)
        if facts.status != "ok":
            for root in job["target"].get("roots", [])[:1]:
                try:
                    files |= {str(p.resolve()) for p in Path(root).glob("*.py")}
                except OSError:
                    pass
        digests = {path: _digest(path) for path in sorted(files)}
        if any(value is None for value in digests.values()):
            return False
        key = self.key(job)
        try:
            self.entries.mkdir(parents=True, exist_ok=True)
            payload = {"format": FORMAT, "key": key, "files": digests, "facts": facts.to_json()}
            sealed = seal(json.dumps(payload).encode("utf-8"))
            if sealed is None:
                return False
            write_atomic(self.entries / f"{key}.json", sealed)
        except (OSError, ValueError, TypeError):
            return False
        return True


def open_model_cache(directory: Path | None, namespace: str) -> ModelCache | None:
    if directory is None:
        return None
    return ModelCache(Path(os.fspath(directory)), namespace)
