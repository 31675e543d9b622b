"""Measured costs from a rule's ``rules/TCNNN.toml`` ``[cost]`` table, picked for the target GPU.

A table looks like::

    [cost]
    source = "benchmarks/sync_cost.py, run by hand"   # where the figures come from
    [cost.sm_90]
    gpu = "H200"
    torch = "2.11"
    step = "..."                                       # one figure per key a message quotes

    [cost.published]
    autocast = "half"                                  # the published ratio that bounds this figure

A message quotes, for the target GPU (the ``gpu`` setting, tcaudit/gpus.py):

- the figure measured on its architecture: ``(H200, torch 2.11: ...)``; with ``gpu = "auto"`` and no
  GPU detected, the one measured GPU, named the same way;
- else, where ``[cost.published]`` names a ratio for the key, NVIDIA's published peak figures for that
  GPU with their source (tcaudit/data/gpus.toml): ``(A100, published, not measured: NVIDIA A100
  datasheet, dense BF16/FP16 Tensor Core 312 vs FP32 19.5 TFLOPS, 16.0× peak)``; ``half`` is the FP16/BF16 Tensor
  Core path autocast takes against FP32, ``tf32`` the TF32 Tensor Core path against FP32;
- else ``(RTX 3090: not measured on this GPU)``.

A rule whose claim is not a speed figure (a bug, a deprecation) says so in ``source`` and has no
``[cost.sm_NN]`` entry.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from tcaudit import gpus
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


def measured(spec: RuleSpec, target: gpus.Target) -> dict | None:
    """The measurements for the target GPU's architecture (``sm_90`` for ``h100``), or the only measured
    GPU when the target is ``auto``; None when there is none for it."""
    entries = measured_entries(spec)
    if target.arch in entries:
        return entries[target.arch]
    if target.setting == gpus.AUTO and len(entries) == 1:
        return next(iter(entries.values()))
    return None


def published_ratios(spec: RuleSpec) -> dict[str, str]:
    """``[cost.published]``: the key a message quotes -> the published ratio (``half``, ``tf32``) that
    bounds it on a GPU nobody measured it on."""
    table = rule_cost(spec).get("published", {})
    return {k: str(v) for k, v in table.items()} if isinstance(table, dict) else {}


PUBLISHED_PATHS = {"half": "half", "tf32": "tf32"}


def published_note(gpu: gpus.Gpu, ratio: str) -> str:
    """``A100, published, not measured: NVIDIA A100 datasheet, dense BF16/FP16 Tensor Core 312 vs FP32
    19.5 TFLOPS, 16.0× peak``, or "" when gpus.toml has no such figure for the GPU."""
    if ratio not in PUBLISHED_PATHS or gpu.fp32 is None:
        return ""
    peak = getattr(gpu, PUBLISHED_PATHS[ratio])
    if peak is None:
        return ""
    path = ("BF16/FP16" if gpu.has_bf16 else "FP16") if ratio == "half" else "TF32"
    return (f"{gpu.name}, published, not measured: {gpu.source}, dense {path} Tensor Core {peak:g} vs "
            f"FP32 {gpu.fp32:g} TFLOPS, {peak / gpu.fp32:.1f}× peak")


def cost_note(spec: RuleSpec, target: gpus.Target, key: str) -> str:
    """The figure a message quotes for the target GPU, naming the GPU: `` (H200, torch 2.11: <figure>)``
    where it was measured, `` (A100, published, not measured: ...)`` where NVIDIA publishes the ratio
    that bounds it, `` (RTX 3090: not measured on this GPU)`` otherwise; ``""`` for ``auto`` with no
    measurement, or a key the rule has no figure for anywhere."""
    entry = measured(spec, target)
    if entry and key in entry:
        label = entry.get("gpu", target.setting)
        torch = entry.get("torch")
        where = f"{label}, torch {torch}" if torch else label
        return f" ({where}: {entry[key]})"
    gpu = target.gpu
    if gpu is None or not any(key in e for e in measured_entries(spec).values()):
        return ""
    ratio = published_ratios(spec).get(key)
    published = published_note(gpu, ratio) if ratio else ""
    if published:
        return f" ({published})"
    return f" ({gpu.name}: not measured on this GPU)"
