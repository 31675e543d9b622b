"""``tcaudit explain CODE``: one rule's page, with ruff's headings, from its rules/ file.

Piped, the page is plain Markdown-like text; in a terminal its measured-cost section is a rich table
(the rest of the page stays text, so code examples keep their exact lines)."""

from __future__ import annotations

import textwrap
from typing import TextIO

from tcaudit import gpus
from tcaudit.catalog import RuleSpec
from tcaudit.costs import figures, measured_entries, published_note, published_ratios, rule_cost

COST_HEADING = "## Measured cost"
QUOTED = (
    "Messages quote the figure measured on the target GPU's architecture (the `gpu` setting; with `auto`, "
    "the GPU nvidia-smi reports, or the one GPU measured when none is found), NVIDIA's published figure "
    "for another GPU where one bounds it (below), and say \"not measured on this GPU\" otherwise."
)
# The model audit's messages read its own cost table (tcaudit/model/cost.py), not these figures.
QUOTED_BY_THE_AUDIT = (
    "The model audit's messages quote its cost table for the target GPU (`tcaudit calibrate` writes "
    "yours); without one for that GPU they quote the H200's and name it."
)


def _code_block(code: str) -> list[str]:
    return ["```python", textwrap.dedent(code).strip("\n"), "```", ""]


def _where(arch: str, entry: dict) -> str:
    gpu = entry.get("gpu", arch)
    torch = entry.get("torch")
    return f"{gpu} ({arch}), torch {torch}" if torch else f"{gpu} ({arch})"


def _head(spec: RuleSpec) -> list[str]:
    facts = f"Family: {spec.family_name} · Severity: {spec.severity} · Fix: {spec.fix_class or 'none'}"
    if spec.needs == "model":
        facts += " · Needs the model audit"
    lines = [f"# {spec.name} ({spec.id})", "", facts, ""]
    return lines + ["## What it does", "", spec.summary, "", "## Why is this bad?", "", spec.why.strip(), ""]


def _tail(spec: RuleSpec) -> list[str]:
    lines: list[str] = []
    if spec.bad or spec.good:
        lines += ["## Example", ""]
        if spec.bad:
            lines += _code_block(spec.bad[0].code)
        if spec.good:
            if spec.bad:
                lines += ["Use instead:", ""]
            lines += _code_block(spec.good[0].code)
    lines += ["## Fix safety", "", spec.fix_safety or "This rule has no automatic fix.", ""]
    fixable = next((example for example in spec.bad if example.fixed is not None), None)
    if fixable is not None:
        lines += ["`tcaudit fix` turns", ""] + _code_block(fixable.code) + ["into", ""] + _code_block(fixable.fixed)
    return lines


def _quoted(spec: RuleSpec) -> str:
    return QUOTED_BY_THE_AUDIT if spec.needs == "model" else QUOTED


def _source(spec: RuleSpec) -> str:
    return str(rule_cost(spec).get("source", "")).strip()


def cost_lines(spec: RuleSpec) -> list[str]:
    """The page's measured-cost section as plain text; [] for a rule without a ``[cost]`` table."""
    if not rule_cost(spec):
        return []
    lines = [COST_HEADING, ""]
    source = _source(spec)
    if source:
        lines += [f"Source: {source}", ""]
    entries = measured_entries(spec)
    for arch, entry in entries.items():
        lines += [f"- {_where(arch, entry)}, {key}: {figure}" for key, figure in figures(entry).items()]
    if entries:
        lines += ["", _quoted(spec), ""]
    else:
        lines += ["No figure measured on a GPU: messages quote none.", ""]
    return lines + published_lines(spec)


def published_lines(spec: RuleSpec) -> list[str]:
    """What messages quote on the GPUs nobody measured the rule on: NVIDIA's published peak figures
    (tcaudit/data/gpus.toml), one line per GPU and key, labelled as published."""
    lines: list[str] = []
    for key, ratio in published_ratios(spec).items():
        for gpu in gpus.gpus().values():
            if key in measured_entries(spec).get(gpu.sm, {}):
                continue  # measured on this architecture: messages quote the measurement
            note = published_note(gpu, ratio)
            lines.append(f"- {gpu.label}, {key}: {note} ({gpu.detail})" if note else
                         f"- {gpu.label}, {key}: not measured on this GPU, and no published figure kept")
    if lines:
        lines = ["Published, not measured (tcaudit/data/gpus.toml), for the other GPUs:", ""] + lines + [""]
    return lines


def render_explanation(spec: RuleSpec) -> str:
    return "\n".join(_head(spec) + cost_lines(spec) + _tail(spec))


def print_explanation(spec: RuleSpec, stream: TextIO) -> None:
    """The page for a terminal: the same text, with the measured costs as a rich table."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream, highlight=False, soft_wrap=True, emoji=False)
    console.print("\n".join(_head(spec)), markup=False)
    if rule_cost(spec):
        entries = measured_entries(spec)
        table = Table(title=f"Measured cost ({spec.id})", title_justify="left", caption_justify="left",
                      caption=Text(f"Source: {_source(spec)}") if _source(spec) else None)
        for column in ("GPU", "torch", "key", "figure"):
            table.add_column(column, overflow="fold")
        for arch, entry in entries.items():
            for key, figure in figures(entry).items():
                # Text, not markup: a figure may hold brackets (a confidence interval [2.56, 2.58]).
                cells = (f"{entry.get('gpu', arch)} ({arch})", str(entry.get("torch", "")), key, figure)
                table.add_row(*(Text(cell) for cell in cells))
        if not entries:
            table.add_row("none", "", "", "no figure measured on a GPU: messages quote none")
        console.print(table)
        console.print((_quoted(spec) if entries else "") + "\n", markup=False)
        if published_lines(spec):
            console.print("\n".join(published_lines(spec)), markup=False)
    console.print("\n".join(_tail(spec)), markup=False)
