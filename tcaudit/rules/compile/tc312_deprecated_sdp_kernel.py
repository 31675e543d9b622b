"""TC312 deprecated-sdp-kernel: ``torch.backends.cuda.sdp_kernel(...)``, deprecated since PyTorch 2.3.

Fix (safe): ``torch.nn.attention.sdpa_kernel([...])`` with the list of the backends the old flags
enabled (``enable_flash`` → ``FLASH_ATTENTION``, ``enable_mem_efficient`` → ``EFFICIENT_ATTENTION``,
``enable_math`` → ``MATH``, ``enable_cudnn`` → ``CUDNN_ATTENTION``; a flag left out was True).
Declined where a flag is not a literal True/False, or where every backend is disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import ScriptFacts

DEPRECATED = {"torch.backends.cuda.sdp_kernel"}
# The old flags, in their positional order, and the backend each enables.
FLAGS = (
    ("enable_flash", "FLASH_ATTENTION"),
    ("enable_math", "MATH"),
    ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
    ("enable_cudnn", "CUDNN_ATTENTION"),
)


@dataclass(frozen=True, eq=False)
class UseSdpaKernel(FixPlan):
    kind = "replace-call"
    call: cst.Call
    code: str


class DeprecatedSdpKernel(ScriptRule):
    id = "TC312"
    triggers = (r"sdp_kernel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for call in facts.calls:
            if call.qualname not in DEPRECATED:
                continue

            def plan(call=call) -> UseSdpaKernel:
                return UseSdpaKernel(call.node, _replacement(facts, call.node))

            yield self.finding(
                facts,
                call.node,
                "`torch.backends.cuda.sdp_kernel` is deprecated; use `torch.nn.attention.sdpa_kernel`",
                explanation=("It warns on every use and will be removed; `torch.nn.attention.sdpa_kernel` takes "
                             "the list of backends to allow."),
                fix=self.planned_fix(FixClass.SAFE, "use torch.nn.attention.sdpa_kernel([...])", plan),
            )


def _replacement(facts: ScriptFacts, call: cst.Call) -> str:
    enabled = {flag: True for flag, _ in FLAGS}
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args):
        raise DeclineFix("the flags are passed through * or **; list the backends by hand")
    if len(positional) > len(FLAGS):
        raise DeclineFix("more positional arguments than sdp_kernel takes")
    given = [(FLAGS[i][0], a.value) for i, a in enumerate(positional)]
    given += [(a.keyword.value, a.value) for a in call.args if a.keyword is not None]
    for flag, value in given:
        if flag not in enabled:
            raise DeclineFix(f"unknown argument `{flag}`")
        if not (isinstance(value, cst.Name) and value.value in ("True", "False")):
            raise DeclineFix(f"`{flag}` is not a literal True or False; choose the backends by hand")
        enabled[flag] = value.value == "True"
    torch = torch_import_name(facts) or "torch"
    backends = [f"{torch}.nn.attention.SDPBackend.{name}" for flag, name in FLAGS if enabled[flag]]
    if not backends:
        raise DeclineFix("every backend is disabled; sdpa_kernel needs at least one")
    return f"{torch}.nn.attention.sdpa_kernel([{', '.join(backends)}])"


class DeprecatedSdpKernelFix(Codemod):
    rule = "TC312"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans = {f.fix.plan.call: parse_expression(f.fix.plan.code, module) for f in findings}
        return module.visit(_ReplaceCalls(plans))


class _ReplaceCalls(cst.CSTTransformer):
    def __init__(self, replacements: dict[cst.Call, cst.BaseExpression]) -> None:
        super().__init__()
        self.replacements = replacements

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        replacement = self.replacements.get(original_node)
        return updated_node if replacement is None else replacement
