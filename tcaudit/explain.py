"""``tcaudit explain CODE``: one rule's page, with ruff's headings, from its rules/ file."""

from __future__ import annotations

import textwrap

from tcaudit.catalog import RuleSpec


def render_explanation(spec: RuleSpec) -> str:
    lines = [f"# {spec.name} ({spec.id})", ""]
    lines.append(f"Family: {spec.family_name} · Severity: {spec.severity} · Fix: {spec.fix_class or 'none'}"
                 + (" · Needs the model audit" if spec.needs == "model" else ""))
    lines += ["", "## What it does", "", spec.summary, "", "## Why is this bad?", "", spec.why.strip(), ""]
    if spec.bad or spec.good:
        lines += ["## Example", ""]
        for example in spec.bad[:1]:
            lines += ["```python", example.code.strip("\n"), "```", ""]
        if spec.good:
            lines += ["Use instead:", "", "```python", spec.good[0].code.strip("\n"), "```", ""]
    lines += ["## Fix safety", "", spec.fix_safety or "This rule has no automatic fix.", ""]
    return "\n".join(textwrap.dedent(line) if i == 0 else line for i, line in enumerate(lines)) + "\n"
