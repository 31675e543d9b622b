"""Baselines: record today's findings by fingerprint, then report only new ones."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tcaudit.findings import Finding

FORMAT_VERSION = 1


class BaselineError(Exception):
    pass


def write_baseline(path: str, findings: list[Finding]) -> None:
    data = {
        "tcaudit_baseline": FORMAT_VERSION,
        "findings": [
            {"fingerprint": f.fingerprint, "rule": f.rule, "path": f.location.path, "line": f.location.line}
            for f in findings
        ],
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tcaudit-baseline-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_baseline(path: str) -> set[str]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("tcaudit_baseline") != FORMAT_VERSION:
        raise BaselineError(f"{path} is not a tcaudit baseline (write one with --write-baseline)")
    entries = data.get("findings", [])
    if not isinstance(entries, list):
        raise BaselineError(f"{path}: 'findings' must be a list")
    return {
        entry["fingerprint"]
        for entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("fingerprint"), str)
    }


def filter_baseline(known: set[str] | str, findings: list[Finding]) -> list[Finding]:
    """The findings whose fingerprints ``known`` (a set, or a baseline file's path) does not hold."""
    if isinstance(known, str):
        known = load_baseline(known)
    return [f for f in findings if f.fingerprint not in known]
