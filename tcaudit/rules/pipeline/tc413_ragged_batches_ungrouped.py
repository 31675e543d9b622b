"""TC413 ragged-batches-ungrouped: a Hugging Face Trainer pads random batches of variable-length examples.

Detects a ``Trainer``/``Seq2SeqTrainer``/``SFTTrainer`` whose ``data_collator`` is one of transformers'
padding collators (``DataCollatorWithPadding``, ``DataCollatorForSeq2Seq``,
``DataCollatorForTokenClassification``) and whose training arguments, built in the same file (or by a
function of another project module, then reported at the trainer), leave the sampler at random (neither
``train_sampling_strategy`` nor, before transformers 5, ``group_by_length`` written): each batch is padded
to its longest example and the padding is computed like real tokens. Silent where the arguments run on
the CPU, pack sequences (TRL's ``packing``/``padding_free``), or the file pads every example to one
length (``padding="max_length"``) or streams its dataset (the Trainer ignores the sampler for an
``IterableDataset``). Info, no fix: grouping by length changes which examples share a batch, which is the
user's call.
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.project.frameworks import LoopOwner, hf_trainer_calls, loop_owners, owners_reached
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import strip_comments
from tcaudit.source.triggers import all_of

PADDING_COLLATORS = frozenset({"DataCollatorWithPadding", "DataCollatorForSeq2Seq",
                               "DataCollatorForTokenClassification"})
# Written with any value, these decide how batches are drawn or padded: the user's choice.
_GROUPING = ("train_sampling_strategy", "group_by_length", "packing", "padding_free")
_ONE_LENGTH = re.compile(r"""padding\s*=\s*["']max_length["']|streaming\s*=\s*True""")
_OPTION = 'train_sampling_strategy="group_by_length"'


class RaggedBatchesUngrouped(ScriptRule):
    id = "TC413"
    # The arguments may come from another module: then the trainer's call is what the file holds.
    triggers = (all_of(r"TrainingArguments|SFTConfig|HfArgumentParser|Trainer\b",
                       r"DataCollator(?:WithPadding|ForSeq2Seq|ForTokenClassification)"),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if _ONE_LENGTH.search(strip_comments(facts.source.text)):
            return
        values = context.values(facts)
        owners = [owner for owner in loop_owners(facts) if owner.framework == "transformers"]
        reported: set[int] = set()
        elsewhere = {id(trainer.node): owner for trainer, owner in owners_reached(facts, context.project(facts))}
        for trainer in hf_trainer_calls(facts):
            collator = _padding_collator(facts, trainer)
            owner = _arguments_of(facts, trainer, owners)
            built_elsewhere = owner is None and id(trainer.node) in elsewhere
            owner = owner or elsewhere.get(id(trainer.node))
            if collator is None or owner is None or id(owner) in reported or owner.cpu_only(values):
                continue
            if owner.call.has_star_kwargs or any(_decided(owner, values, key) for key in _GROUPING):
                continue
            reported.add(id(owner))
            name = collator.qualname.rpartition(".")[2] if collator.qualname else "the collator"
            related = [self.place(facts, collator.node.func, f"`{name}` pads each batch to its longest example")]
            if built_elsewhere:
                related.append(self.place(owner.facts, owner.node.func, f"the {owner.label} this trainer gets: "
                                          "batches drawn at random"))
            yield self.finding(
                facts,
                trainer.node.func if built_elsewhere else owner.node.func,
                f"`{owner.label}` batches at random and `{name}` pads each to its longest",
                explanation=f"The model computes the padding tokens like real ones (the attention mask only hides "
                "them), so where the examples' lengths vary widely a large share of each step's matmuls is padding. "
                f"`{_OPTION}` (`group_by_length=True` before transformers 5) puts examples of similar length in "
                "one batch and cuts it; how much depends on the spread of the lengths (not measured by tcaudit)."
                + (f" The arguments are built in {owner.where}." if built_elsewhere else ""),
                fix=Fix(FixClass.NUMERICS, "group examples of similar length", available=False,
                        reason=_reason(owner, owner.where if built_elsewhere else None)),
                related=related,
            )


def _padding_collator(facts: ScriptFacts, trainer: CallSite) -> CallSite | None:
    """The transformers padding collator the trainer gets as ``data_collator`` (built there or bound to a name)."""
    given = trainer.arg("data_collator", 2)
    if given is None:
        return None
    calls = {id(call.node): call for call in facts.calls}
    for value in facts.binding_values(given):
        call = calls.get(id(value)) if isinstance(value, cst.Call) else None
        qual = (call.qualname or "") if call is not None else ""
        if qual.partition(".")[0] == "transformers" and qual.rpartition(".")[2] in PADDING_COLLATORS:
            return call
    return None


def _arguments_of(facts: ScriptFacts, trainer: CallSite, owners: list[LoopOwner]) -> LoopOwner | None:
    """The training arguments of this file the trainer gets (``args=``): built there or bound to a name; the
    file's only arguments where the name cannot be followed (``HfArgumentParser``'s unpacked result)."""
    given = trainer.arg("args", 1)
    if given is None:
        return None
    by_node = {id(owner.node): owner for owner in owners}
    for value in facts.binding_values(given):
        if id(value) in by_node:
            return by_node[id(value)]
    parsed = [owner for owner in owners if owner.parsed_by is not None]
    return parsed[0] if len(owners) == 1 and parsed else None


def _decided(owner: LoopOwner, values, key: str) -> bool:
    setting = owner.setting(values, key)
    if owner.parsed_by is not None:
        return setting.values is None  # assigned after parsing: decided where tcaudit does not follow
    return setting.arg is not None


def _reason(owner: LoopOwner, where: str | None = None) -> str:
    why = ("grouping changes which examples share a batch (the order stays random only between groups of similar "
           "length) and with it the training trajectory; where length goes with the label, batches become skewed. "
           "Whether that suits the task is the user's call")
    if owner.parsed_by is not None:
        return f"{why}: pass `--train_sampling_strategy group_by_length` (`--group_by_length` before transformers 5)"
    there = f" in {where}, where the arguments are built," if where else ""
    return f"{why}: set `{_OPTION}` (`group_by_length=True` before transformers 5){there} by hand"
