"""Measured costs from a rule's ``rules/TCNNN.toml`` ``[cost]`` table, picked for the target GPU.

A table looks like::

    [cost]
    source = "benchmarks/sync_cost.py, run by hand"   # where the figures come from
    [cost.sm_90]
    gpu = "H200"
    torch = "2.11"
    step = "..."                                       # one figure per key a message quotes

A message quotes a figure only for the GPU it was measured on: with ``gpu = "sm_90"`` it reads
``(H200, torch 2.11: ...)``; with ``gpu = "auto"`` the one measured GPU is named the same way; for a
GPU with no measurement the message carries no number (the rule's ``explain`` page has the source).
A rule whose claim is not a speed figure (a bug, a deprecation) says so in ``source`` and has no
``[cost.sm_NN]`` entry.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from tcaudit.catalog import RuleSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.lru_cache(maxsize=None)
def _table(path: str) -> dict:
    if not path:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    cost = data.get("cost", {})
    return cost if isinstance(cost, dict) else {}


def rule_cost(spec: RuleSpec) -> dict:
    """The rule's ``[cost]`` table ({} when it has none)."""
    return _table(spec.path)


# Keys of a ``[cost.sm_NN]`` entry that label the measurement; every other key is a figure.
ENTRY_LABELS = ("gpu", "torch")


def measured_entries(spec: RuleSpec) -> dict[str, dict]:
    """Every GPU the rule's figures were measured on, by architecture (``{"sm_90": {...}}``)."""
    return {k: v for k, v in rule_cost(spec).items() if k.startswith("sm_") and isinstance(v, dict)}


def figures(entry: dict) -> dict[str, str]:
    """The figures of one ``[cost.sm_NN]`` entry, by the key a message quotes them under."""
    return {k: str(v) for k, v in entry.items() if k not in ENTRY_LABELS}


def measured(spec: RuleSpec, gpu: str) -> dict | None:
    """The measurements for the target GPU (``sm_90``), or the only measured GPU when ``gpu`` is
    ``auto``; None when there is none for it."""
    entries = measured_entries(spec)
    if gpu in entries:
        return entries[gpu]
    if gpu == "auto" and len(entries) == 1:
        return next(iter(entries.values()))
    return None


def cost_note(spec: RuleSpec, gpu: str, key: str) -> str:
    """`` (H200, torch 2.11: <figure>)`` for the target GPU, or ``""`` when nothing was measured there."""
    entry = measured(spec, gpu)
    if not entry or key not in entry:
        return ""
    label = entry.get("gpu", gpu)
    torch = entry.get("torch")
    where = f"{label}, torch {torch}" if torch else label
    return f" ({where}: {entry[key]})"

