"""TC100 model-not-audited: the model could not be built or traced; say why instead of guessing."""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.facts import ModelFacts
from tcaudit.model.rules import ModelContext, ModelRule

_UNDEFINED = re.compile(r"name '([^']+)' is not defined")


class ModelNotAudited(ModelRule):
    id = "TC100"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        label = facts.target.get("label") or facts.model_class or "the model"
        if facts.status == "failed":
            reason = facts.reason.rstrip(".")
            reason += self._skipped_hint(facts)
            yield self.finding(
                context,
                context.target_site(),
                f"could not build `{label}` for the model audit: {reason}; no TC1 checks ran for it",
                details={"reason": facts.reason, "stage": "build"},
            )
            return
        if facts.status != "ok" or facts.capture.method != "parameters":
            return
        if facts.capture.failures:
            why = "; ".join(facts.capture.failures)
            message = f"could not trace `{label}` ({why}); only the checks on layer parameters ran"
        else:
            why = "; ".join(facts.capture.notes) or "no input shape is known"
            message = f"could not trace `{label}`: {why}; only the checks on layer parameters ran"
        yield self.finding(
            context,
            context.target_site(),
            message,
            details={"reason": why, "stage": "trace", "capture_failures": facts.capture.failures},
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
