"""TC511 rank-zero-forward-through-ddp: evaluation (or sampling) on some ranks only through the
DistributedDataParallel wrapper: ``if rank == 0: evaluate(model, ...)`` with ``model = DDP(...)``.

DDP's forward is not local: with ``broadcast_buffers=True`` (its default) a forward after a training step
broadcasts the module's buffers (BatchNorm's running statistics, registered masks) from rank 0, and
SyncBatchNorm all-reduces in every forward. On one rank only, that collective waits for ranks that never
come. Fix (safe): the bare module, ``model.module``, at those calls: the same outputs, no collective.
Declined where the rank-only block also trains (a backward or an optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression
from tcaudit.rewrite.edits import CallEditor
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import parameter_receiving
from tcaudit.script.distributed import distributed_facts, in_test_code, rank_branch
from tcaudit.script.expressions import attribute_chain
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import call_nodes


@dataclass(frozen=True, eq=False)
class UnwrapAtCalls(FixPlan):
    kind = "unwrap-ddp"
    nodes: tuple[cst.BaseExpression, ...]  # the wrapped model's expressions that become ``<it>.module``
    model: str
    line: int
    # The wrap runs on some paths only (``if args.distributed: model = DDP(model)``): the name may hold the
    # bare model there, so it becomes ``getattr(model, "module", model)``.
    conditional: bool = False


def _forwards(fn: cst.FunctionDef, param: str) -> bool:
    """Whether ``fn`` runs its parameter ``param`` (``param(x)``)."""
    return any(isinstance(node.func, cst.Name) and node.func.value == param for node in call_nodes(fn))


class RankZeroForwardThroughDdp(ScriptRule):
    id = "TC511"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        wraps = [w for w in info.wraps_of("ddp") if w.target]
        if facts.frameworks or not wraps:
            return
        wrapped = {w.target: w for w in wraps}
        for call in facts.calls:
            if in_test_code(call.ctx):
                continue
            found = rank_branch(facts, call.ctx)
            if found is None:
                continue
            model, node, helper = self._through_wrapper(facts, call, wrapped)
            if model is None:
                continue
            branch = found[0]
            test = facts.code(branch.test)
            what = f"`{helper}()` runs the DDP-wrapped `{model}`" if helper else f"`{model}(...)` runs the DDP wrapper"
            what = what if len(what) <= 50 else "the DDP wrapper runs"

            def plan(node=node, model=model, branch=branch) -> UnwrapAtCalls:
                if any((c.method or "") in ("backward", "step") for c in facts.calls_within(branch)):
                    raise DeclineFix(f"the block under `if {test}:` also trains; DDP's gradient sync needs every "
                                     "rank there: move the training out of it by hand")
                return UnwrapAtCalls((node,), model, facts.line_of(node), _conditional(wrapped[model]))

            yield self.finding(
                facts,
                call.node,
                f"{what} on some ranks only: its forward can wait for the others and hang the job",
                explanation=f"It runs under `if {test}:`. DDP's forward is not local: after a training step it broadcasts the module's buffers "
                "(BatchNorm statistics, registered masks) from rank 0 (`broadcast_buffers=True`, the default), and "
                "SyncBatchNorm all-reduces in every forward. On some ranks only, that collective waits for ranks "
                "that never come. Run the bare module there: `model.module`.",
                fix=self.planned_fix(FixClass.SAFE, f"use the bare module there (`{model}.module`)", plan),
            )

    @staticmethod
    def _through_wrapper(facts: ScriptFacts, call: CallSite, wrapped: dict):
        """(model, the expression to unwrap, the helper's name or None) when ``call`` runs the wrapped
        model: ``model(x)`` itself, or a function of this file handed it that runs it."""
        chain = attribute_chain(call.node.func)
        if chain in wrapped and _after_wrap(facts, call, wrapped[chain]):
            return chain, call.node.func, None
        for arg in call.node.args:
            chain = attribute_chain(arg.value)
            if arg.star or chain not in wrapped or not _after_wrap(facts, call, wrapped[chain]):
                continue
            short = (call.name or "").removeprefix("self.")
            for fn in facts.functions_by_name.get(short, []):
                param = parameter_receiving(fn, call.node, chain)
                if param is not None and _forwards(fn, param):
                    return chain, arg.value, call.name
        return None, None, None


def _conditional(wrap) -> bool:
    """Whether the wrap runs on some paths only (under an ``if``, in a loop, a ``try`` or a handler)."""
    for frame in wrap.call.ctx.chain():
        if frame.kind in ("def", "class", "module"):
            return False
        if frame.kind in ("if", "else", "loop", "try", "except"):
            return True
    return False


def _after_wrap(facts: ScriptFacts, call: CallSite, wrap) -> bool:
    """The name holds the wrapper at ``call``: after the wrap in its function, or anywhere in the class
    for an attribute wrapped in ``__init__``."""
    if (wrap.target or "").startswith("self."):
        return call.ctx.class_def is not None and call.ctx.class_def is wrap.call.ctx.class_def
    return call.ctx.function is wrap.call.ctx.function and facts.line_of(call.node) > facts.line_of(wrap.call.node)


class UnwrapFix(Codemod):
    rule = "TC511"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        targets = {id(node): f.fix.plan.conditional for f in findings for node in f.fix.plan.nodes}
        return module.visit(_Unwrap(targets, module))


class _Unwrap(CallEditor):
    def __init__(self, targets: dict[int, bool], module: cst.Module) -> None:
        super().__init__()
        self.targets = targets
        self.module = module
        self.fstrings: list[str] = []  # the quotes of the f-strings around the node visited

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self.fstrings.append(node.start.lstrip("rRfFbBuU"))

    def leave_FormattedString(self, original_node: cst.FormattedString, updated_node: cst.FormattedString):
        self.fstrings.pop()
        return updated_node

    def _unwrapped(self, original_node: cst.BaseExpression, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        if id(original_node) not in self.targets:
            return updated_node
        if self.targets[id(original_node)]:
            text = self.module.code_for_node(updated_node)
            quote = "'" if any('"' in q for q in self.fstrings) else '"'  # inside an f-string: its other quote
            return parse_expression(f"getattr({text}, {quote}module{quote}, {text})", self.module)
        return cst.Attribute(value=updated_node, attr=cst.Name("module"))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._unwrapped(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._unwrapped(original_node, updated_node)
