"""TC315 checkpoint-use-reentrant: ``torch.utils.checkpoint.checkpoint(...)`` without ``use_reentrant``.

Since PyTorch 2.1 a call that leaves ``use_reentrant`` out warns on every call (every training step)
that the default will change, and a later release makes passing it required. The non-reentrant form
(``use_reentrant=False``) is the one PyTorch recommends: it works under ``torch.compile``, with keyword
inputs, with ``torch.autograd.grad`` and with inputs none of which requires grad.

Reported: ``checkpoint`` and ``checkpoint_sequential`` of ``torch.utils.checkpoint``, resolved through
the file's imports (``import torch.utils.checkpoint as cp; cp.checkpoint(...)``). Not reported: a call
that passes ``use_reentrant`` (any value) or ``**kwargs`` (which may hold it), or a ``checkpoint`` the
file itself defines or rebinds.

Fix (numerics: the two forms differ where no input requires grad, and in what they recompute): pass
``use_reentrant=False``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, ScriptFacts

CHECKPOINTS = {
    "torch.utils.checkpoint.checkpoint": "checkpoint",
    "torch.utils.checkpoint.checkpoint_sequential": "checkpoint_sequential",
}


def _shadowed(facts: ScriptFacts, call: CallSite) -> bool:
    """The callee's first name is one this file defines or binds itself (``def checkpoint``, a
    parameter, an assignment): not torch's, whatever the imports say."""
    head = (call.name or "").split(".")[0]
    if head in facts.classes_by_name:
        return True
    if any(node.name.value == head and ctx.class_def is None for node, ctx in facts.functions):
        return True  # a function of this file (a method of the same name does not shadow it)
    for binding in facts.bindings_of(head):
        if binding.ctx.function is not None and binding.ctx.function is call.ctx.function:
            return True  # rebound in the calling function
        if binding.ctx.function is None and binding.ctx.class_def is None:
            return True  # rebound at module level
    for frame in call.ctx.chain():
        if frame.kind == "def":
            params = frame.node.params  # type: ignore[union-attr]
            names = [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]
            names += [p.name.value for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
            if head in names:
                return True
    return False


class CheckpointUseReentrant(ScriptRule):
    id = "TC315"
    triggers = (r"checkpoint",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for call in facts.calls:
            kind = CHECKPOINTS.get(call.qualname or "")
            if kind is None or _shadowed(facts, call):
                continue
            if call.has_star_kwargs or call.arg("use_reentrant") is not None:
                continue  # a deliberate choice, or one a **kwargs dict may hold
            yield self.finding(
                facts,
                call.node,
                f"`{kind}(...)` without `use_reentrant`: pass `use_reentrant=False`",
                explanation="Leaving `use_reentrant` out warns on every call (every step) since PyTorch 2.1, and "
                "a later release requires it. The non-reentrant form is the recommended one: it works under "
                "torch.compile, with keyword inputs and with inputs that do not require grad.",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "pass use_reentrant=False",
                    lambda call=call: AddKeyword(call.node, "use_reentrant", "False"),
                ),
            )


# -- the fix ------------------------------------------------------------------------------------


class CheckpointUseReentrantFix(Codemod):
    rule = "TC315"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
