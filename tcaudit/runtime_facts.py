"""What a ``tcaudit verify`` run measured, for the script rules that can use it.

``verify`` writes ``verify.json`` into its results folder (``./tcaudit-verify`` unless ``--out`` says
otherwise); with ``--health`` it records, among others, the parameters that never received a
gradient. A rule scanning the *same script text* later (matched by the SHA-256 of the text verify
ran, so an edited script is never judged by an old run) may read those facts here. This module only
reads JSON: it sits below the rules and imports nothing of verify.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = "tcaudit-verify"
RESULTS_FILE = "verify.json"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class MeasuredRun:
    results: Path  # the verify.json these facts come from
    steps: int  # optimizer steps the original script ran (every round)
    rounds: int
    # Parameters that never had a gradient in any round of the original script; None when the run
    # recorded no health facts (verify without --health).
    unused_parameters: tuple[str, ...] | None


def results_files(script: Path, root: Path) -> list[Path]:
    """Where a verify run of ``script`` may have left its results: beside the script, and in the
    project root (each ``tcaudit-verify/verify.json``)."""
    seen: list[Path] = []
    for folder in (script.parent, root):
        candidate = folder / RESULTS_DIR / RESULTS_FILE
        if candidate not in seen:
            seen.append(candidate)
    return seen


def measured_run(script: Path, text: str, root: Path) -> MeasuredRun | None:
    """The facts of a verify run of exactly this script text, or None."""
    digest = text_digest(text)
    for path in results_files(script, root):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("script_sha256") != digest:
            continue
        original = data.get("original") or {}
        health = ((data.get("health") or {}).get("original")) or None
        unused = None
        if isinstance(health, dict) and isinstance(health.get("unused_parameters"), list):
            unused = tuple(str(name) for name in health["unused_parameters"])
        steps = original.get("steps") if isinstance(original.get("steps"), int) else 0
        rounds = data.get("rounds") if isinstance(data.get("rounds"), int) else 1
        return MeasuredRun(path, steps, rounds, unused)
    return None


def fingerprint(root: Path) -> str:
    """Changes whenever the verify results in ``root`` change, for the scan cache's key."""
    path = root / RESULTS_DIR / RESULTS_FILE
    try:
        stat = path.stat()
    except OSError:
        return ""
    return f"{stat.st_size}:{stat.st_mtime_ns}"
