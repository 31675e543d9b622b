"""TC513 uneven-rank-shards: a DDP script splits its training data across ranks by hand
(``data[rank::world_size]``, ``Subset(ds, range(rank, len(ds), world_size))``,
``np.array_split(x, world_size)[rank]``, ``torch.chunk(x, world_size)[rank]``), so the ranks can get
different numbers of batches, and nothing evens them out (no ``model.join()``, no truncation to a
multiple of the world size, no minimum over the ranks).

At the last step the rank with fewer batches leaves the loop while the others wait in DDP's gradient
all-reduce for it, until the process group's timeout ends the job.

Fix (safe where the training loop holds no collective of its own): the batch loop goes under
``with model.join():`` (DDP's support for uneven inputs), so a rank that runs out shadows the others'
all-reduces until every rank is done. Declined where the loop, or a function it calls, meets the other
ranks another way (``dist.all_reduce``, ``barrier``, SyncBatchNorm, ZeroRedundancyOptimizer), where the
model is DDP on some paths only, or where the DDP model has no name at the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, LoopWrapper, parse_expression
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of, parameter_receiving, reachable_functions
from tcaudit.script.distributed import (
    EVAL_NAME,
    DistributedFacts,
    Wrap,
    distributed_facts,
    in_test_code,
    is_meeting_point,
)
from tcaudit.script.facts import Frame, ScriptFacts
from tcaudit.script.guards import branches, last_name, names_rank, names_world_size
from tcaudit.source.syntax import names_in

_SPLITS = frozenset({"array_split", "chunk", "tensor_split"})  # the last piece may be shorter, or missing
# Text that evens the ranks out: a minimum over the ranks (``all_reduce(n, op=ReduceOp.MIN)``).
_MIN_OVER_RANKS = re.compile(r"ReduceOp\.MIN\b")
# Collectives outside torch.distributed's functions that a training step may run.
_OTHER_COLLECTIVES = re.compile(r"\bSyncBatchNorm\b|\bZeroRedundancyOptimizer\b")


def _shard_source(facts: ScriptFacts, node: cst.CSTNode) -> cst.BaseExpression | None:
    """What ``node`` splits across ranks, when it is a hand-made split into uneven shards: the ``x`` of
    ``x[rank::world_size]``, ``range(rank, len(x), world_size)``, ``np.array_split(x, world_size)[rank]``,
    ``torch.chunk(x, world_size)[rank]``; None otherwise."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Slice):
            lower, step = index.lower, index.step
            if lower is not None and step is not None and names_rank(lower) and names_world_size(step):
                return node.value
            return None
        if isinstance(index, cst.Index) and names_rank(index.value) and isinstance(node.value, cst.Call):
            return _split_data(node.value)
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "range" and (
        len(node.args) == 3
    ):
        start, stop, step = (a.value for a in node.args)
        if names_rank(start) and names_world_size(step):
            return stop
    return None


def _split_data(call: cst.Call) -> cst.BaseExpression | None:
    """The data of ``np.array_split(x, world_size)``, ``torch.chunk(x, world_size)``,
    ``torch.tensor_split(x, world_size)`` or the methods ``x.chunk(world_size)``, ``x.tensor_split(world_size)``."""
    if last_name(call) not in _SPLITS or not isinstance(call.func, cst.Attribute):
        return None
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if last_name(call.func.value) in ("torch", "np", "numpy"):  # the function: data first, then the count
        return positional[0] if len(positional) >= 2 and names_world_size(positional[1]) else None
    return call.func.value if positional and names_world_size(positional[0]) else None


_CUT_TO_MULTIPLE = re.compile(r"//\s*(?P<w>[\w.]+(?:\(\))?)\s*\)?\s*\*\s*(?P=w)|-\s*[^%]+%\s*(?P<m>[\w.]+(?:\(\))?)")


def _truncated(facts: ScriptFacts, source: cst.BaseExpression) -> bool:
    """The split data is cut to a multiple of the world size first (``x[: len(x) // ws * ws]``,
    ``x[: n - n % ws]``): every shard then has the same length."""
    for value in facts.binding_values(source):
        for match in _CUT_TO_MULTIPLE.finditer(facts.code(value)):
            world = match.group("w") or match.group("m")
            try:
                if names_world_size(cst.parse_expression(world)):
                    return True
            except cst.ParserSyntaxError:
                continue
    return False


def _shards(facts: ScriptFacts, info: DistributedFacts) -> list[cst.CSTNode]:
    """The hand-made uneven splits of training data: in an assignment outside tests, evaluation code and
    evaluation names, or in a training loop's header; data cut to a multiple of the world size first is even."""
    out: list[cst.CSTNode] = []
    seen: set[int] = set()
    places: list[tuple[cst.CSTNode, str | None, Frame]] = [(b.value, b.target, b.ctx) for b in facts.bindings]
    places += [(loop.node.iter, None, loop) for loop in info.step_loops.values() if isinstance(loop.node, cst.For)]
    for root, target, ctx in places:
        for node in _walk(root):
            if id(node) in seen:
                continue
            source = _shard_source(facts, node)
            if source is None:
                continue
            seen.add(id(node))
            if in_test_code(ctx) or facts.in_eval(ctx) or (target is not None and EVAL_NAME.search(target)):
                continue
            if not _truncated(facts, source):
                out.append(node)
    return out


def _walk(root: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class _All(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.Subscript, cst.Call)):
                found.append(node)
            return True

    root.visit(_All())
    return found


def _joined(facts: ScriptFacts) -> bool:
    """Some ``with`` of the file already enters DDP's join (``with model.join():``) or the generic
    ``Join([...])``."""
    for node, _ in facts.withs:
        for item in node.items:
            expr = item.item
            if isinstance(expr, cst.Call):
                if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "join" and not isinstance(
                    expr.func.value, (cst.SimpleString, cst.ConcatenatedString)
                ):
                    return True
                qual = facts.qualname(expr.func) or ""
                if qual.startswith("torch.distributed.algorithms") and last_name(expr) == "Join":
                    return True
    return False


@dataclass(frozen=True, eq=False)
class WrapInJoin(FixPlan):
    kind = "wrap-statements"
    loop: cst.CSTNode  # the batch loop
    line: int
    context_expr: str  # ``model.join()``


class UnevenRankShards(ScriptRule):
    id = "TC513"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        wraps = [w for w in info.wraps_of("ddp") if not in_test_code(w.call.ctx)]
        if not wraps or not info.step_calls or not info.step_loops:
            return
        if _MIN_OVER_RANKS.search(info.text) or _joined(facts):
            return
        shards = _shards(facts, info)
        if not shards:
            return
        plan_or_reason: list = []

        def plan() -> WrapInJoin:
            if not plan_or_reason:
                try:
                    plan_or_reason.append(_plan(facts, info, wraps))
                except DeclineFix as exc:
                    plan_or_reason.append(exc)
            made = plan_or_reason[0]
            if isinstance(made, DeclineFix):
                raise DeclineFix(str(made))
            return made

        for shard in shards:
            shown = facts.code(shard)
            yield self.finding(
                facts,
                shard,
                "data split across ranks by hand: the ranks can get different batch counts and hang in DDP's "
                "all-reduce",
                explanation=(
                    f"`{shown}` splits the data without evening the ranks out. Every DDP backward all-reduces the "
                    "gradients with every rank. When the data's length is not a "
                    "multiple of the world size, the shards differ by one sample and the loaders by up to one batch; "
                    "at the last step the longer ranks wait for a rank that has left, and the job hangs until the "
                    "process group's timeout."
                ),
                fix=self.planned_fix(FixClass.SAFE, "wrap the batch loop in `with model.join():`", plan),
            )


def _plan(facts: ScriptFacts, info: DistributedFacts, wraps: list[Wrap]) -> WrapInJoin:
    loops = list(info.step_loops.values())
    if len(loops) != 1:
        raise DeclineFix("the script trains in more than one loop; use DistributedSampler, which pads every rank "
                         "to the same number of samples")
    loop = loops[0]
    if len(wraps) != 1 or not wraps[0].target:
        raise DeclineFix("the DDP model is not one named object; use DistributedSampler, which pads every rank to "
                         "the same number of samples")
    wrap = wraps[0]
    conditions = branches(wrap.call.ctx)
    if conditions:
        test = facts.code(conditions[-1].test.test)
        raise DeclineFix(f"the model is wrapped in DDP only when `{test}`; `.join()` would fail on the other path")
    other = _OTHER_COLLECTIVES.search(info.text)
    if other:
        raise DeclineFix(f"the script uses {other.group(0)}, whose collectives DDP's join does not shadow; use "
                         "DistributedSampler, which pads every rank to the same number of samples")
    collective = _collective_in_loop(facts, loop)
    if collective is not None:
        raise DeclineFix(f"the training loop meets the other ranks in `{collective}` too, which DDP's join does "
                         "not shadow; use DistributedSampler, which pads every rank to the same number of samples")
    name = _model_name_at(facts, wrap, loop)
    if name is None:
        raise DeclineFix("the DDP model has no name where the training loop runs; use DistributedSampler, which "
                         "pads every rank to the same number of samples")
    return WrapInJoin(loop.node, facts.line_of(loop.node), f"{name}.join()")


def _collective_in_loop(facts: ScriptFacts, loop: Frame) -> str | None:
    """The first collective the loop runs, in its body or in the functions of this file it calls (three
    calls deep), or in a ``forward`` of the file."""
    functions: set[cst.FunctionDef] = set()
    for call in facts.calls:
        if not call.ctx.inside(loop.node):
            continue
        if is_meeting_point(call.qualname):
            return facts.code(call.node)
        short = (call.name or "").removeprefix("self.")
        if short and "." not in short:
            for fn in facts.functions_by_name.get(short, []):
                functions.add(fn)
                functions |= reachable_functions(facts, fn)
    functions |= set(facts.functions_by_name.get("forward", []))
    for fn in functions:
        for call in facts.calls_in(fn):
            if is_meeting_point(call.qualname):
                return facts.code(call.node)
    return None


def _model_name_at(facts: ScriptFacts, wrap: Wrap, loop: Frame) -> str | None:
    """The name the DDP model has in the loop's function: the wrap's target where both are in one function
    (the wrap first), the parameter every caller hands it to, or ``self.x`` in a method of the same class."""
    target = wrap.target
    assert target is not None
    function = loop.function
    if wrap.call.ctx.function is function:
        return target if facts.line_of(wrap.call.node) < facts.line_of(loop.node) and _used_in(target, loop) else None
    if target.startswith("self."):
        same_class = wrap.call.ctx.class_def is not None and wrap.call.ctx.class_def is loop.class_def
        return target if same_class and _used_in(target, loop) else None
    if function is None:
        return None
    callers = callers_of(facts, function, outside=True)
    received = {parameter_receiving(function, c.node, target) for c in callers}
    if len(received) == 1 and None not in received:
        name = received.pop()
        return name if _used_in(name, loop) else None
    return None


def _used_in(name: str, loop: Frame) -> bool:
    """The loop uses ``name`` (calls it, or hands it to a step helper), so the object it joins is the one
    that trains."""
    return name in names_in(loop.node)


class UnevenRankShardsFix(Codemod):
    rule = "TC513"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        targets: dict[int, cst.BaseExpression] = {}
        for finding in findings:
            plan: WrapInJoin = finding.fix.plan
            targets[id(plan.loop)] = parse_expression(plan.context_expr, module)
        return module.visit(LoopWrapper(targets))
