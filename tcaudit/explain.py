"""``tcaudit explain CODE``: one rule's page, with ruff's headings, from its rules/ file."""

from __future__ import annotations

import textwrap

from tcaudit.catalog import RuleSpec


def _code_block(code: str) -> list[str]:
    return ["```python", textwrap.dedent(code).strip("\n"), "```", ""]


def render_explanation(spec: RuleSpec) -> str:
    facts = f"Family: {spec.family_name} · Severity: {spec.severity} · Fix: {spec.fix_class or 'none'}"
    if spec.needs == "model":
        facts += " · Needs the model audit"
    lines = [f"# {spec.name} ({spec.id})", "", facts, ""]
    lines += ["## What it does", "", spec.summary, "", "## Why is this bad?", "", spec.why.strip(), ""]
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
    return "\n".join(lines)
