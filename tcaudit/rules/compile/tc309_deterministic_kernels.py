"""TC309 deterministic-kernels: deterministic cuDNN / algorithms, or cuDNN autotuning turned off, in
a script that trains on CUDA.

Reported as `info` with what it costs: determinism is often intended (a reproducibility flag, a
paper's seed), so there is no automatic fix, and a setting behind a condition (``if args.seed is not
None:``, as the pytorch/examples ImageNet script does) is that intent already exposed: not reported. TC302 stays silent on an explicit
``cudnn.benchmark = False``; this rule is where that choice is named and priced.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.triggers import all_of
from tcaudit.source.walk import walk

SETTINGS = {
    # qualified name of the assigned attribute -> the value that costs speed, and what it does
    "torch.backends.cudnn.deterministic": (
        "True", "restricts cuDNN to deterministic convolution algorithms, often not the fastest ones"),
    "torch.backends.cudnn.benchmark": (
        "False", "makes cuDNN take its heuristic's convolution algorithm instead of timing the candidates "
        "for each shape"),
}
CALLS = {
    "torch.use_deterministic_algorithms": (
        "True", "makes every op with a deterministic variant use it (slower scatter/index kernels, "
        "deterministic cuDNN, and a cuBLAS workspace setting), and raises on ops without one"),
}


class DeterministicKernels(ScriptRule):
    id = "TC309"
    triggers = (all_of(r"deterministic\s*=|benchmark\s*=|use_deterministic_algorithms", BACKWARD_CALL, CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        frames = {id(b.value): b.ctx for b in facts.bindings}
        for node in _assignments(facts.module):
            target = node.targets[0].target
            qualname = facts.qualname(target)
            spec = SETTINGS.get(qualname or "")
            if spec is None or not _is_literal(node.value, spec[0]):
                continue
            if id(node.value) in frames and pipeline.is_flag_guarded(frames[id(node.value)]):
                continue
            yield self._finding(facts, node, f"`{facts.code(target)} = {spec[0]}`", spec[1])
        for call in facts.calls:
            spec = CALLS.get(call.qualname or "")
            if spec is None or not call.node.args or not _is_literal(call.node.args[0].value, spec[0]):
                continue
            if pipeline.is_flag_guarded(call.ctx):
                continue
            yield self._finding(facts, call.node, f"`{call.name}({spec[0]})`", spec[1])

    def _finding(self, facts: ScriptFacts, node: cst.CSTNode, what: str, effect: str) -> Finding:
        return self.finding(
            facts, node,
            f"{what} in a training script trades speed for reproducibility",
            explanation=(f"It {effect}; keep it only if bit-for-bit reproducibility is wanted (behind a "
                         "flag, as for a seed)."),
        )


def _assignments(module: cst.Module) -> Iterator[cst.Assign]:
    class Collect(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list[cst.Assign] = []

        def visit_Assign(self, node: cst.Assign) -> None:
            if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Attribute):
                self.found.append(node)

    collector = Collect()
    walk(module, collector)
    return iter(collector.found)


def _is_literal(node: cst.BaseExpression, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value
