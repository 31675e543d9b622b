"""TC100 model-not-audited: the model could not be built or traced; say why instead of guessing.

The message is one line of at most 120 characters: what could not be done and the start of why. The
explanation (``--show-fixes``, JSON ``explanation``) has the first line of why in full and the
setting or flag that would help. ``--verbose`` (or ``TCAUDIT_DEBUG``) puts the whole chain (every
capture method's failure, the full exception text) in the message; ``details`` always holds it.
"""

from __future__ import annotations

import re
from typing import Iterator

from tcaudit.findings import MESSAGE_LIMIT, Finding
from tcaudit.model.facts import ModelFacts
from tcaudit.rules.base import ModelContext, ModelRule

_UNDEFINED = re.compile(r"name '([^']+)' is not defined")
# Where a reason names the exception that stopped the build: the message starts there,
# the location before it (which file, which call) stays in the explanation.
_RAISED = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Warning)\b.*")
_METHOD = re.compile(r"^(export|dynamo|fx): ")
SHORT_REASON = 200
FACTORY_HELP = "give a factory that builds it with [[tool.tcaudit.models]] or --model pkg.mod:factory"
INPUT_HELP = (
    'give the input shape: input = "8x3x224x224" in [[tool.tcaudit.models]] or --model pkg.mod:factory --input 8x3x224x224'
)


def one_line(text: str, limit: int = SHORT_REASON) -> str:
    """The first non-empty line of ``text``, whitespace collapsed, cut (at a word, with "…") at ``limit``
    characters."""
    line = next((part for part in text.splitlines() if part.strip()), "")
    line = " ".join(line.split()).rstrip(".;: ")
    return line if len(line) <= limit else _cut(line, limit - 1) + "…"


def fitted(head: str, reason: str, tail: str = "", limit: int = MESSAGE_LIMIT) -> str:
    """``head + reason + tail`` with ``reason`` cut (at a word, with "…") so the whole fits ``limit``."""
    room = limit - len(head) - len(tail)
    if len(reason) > room:
        reason = _cut(reason, max(room - 1, 0)) + "…"
    return head + reason + tail


def _cut(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` characters where a word ends: before the last space that fits, or
    (one long token: a dotted module path, a file path) after its last ``.``, ``/``, ``_``, ``:`` or ``-`` in
    the second half; mid-token only where the token has neither. A trailing "…" of an earlier cut goes."""
    text = text.removesuffix("…")
    if len(text) <= width:
        return text
    if not text[width].isalnum() and text[width] != "_":  # the cut falls between words already
        return text[:width].rstrip(" ,;:(")
    kept = text[:width]
    if " " in kept:
        return kept.rsplit(" ", 1)[0].rstrip(" ,;:(")
    marks = [kept.rfind(mark) for mark in "./_:-"]
    best = max(marks)
    if best >= width // 2:
        return kept[: best + 1]
    return kept


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
                fitted(f"`{label}` was not audited: ", one_line(facts.reason)),
                details={"reason": facts.reason, "stage": "budget"},
                explanation=f"{facts.reason}.",
            )
            return
        if facts.status == "error":
            # a bug in tcaudit about this model (the audit child, a model rule): this model goes
            # unaudited, the scan goes on (issue 46: it used to end the scan with exit 2)
            reason = one_line(facts.reason)
            yield self.finding(
                context,
                context.target_site(),
                message=(f"could not audit `{label}`: {_flat(facts.reason)}" if verbose
                         else fitted(f"could not audit `{label}`: ", reason)),
                details={"reason": facts.reason, "stage": "internal"},
                explanation=(f"The audit hit an internal error on this model ({reason}); this is a bug in "
                             f"tcaudit (details.reason has the traceback). The other models were audited."),
            )
            return
        if facts.status == "failed":
            reason = one_line(facts.reason) + self._skipped_hint(facts)
            help_text = "" if "[[tool.tcaudit.models]]" in reason else f"; {FACTORY_HELP}"
            head = f"could not build `{label}`: "
            raised = _RAISED.search(reason)
            message = head + _flat(facts.reason) + help_text if verbose else fitted(head, raised.group(0) if raised else reason)
            yield self.finding(
                context,
                context.target_site(),
                message,
                details={"reason": facts.reason, "stage": "build"},
                explanation=f"Building it failed: {reason}{help_text}.",
            )
            return
        if facts.status != "ok" or facts.capture.method != "parameters":
            return
        chain = list(facts.capture.failures) or list(facts.capture.notes) or ["no input shape is known"]
        why = one_line(_METHOD.sub("", chain[0]).split("; give ")[0], 160)  # the help comes once, below
        if verbose:
            message = (f"could not trace `{label}` ({'; '.join(_flat(item) for item in chain)}); "
                       f"only the checks on layer parameters ran; {INPUT_HELP}")
        else:
            message = fitted(f"could not trace `{label}` (", why, "); only parameter checks ran")
        yield self.finding(
            context,
            context.target_site(),
            message,
            details={"reason": "; ".join(chain), "stage": "trace", "capture_failures": facts.capture.failures},
            explanation=(f"Tracing its forward failed ({why}), so only the checks on layer parameters ran; "
                         f"{INPUT_HELP}."),
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
