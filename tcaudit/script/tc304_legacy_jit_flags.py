"""TC304 legacy-jit-flags: private TorchScript executor flags set in an eager training script."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

JIT_FLAGS = (
    "torch._C._jit_set_profiling_executor",
    "torch._C._jit_set_profiling_mode",
    "torch._C._jit_override_can_fuse_on_cpu",
    "torch._C._jit_override_can_fuse_on_gpu",
    "torch._C._jit_set_texpr_fuser_enabled",
    "torch._C._jit_set_nvfuser_enabled",
    "torch._C._jit_set_bailout_depth",
    "torch._C._get_graph_executor_optimize",
    "torch._C._set_graph_executor_optimize",
)


class LegacyJitFlags(ScriptRule):
    id = "TC304"
    triggers = (r"_jit_|graph_executor_optimize",)  # and a training step, checked below

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not (facts.training_steps or facts.optimizer_steps):
            return  # a training-script rule: library code that implements the fusers is not its target
        if any((r.qualname or "").startswith("torch.jit.") for r in facts.references):
            return  # the script does use TorchScript: the flags are deliberate
        for call in facts.calls:
            qual = call.qualname or ""
            if qual not in JIT_FLAGS:
                continue
            statement = call.statement.node if call.statement else call.node
            yield self.finding(
                facts,
                call.node,
                f"`{qual.removeprefix('torch._C.')}` is a private TorchScript executor flag: it does nothing "
                "for an eager or torch.compile training step and may vanish in any release; remove it",
                fix=Fix(FixClass.SAFE, "delete the call", anchor={"kind": "delete-statement",
                                                                  "line": facts.line_of(statement)}),
            )
