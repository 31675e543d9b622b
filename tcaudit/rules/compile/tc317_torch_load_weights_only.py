"""TC317 torch-load-weights-only: ``torch.load(path)`` without ``weights_only=`` (TorchFix TOR102).

``torch.load`` with ``weights_only=False`` (the default before PyTorch 2.6) unpickles arbitrary objects,
so a crafted checkpoint runs code when it is loaded. PyTorch 2.6 made ``weights_only=True`` the
default; writing it keeps older torch safe too and says what the file is expected to hold.

Reported: ``torch.load`` (and ``torch.serialization.load``) resolved through the imports, without
``weights_only`` and without ``**kwargs`` (which may hold it).

Fix (safe): pass ``weights_only=True``, only where the loaded object is plainly a state dict: the call
is the argument of ``.load_state_dict(...)``, or it is assigned to a name whose every other mention in
that scope is the argument of ``.load_state_dict(...)``. Elsewhere (a checkpoint dict indexed for its
entries, a dataset, an object of the user's) the fix is declined: such files may hold objects the
weights-only unpickler refuses.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import AddKeyword, apply_keyword_edits
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, ScriptFacts

LOADS = {"torch.load", "torch.serialization.load"}


class _Names(cst.CSTVisitor):
    """Every Name node spelling ``name`` in a scope, and whether one is indexed (``name[...]``)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found: list[cst.Name] = []
        self.indexed = False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            self.found.append(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        self.indexed |= isinstance(node.value, cst.Name) and node.value.value == self.name


def _state_dict_arguments(facts: ScriptFacts) -> set[int]:
    """The ids of the expressions passed as the state dict of a ``.load_state_dict(...)`` call."""
    out: set[int] = set()
    for call in facts.method_calls("load_state_dict"):
        given = call.arg("state_dict", 0)
        if given is not None:
            out.add(id(given))
    return out


def _assigned_name(call: CallSite) -> tuple[cst.Name, cst.Assign] | None:
    """``name = torch.load(...)``: the name and the assignment."""
    statement = call.statement.node if call.statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and small.value is call.node and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name):
            return target, small
    return None


def _plan(facts: ScriptFacts, call: CallSite, state_dicts: set[int]) -> AddKeyword:
    if id(call.node) in state_dicts:
        return AddKeyword(call.node, "weights_only", "True")
    assigned = _assigned_name(call)
    if assigned is not None:
        target, _ = assigned
        scope = call.ctx.function or facts.module
        names = _Names(target.value)
        scope.visit(names)
        uses = [n for n in names.found if n is not target]
        if uses and all(id(n) in state_dicts for n in uses):
            return AddKeyword(call.node, "weights_only", "True")
        if names.indexed:
            raise DeclineFix(
                f"`{target.value}` is a checkpoint indexed for its entries; entries beside the state dicts "
                "(an argparse Namespace, numpy values) may be refused by weights_only=True"
            )
    raise DeclineFix("the loaded object is not known to be a state dict (pass weights_only= by hand)")


class TorchLoadWeightsOnly(ScriptRule):
    id = "TC317"
    triggers = (r"load(?<!\wload)\b",)  # ``\bload\b``, its left edge checked after the letters (faster)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        loads = [c for c in facts.calls if c.qualname in LOADS]
        if not loads:
            return
        state_dicts = _state_dict_arguments(facts)
        for call in loads:
            if call.has_star_kwargs or call.arg("weights_only") is not None:
                continue  # a deliberate choice, or one a **kwargs dict may hold
            yield self.finding(
                facts,
                call.node,
                "`torch.load(...)` without `weights_only=`: unpickling a crafted file runs arbitrary code",
                explanation="With weights_only=False (the default before PyTorch 2.6) torch.load unpickles any "
                "object, so a malicious checkpoint executes code on load (TorchFix TOR102). Torch 2.6+ defaults "
                "to weights_only=True; writing it keeps older torch safe and documents what the file holds. "
                "Pass weights_only=False only for trusted files that hold other objects.",
                fix=self.planned_fix(
                    FixClass.SAFE, "pass weights_only=True (the loaded object is a state dict)",
                    lambda call=call: _plan(facts, call, state_dicts),
                ),
            )


# -- the fix ------------------------------------------------------------------------------------


class TorchLoadWeightsOnlyFix(Codemod):
    rule = "TC317"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return apply_keyword_edits(module, [finding.fix.plan for finding in findings])
