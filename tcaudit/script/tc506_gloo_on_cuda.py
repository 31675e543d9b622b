"""TC506 gloo-on-cuda: ``init_process_group(backend="gloo")`` in a script that trains on CUDA."""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.distributed import distributed_facts, in_test_code, literal_value
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

# The script puts its model or tensors on a GPU (not just mentions CUDA in a check).
_CUDA_TRAINING = re.compile(
    r"\.cuda\(|[\"']cuda|torch\.cuda\.set_device|\bdevice_ids\s*=|\bnccl\b|torch\.accelerator"
)


def _always_gloo(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    """Every value the backend expression may take is the string "gloo" (a conditional that can pick
    NCCL, or anything we cannot evaluate, is not)."""
    leaves = []
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue
        if isinstance(value, (cst.Name, cst.Attribute)) and facts.bindings_of(facts.module.code_for_node(value)):
            continue  # an assigned name: its values are in the list
        leaves.append(value)
    return bool(leaves) and all(literal_value(v) == "gloo" for v in leaves)


class GlooOnCuda(ScriptRule):
    id = "TC506"
    triggers = (r"gloo",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not _CUDA_TRAINING.search(info.text):
            return
        if not (facts.training_steps or facts.optimizer_steps or info.is_ddp_script):
            return
        for call in info.init_process_group_calls:
            if in_test_code(call.ctx):
                continue
            backend = call.arg("backend", 0)
            if backend is None or not _always_gloo(facts, backend):
                continue
            yield self.finding(
                facts,
                backend,
                'init_process_group(backend="gloo") in a CUDA script: gloo all-reduces GPU gradients '
                "through host memory, NCCL keeps them on the GPUs and uses NVLink",
                fix=Fix(
                    FixClass.SAFE,
                    'backend="nccl" if torch.cuda.is_available() else "gloo"',
                    anchor={"kind": "replace-expression", "line": facts.line_of(backend),
                            "old": facts.module.code_for_node(backend),
                            "new": '"nccl" if torch.cuda.is_available() else "gloo"'},
                ),
            )
