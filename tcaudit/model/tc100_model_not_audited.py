"""TC100 model-not-audited: the model could not be built or traced; say why instead of guessing.

The message is one line: what could not be done, the first line of why, and the setting or flag
that would help. ``--verbose`` (or ``TCAUDIT_DEBUG``) adds the whole chain (every capture method's
failure, the full exception text); ``details`` always holds it.
"""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import ModelFacts
from tcaudit.model.rules import ModelContext, ModelRule

_UNDEFINED = re.compile(r"name '([^']+)' is not defined")
_METHOD = re.compile(r"^(export|dynamo|fx): ")
SHORT_REASON = 200
FACTORY_HELP = "give a factory that builds it with [[tool.tcaudit.models]] or --model pkg.mod:factory"
INPUT_HELP = (
    'give the input shape: input = "8x3x224x224" in [[tool.tcaudit.models]] or --model pkg.mod:factory --input 8x3x224x224'
)


def one_line(text: str, limit: int = SHORT_REASON) -> str:
    """The first non-empty line of ``text``, whitespace collapsed, cut at ``limit`` characters."""
    line = next((part for part in text.splitlines() if part.strip()), "")
    line = " ".join(line.split()).rstrip(".;: ")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _flat(text: str) -> str:
    return " | ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())


class ModelNotAudited(ModelRule):
    id = "TC100"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        label = facts.target.get("label") or facts.model_class or "the model"
        verbose = getattr(context.settings, "verbose", False)
        if facts.status == "budget":
            yield self.finding(
                context,
                context.target_site(),
                f"`{label}` was not audited: {facts.reason}",
                details={"reason": facts.reason, "stage": "budget"},
            )
            return
        if facts.status == "failed":
            reason = _flat(facts.reason) if verbose else one_line(facts.reason)
            reason += self._skipped_hint(facts)
            help_text = "" if "[[tool.tcaudit.models]]" in reason else f"; {FACTORY_HELP}"
            yield self.finding(
                context,
                context.target_site(),
                f"could not build `{label}` for the model audit: {reason}{help_text}",
                details={"reason": facts.reason, "stage": "build"},
            )
            return
        if facts.status != "ok" or facts.capture.method != "parameters":
            return
        chain = list(facts.capture.failures) or list(facts.capture.notes) or ["no input shape is known"]
        if verbose:
            why = "; ".join(_flat(item) for item in chain)
        else:
            why = one_line(_METHOD.sub("", chain[0]).split("; give ")[0], 160)  # the help comes once, below
        message = f"could not trace `{label}` ({why}); only the checks on layer parameters ran; {INPUT_HELP}"
        yield self.finding(
            context,
            context.target_site(),
            message,
            details={"reason": "; ".join(chain), "stage": "trace", "capture_failures": facts.capture.failures},
        )

    @staticmethod
    def _skipped_hint(facts: ModelFacts) -> str:
        """A NameError for a name the slicer left out on purpose: say which line and why."""
        match = _UNDEFINED.search(facts.reason)
        if not match:
            return ""
        name = match.group(1)
        for note in facts.target.get("skipped", []):
            bound = note.rpartition("it binds ")[2].split(", ")
            if name in bound:
                return f" ({note.rpartition('; it binds')[0]})"
        return ""
