"""TC412 collator-pad-multiple: a transformers data collator pads each batch to its longest sequence.

Detects ``DataCollatorWithPadding``, ``DataCollatorForSeq2Seq``, ``DataCollatorForTokenClassification``,
``DataCollatorForLanguageModeling`` and ``DataCollatorForMultipleChoice`` built without
``pad_to_multiple_of`` where a GPU may train with them (a Hugging Face trainer or a framework owner of
the file that is not visibly on the CPU, or CUDA named in the file).
Fix (numerics): pass ``pad_to_multiple_of=8``; declined where a ``**kwargs`` may already pass it.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass
from tcaudit.project.frameworks import hf_trainer_calls, loop_owners
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, KeywordPlan, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import keyword

COLLATORS = frozenset({"DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DataCollatorForTokenClassification",
                       "DataCollatorForLanguageModeling", "DataCollatorForMultipleChoice"})
MULTIPLE = 8


class CollatorPadMultiple(ScriptRule):
    id = "TC412"
    triggers = (r"DataCollator(?:WithPadding|ForSeq2Seq|ForTokenClassification|ForLanguageModeling|ForMultipleChoice)",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not _may_train_on_gpu(facts, context):
            return
        for call in facts.calls:
            qual = call.qualname or ""
            name = qual.rpartition(".")[2]
            if qual.partition(".")[0] != "transformers" or name not in COLLATORS:
                continue
            if keyword(call.node, "pad_to_multiple_of") is not None:
                continue
            yield self.finding(
                facts,
                call.node.func,
                f"`{name}` pads each batch to its longest sequence, rarely a multiple of {MULTIPLE}",
                explanation="A sequence length that is not a multiple of 8 makes the attention matmuls (and any "
                "GEMM whose K is the sequence) miss the Tensor Cores' 16-byte alignment under fp16/bf16; "
                f"`pad_to_multiple_of={MULTIPLE}` costs a few padding tokens per batch.",
                fix=self.planned_fix(FixClass.NUMERICS, f"pass pad_to_multiple_of={MULTIPLE}",
                                     lambda call=call: _plan(call)),
            )


def _may_train_on_gpu(facts: ScriptFacts, context: RuleContext) -> bool:
    owners = loop_owners(facts)
    if owners:
        values = context.values(facts)
        return not all(owner.cpu_only(values) for owner in owners)
    return bool(hf_trainer_calls(facts)) or facts.uses_cuda


def _plan(call: CallSite) -> KeywordPlan:
    if call.has_star_kwargs:
        raise DeclineFix("the collator gets `**kwargs`, which may pass pad_to_multiple_of; a second one would be a "
                         "TypeError")
    return AddKeyword(call.node, "pad_to_multiple_of", str(MULTIPLE))


# -- the fix ------------------------------------------------------------------------------------------


class CollatorPadMultipleFix(Codemod):
    rule = "TC412"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[KeywordPlan] = [finding.fix.plan for finding in findings]
        return apply_keyword_edits(module, plans)
