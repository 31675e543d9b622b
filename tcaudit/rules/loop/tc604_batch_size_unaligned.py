"""TC604 batch-size-unaligned: a literal training batch size that is not a multiple of 8 (info).

No automatic fix: the finding names the two aligned sizes, and the fix is declined because the batch
size changes the optimisation.
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.distributed import EVAL_NAME, DistributedFacts, distributed_facts, in_test_code, literal_value
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import evaluated_value

ALIGNMENT = 8
_BATCH_FLAG = re.compile(r"^--?(train[-_]?)?(batch[-_]?size|bs|bsz)$", re.IGNORECASE)
_BATCH_NAME = re.compile(r"^(train_?)?(batch_?size|bs|bsz)$", re.IGNORECASE)
# Token models: the GEMM M dimension is batch × sequence length, aligned whatever the batch. A whole word's
# left edge is checked after its letters (``bptt(?<!\wbptt)`` is ``\bbptt``): a pattern whose branches all
# start with a letter is searched for by those letters, ten times faster over a whole file.
_SEQUENCE_MODEL = re.compile(
    r"block_size|seq_len|seq_length|sequence_length|max_len|max_length|context_length|ctx_len|bptt(?<!\wbptt)\b|"
    r"n_ctx|max_seq|num_tokens|tokeniz|Embedding|Transformer|LSTM(?<!\wLSTM)\b|GRU(?<!\wGRU)\b|RNN(?<!\wRNN)\b"
)


def _unaligned(value: object) -> bool:
    # Batches under 8 (1, 2, 4: large images, detection, RL) are chosen for memory, not speed.
    return isinstance(value, int) and not isinstance(value, bool) and value > ALIGNMENT and value % ALIGNMENT != 0


class BatchSizeUnaligned(ScriptRule):
    id = "TC604"
    triggers = (r"(?is)\A(?=.*(?:\.backward\(|\.step\()).*(?:batch[-_]?size|bsz?\b)",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not facts.uses_accelerator or not info.step_calls or _SEQUENCE_MODEL.search(info.text):
            return
        cost = context.cost(self.spec, "batch")
        for node, where in self._literals(facts, info):
            value = literal_value(node)
            if not _unaligned(value):
                continue
            assert isinstance(value, int)
            lower, upper = value - value % ALIGNMENT, value - value % ALIGNMENT + ALIGNMENT
            yield self.finding(
                facts,
                node,
                f"training batch size {value} ({where}) is not a multiple of {ALIGNMENT}",
                explanation=f"{lower} or {upper} would align the GEMMs whose M dimension is the batch{cost}.",
                fix=Fix(
                    FixClass.NUMERICS,
                    f"use a batch size of {lower} or {upper}",
                    available=False,
                    reason="the batch size changes the optimisation (learning-rate scaling, steps per epoch); "
                    "choose it by hand",
                ),
            )

    def _literals(self, facts: ScriptFacts, info: DistributedFacts) -> Iterator[tuple[cst.BaseExpression, str]]:
        for call in info.dataloaders:
            value = call.arg("batch_size", 1)
            if value is None or not isinstance(value, cst.Integer) or facts.in_eval(call.ctx) or in_test_code(call.ctx):
                continue
            name = info.dataloader_name(call) or ""
            dataset = call.arg("dataset", 0)
            if EVAL_NAME.search(name) or (dataset is not None and EVAL_NAME.search(facts.code(dataset))):
                continue
            yield value, "DataLoader batch_size"
        for call in facts.method_calls("add_argument"):
            if in_test_code(call.ctx):
                continue
            flags = [literal_value(a.value) for a in call.node.args if a.keyword is None]
            dest = literal_value(call.arg("dest"))
            if not any(isinstance(f, str) and _BATCH_FLAG.match(f) for f in flags) and not (
                isinstance(dest, str) and _BATCH_NAME.match(dest)
            ):
                continue
            value = call.arg("default")
            if isinstance(value, cst.Integer):
                yield value, "argparse default"
        for binding in facts.bindings:
            if isinstance(binding.value, cst.Integer) and _BATCH_NAME.match(binding.target.split(".")[-1]):
                if not facts.in_eval(binding.ctx) and not in_test_code(binding.ctx):
                    yield binding.value, f"`{binding.target}`"
        for dict_node in self._dicts(facts):
            for element in dict_node.elements:
                if (
                    isinstance(element, cst.DictElement)
                    and isinstance(element.key, cst.SimpleString)
                    and isinstance(element.value, cst.Integer)
                    and _BATCH_NAME.match(str(evaluated_value(element.key)))
                ):
                    owner = info.target_of(dict_node) or ""
                    if not EVAL_NAME.search(owner):
                        yield element.value, f"`{owner or 'dict'}[{element.key.value}]`"

    @staticmethod
    def _dicts(facts: ScriptFacts) -> list[cst.Dict]:
        return [b.value for b in facts.bindings if isinstance(b.value, cst.Dict)]
