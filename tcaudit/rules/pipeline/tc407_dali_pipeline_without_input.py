"""TC407 dali-pipeline-without-input: a DALI ``@pipeline_def`` that reads nothing.

A pipeline's data enters through a reader (``fn.readers.*``) or ``fn.external_source``; a pipeline
function with neither (decoders and augmentations only, as in copied snippets) fails when it is
built, so the GPU input pipeline the script meant to use never runs. No automatic fix: which files
to read, and how, is the author's.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.facts import ScriptFacts

PIPELINE_DEF = {"nvidia.dali.pipeline_def", "nvidia.dali.pipeline.pipeline_def"}
INPUTS = ("nvidia.dali.fn.readers.", "nvidia.dali.fn.external_source", "nvidia.dali.ops.readers.",
          "nvidia.dali.ops.ExternalSource", "nvidia.dali.plugin.numba.fn.experimental.numba_function")


class DaliPipelineWithoutInput(ScriptRule):
    id = "TC407"
    triggers = (r"pipeline_def",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for function, _ in facts.functions:
            if not any(_decorator_qualname(facts, d) in PIPELINE_DEF for d in function.decorators):
                continue
            calls = facts.calls_in(function)
            if any((c.qualname or "").startswith(INPUTS) for c in calls):
                continue
            if any(c.qualname is None and c.name and not c.name.startswith("fn.") for c in calls):
                continue  # a helper of the file's own may read the data: do not guess
            yield self.finding(
                facts, function.name,
                f"DALI pipeline `{function.name.value}` has no reader and no external source: building it fails",
                explanation=("A pipeline needs a `fn.readers.*` reader or an `fn.external_source` to get data "
                             "from; without one it has nothing to decode."),
            )


def _decorator_qualname(facts: ScriptFacts, decorator: cst.Decorator) -> str | None:
    node = decorator.decorator
    if isinstance(node, cst.Call):
        node = node.func
    return facts.qualname(node)
