"""TC504 sampler-without-set-epoch: a shuffling DistributedSampler over several epochs, never reseeded.

Fix (safe): ``sampler.set_epoch(epoch)`` as the first statement of the epoch loop, through the name
the loop can see (the sampler's, a parameter it is passed through, or ``loader.sampler``), guarded
where the sampler may be None or the loader something else on some paths. A loader a method builds
afresh each epoch in the batch loop's header (``for batch in dm.train_dataloader():``) is named first
(``train_loader = dm.train_dataloader()`` before that loop) and reseeded there. Declined where the loop
has no counter, the sampler or its loader is built inside the loop otherwise, or it is not a
DistributedSampler on every path.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan, FollowsFix
from tcaudit.project.loaders import loaders_built_elsewhere
from tcaudit.rewrite.codemod import FixContext, StatementEditor, unique_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of, parameter_receiving
from tcaudit.script.distributed import (
    EVAL_NAME,
    DistributedFacts,
    callee_type,
    distributed_facts,
    in_test_code,
    innermost_loop,
    is_dataloader,
    is_distributed_sampler,
    literal_value,
    loops_of,
)
from tcaudit.script.evidence import STEP_OR_BACKWARD_CALL
from tcaudit.script.expressions import function_returns
from tcaudit.script.facts import Binding, CallSite, Frame, ScriptFacts
from tcaudit.source.syntax import full_name, nodes_of, param_names
from tcaudit.source.triggers import all_of

_EPOCH = re.compile(r"epoch", re.IGNORECASE)


def _single_pass(loop: cst.For) -> bool:
    """``for epoch in range(1)``: one epoch, nothing to reseed."""
    it = loop.iter
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "range":
        args = [a.value for a in it.args]
        if len(args) == 1 and literal_value(args[0]) in (0, 1):
            return True
    return False


def epoch_loop(facts: ScriptFacts, info: DistributedFacts) -> Frame | None:
    """A loop that repeats the training loop: a ``for epoch in ...`` loop, or a loop around a step loop."""
    candidates: list[Frame] = []
    for loop in info.step_loops.values():
        candidates += loops_of(loop.parent)[:1] if loop.parent is not None else []
    for frame in candidates:
        node = frame.node
        if info.is_step_loop(frame) or (isinstance(node, cst.For) and _single_pass(node)):
            continue  # a loop around gradient-accumulation micro-steps is not an epoch loop
        return frame
    for call in info.step_calls:
        for ctx in info.call_contexts(call.ctx, depth=3):
            for frame in loops_of(ctx):
                node = frame.node
                if isinstance(node, cst.For) and _EPOCH.search(facts.code(node.target)):
                    if not _single_pass(node):
                        return frame
    # ``for epoch in range(E): train(model, loader)`` where train() holds the step loop.
    for call in facts.calls:
        loop = innermost_loop(call.ctx)
        if loop is None or not isinstance(loop.node, cst.For) or _single_pass(loop.node):
            continue
        if _EPOCH.search(facts.code(loop.node.target)) and call.name and not facts.in_eval(call.ctx):
            short = call.name.removeprefix("self.")
            if any(fn for fn in facts.functions_by_name.get(short, []) if _holds_step_loop(info, fn)):
                return loop
    return None


def while_counter(loop: cst.CSTNode) -> str | None:
    """The epoch counter of a ``while`` epoch loop: a name its body (not a nested block) steps with
    ``n += 1``; one whose name says epoch when there are several."""
    if not isinstance(loop, cst.While) or not isinstance(loop.body, cst.IndentedBlock):
        return None
    counters = []
    for statement in loop.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.AugAssign)
                and isinstance(small.operator, cst.AddAssign)
                and isinstance(small.target, cst.Name)
                and literal_value(small.value) == 1
            ):
                counters.append(small.target.value)
    named = [c for c in counters if _EPOCH.search(c)]
    if len(named) == 1:
        return named[0]
    return counters[0] if len(counters) == 1 else None


def _holds_step_loop(info: DistributedFacts, fn: cst.FunctionDef) -> bool:
    return any(frame.function is fn for frame in info.step_loops.values())


def _shuffles(call: CallSite) -> bool:
    """Whether the sampler may shuffle: its default, ``True``, or a value known only at run time
    (``shuffle=args.shuffle``, ``train_kwargs.get("shuffle", False)``); only ``shuffle=False`` does not."""
    shuffle = call.arg("shuffle", 3)  # DistributedSampler(dataset, num_replicas, rank, shuffle, ...)
    return shuffle is None or literal_value(shuffle) is not False


@dataclass(frozen=True, eq=False)
class InsertSetEpoch(FixPlan):
    kind = "insert-set-epoch"
    loop: cst.CSTNode  # the epoch loop (``for``/``while``) whose body gets the call first
    line: int  # the DistributedSampler call
    sampler: str  # the expression set_epoch is called on, as the loop sees it
    epoch_loop_line: int
    epoch: str
    code: str  # the statement(s) written first in the loop (or before ``before``)
    # A loader built in a batch loop's header: the statements go before that loop (``before``), whose
    # header then iterates over ``name`` in place of the call (``hoisted``).
    before: cst.For | None = None
    hoisted: cst.Call | None = None
    name: str | None = None


class SamplerWithoutSetEpoch(ScriptRule):
    id = "TC504"
    after = ("TC503",)  # set_epoch for the DistributedSampler TC503's fix adds: checked on its text
    # A DistributedSampler in the file, or a DDP/FSDP model whose loaders TC503's fix gives one (its
    # set_epoch is reported as the fix that follows TC503's).
    triggers = (
        all_of(r"DistributedSampler", STEP_OR_BACKWARD_CALL),
        all_of(r"DistributedDataParallel|FullyShardedDataParallel|fully_shard", STEP_OR_BACKWARD_CALL),
    )

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if facts.frameworks or not info.step_calls:
            return
        if facts.method_calls("set_epoch"):
            return  # reseeded somewhere (sampler, loader.sampler, a helper or a custom loader)
        samplers = [c for c in facts.calls if is_distributed_sampler(callee_type(facts, c))]
        loop = epoch_loop(facts, info)
        if loop is None:
            return
        if not samplers:
            yield from self._after_sampler_fix(facts, context)
            if info.is_ddp_script:
                yield from self._built_elsewhere(facts, context, loop)
            return
        epoch_var = (
            facts.code(loop.node.target) if isinstance(loop.node, cst.For) else while_counter(loop.node)
        )
        for call in samplers:
            if not _shuffles(call) or facts.in_eval(call.ctx) or in_test_code(call.ctx):
                continue
            name = info.target_of(call.node) or _conditional_target(facts, call)
            owner = name or _loader_owning(info, call)
            if owner and EVAL_NAME.search(owner):
                continue
            receiver = name or (f"{owner}.sampler" if owner else None)

            def plan(call=call, receiver=receiver) -> InsertSetEpoch:
                return _plan(facts, call, loop, receiver, epoch_var)

            described = (
                f"call {receiver}.set_epoch({epoch_var}) at the start of each epoch"
                if receiver and epoch_var and re.fullmatch(r"\w+", epoch_var) and epoch_var != "_"
                else "call sampler.set_epoch(epoch) at the start of each epoch"
            )
            yield self.finding(
                facts,
                call.node,
                "DistributedSampler without `set_epoch(epoch)` shuffles the same way every epoch",
                explanation="A DistributedSampler shuffles with the same seed every epoch unless "
                "`set_epoch(epoch)` is called: each epoch visits the data in the same order.",
                fix=self.planned_fix(FixClass.SAFE, described, plan),
            )


    def _after_sampler_fix(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """No DistributedSampler yet, but TC503's fix will add a shuffling one to a training loader
        of a script with several epochs: set_epoch is then due too, so scan says so now, and whether
        the next fix round can place it (this check run on the script with TC503's samplers in place)."""
        pending = [
            finding for finding in context.fixable("TC503", facts)
            # The sampler TC503 writes shuffles unless it passes the loader's shuffle=False on.
            if finding.waits_for is None
            and not re.search(r"shuffle\s*=\s*False", str(getattr(finding.fix.plan, "sampler", "")))
        ]
        if not pending:
            return
        after = context.fixed_by("TC503", facts)
        next_round = [] if after is None else self._next_round(after, context)
        placed = [f for f in next_round if f.fix is not None and f.fix.available]
        reasons = [f.fix.reason for f in next_round if f.fix is not None and not f.fix.available and f.fix.reason]
        for index, finding in enumerate(pending):
            if index < len(placed):
                fix = Fix(FixClass.SAFE, "call sampler.set_epoch(epoch) at the start of each epoch, once TC503's "
                          "sampler is in place", plan=FollowsFix("TC503"))
            else:
                reason = reasons[0] if reasons else "the epoch loop cannot reach the sampler TC503 adds here"
                fix = Fix(FixClass.SAFE, "call sampler.set_epoch(epoch) at the start of each epoch").declined(
                    f"once TC503's sampler is in place: {reason}; call set_epoch by hand")
            yield dataclasses.replace(
                finding,
                rule=self.id,
                name=self.spec.name,
                severity=self.spec.severity,
                message="with the DistributedSampler TC503 adds, also call `set_epoch(epoch)` at the start of each epoch",
                explanation="A DistributedSampler shuffles with the same seed every epoch without it.",
                fix=fix,
            )


    def _built_elsewhere(self, facts: ScriptFacts, context: RuleContext, loop: Frame) -> Iterator[Finding]:
        """A DDP script's training loader built by a helper of another module whose DataLoader has (or gets
        from TC503's fix there) a DistributedSampler while a process group is up: reseeded through the
        loader, where the loop sees it, whenever its sampler has ``set_epoch``."""
        epoch = facts.code(loop.node.target) if isinstance(loop.node, cst.For) else while_counter(loop.node)
        for loader in loaders_built_elsewhere(facts, context.project(facts)):
            helper = loader.pipeline.facts
            sampler = " ".join(helper.code(leaf) for v in loader.site.values("sampler") for leaf in helper.binding_values(v))
            if loader.site.values("sampler") and "DistributedSampler" not in sampler:
                continue  # a sampler of its own: TC503 says so
            if loader.site.values("shuffle") and all(literal_value(v) is False for v in loader.site.values("shuffle")):
                continue
            name = loader.received if loader.received and "." not in loader.received else None

            def plan(loader=loader, name=name) -> InsertSetEpoch:
                hoisted = _hoisted(facts, loader.call, loop, epoch)
                if hoisted is not None:
                    return hoisted
                if not name or not epoch or not re.fullmatch(r"\w+", epoch) or epoch == "_":
                    raise DeclineFix("the loader or the epoch counter has no name to call set_epoch with")
                if loader.call.ctx.inside(loop.node):
                    raise DeclineFix("the DataLoader is created inside the epoch loop; create it once, before the loop")
                seen = _visible(facts, name, loop)
                if seen is None and loader.call.ctx.function is loop.function and \
                        facts.line_of(loader.call.node) < facts.line_of(loop.node):
                    seen = name  # ``train_loader, val_loader = get_data(args)`` before the loop
                if seen is None:
                    raise DeclineFix(f"`{name}` is not visible where the epoch loop runs; call set_epoch by hand")
                code_ = f'if hasattr({seen}.sampler, "set_epoch"):\n    {seen}.sampler.set_epoch({epoch})\n'
                return InsertSetEpoch(loop.node, facts.line_of(loader.call.node), f"{seen}.sampler",
                                      facts.line_of(loop.node), epoch, code_)

            yield self.finding(
                facts,
                loader.call.node,
                f"the DistributedSampler of the loader from `{loader.helper.name}` is never reseeded with "
                "`set_epoch(epoch)`",
                explanation="A DistributedSampler shuffles with the same seed every epoch unless `set_epoch(epoch)` "
                "is called: each epoch visits the data in the same order.",
                fix=self.planned_fix(FixClass.SAFE, "call loader.sampler.set_epoch(epoch) at the start of each epoch "
                                     "where the sampler has it", plan),
                related=[self.place(loader.pipeline.facts, loader.site.call.node,
                                    f"the DataLoader `{loader.helper.name}` returns")],
            )

    def _next_round(self, after: ScriptFacts, context: RuleContext) -> list[Finding]:
        """This rule's findings on the script as the next fix round sees it (TC503's samplers in place)."""
        if after.method_calls("set_epoch") or not any(is_distributed_sampler(callee_type(after, c)) for c in after.calls):
            return []  # (no sampler added: this check would only predict again)
        return [f for f in self.check(after, context) if f.fix is None or not isinstance(f.fix.plan, FollowsFix)]


def _plan(facts: ScriptFacts, sampler: CallSite, loop: Frame, receiver: str | None, epoch: str | None) -> InsertSetEpoch:
    if epoch == "_":
        raise DeclineFix("the epoch loop has no counter (`for _ in ...`); name it and pass it to set_epoch")
    if not epoch and isinstance(loop.node, cst.While):
        raise DeclineFix("the epoch loop is a `while` loop without an epoch counter to pass to set_epoch")
    if not receiver or not epoch or not re.fullmatch(r"\w+", epoch):
        raise DeclineFix("the sampler or the epoch counter has no name to call it with")
    try:
        seen, guard = _receiver(facts, sampler, loop)
    except DeclineFix:
        hoisted = _hoisted_method_loader(facts, sampler, loop, epoch)
        if hoisted is None:
            raise
        return hoisted
    if guard:
        code = f"if {guard}:\n    {seen}.set_epoch({epoch})\n"
    else:
        code = f"{seen}.set_epoch({epoch})\n"
    return InsertSetEpoch(loop.node, facts.line_of(sampler.node), seen, facts.line_of(loop.node), epoch, code)


# Calls a batch loop's header may wrap the loader in: ``for i, batch in enumerate(dm.train_dataloader()):``.
_HEADER_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "iter"})


def _batch_loop_over(loop: Frame, call: cst.Call) -> cst.For | None:
    """The ``for`` inside the epoch loop whose header iterates over ``call`` (directly or through
    enumerate/tqdm/iter), or None."""
    for node in nodes_of(loop.node, cst.For):
        if node is loop.node or node.asynchronous is not None:
            continue
        header = node.iter
        if header is call:
            return node
        if (isinstance(header, cst.Call) and full_name(header.func) in _HEADER_WRAPPERS and header.args
                and header.args[0].value is call and header.args[0].keyword is None and not header.args[0].star):
            return node
    return None


def _hoisted(facts: ScriptFacts, call: CallSite, loop: Frame, epoch: str | None) -> InsertSetEpoch | None:
    """``for x, y in dm.train_dataloader():`` in the epoch loop builds a new DataLoader, and a new sampler
    with it, every epoch; the loop reseeds it once it has a name: ``train_loader = dm.train_dataloader()``
    just before the batch loop (the call runs when it did, once per epoch), ``set_epoch``, and the batch
    loop over ``train_loader``. None where the call is not such a batch loop's header."""
    if not epoch or not re.fullmatch(r"\w+", epoch) or epoch == "_":
        return None
    if call.ctx.function is not loop.function or not call.ctx.inside(loop.node):
        return None
    batch_loop = _batch_loop_over(loop, call.node)
    if batch_loop is None:
        return None
    taken = param_names(loop.function) if loop.function is not None else ()
    name = unique_name(facts, "train_loader", taken)
    code_ = (f"{name} = {facts.code(call.node)}\n"
             f'if hasattr({name}.sampler, "set_epoch"):\n    {name}.sampler.set_epoch({epoch})\n')
    return InsertSetEpoch(loop.node, facts.line_of(call.node), f"{name}.sampler", facts.line_of(loop.node), epoch,
                          code_, before=batch_loop, hoisted=call.node, name=name)


def _hoisted_method_loader(facts: ScriptFacts, sampler: CallSite, loop: Frame,
                           epoch: str | None) -> InsertSetEpoch | None:
    """The sampler's DataLoader is returned by a function or method of this file (``DataModule.train_dataloader``)
    that the epoch loop calls once, in a batch loop's header: that call, named and reseeded (:func:`_hoisted`)."""
    loader = _loader_holding(facts, sampler, distributed_facts(facts).target_of(sampler.node))
    fn = loader.ctx.function if loader is not None else None
    if loader is None or fn is None:
        return None
    names = {b.target for b in facts.bindings if b.value is loader.node}
    if not any(r is loader.node or full_name(r) in names for r in function_returns(fn)):
        return None
    owner = loader.ctx.class_def
    calls = [c for c in facts.calls_within(loop.node) if _calls_function(facts, c, fn, owner)]
    if len(calls) != 1:
        return None
    return _hoisted(facts, calls[0], loop, epoch)


def _calls_function(facts: ScriptFacts, call: CallSite, fn: cst.FunctionDef, owner: cst.ClassDef | None) -> bool:
    """Whether ``call`` runs ``fn``: a module-level function by its name; a method through ``self`` in its
    class, or through a name every value of which is an instance of that class (``dm = DataModule(...)``)."""
    if owner is None:
        return call.name == fn.name.value and not call.ctx.inside(fn)
    if call.method != fn.name.value or not call.receiver_name:
        return False
    receiver = call.receiver_name
    if receiver == "self":
        return call.ctx.class_def is owner
    values = [b.value for b in facts.bindings_of(receiver)]
    return bool(values) and all(
        isinstance(v, cst.Call) and full_name(v.func) == owner.name.value for v in values
    )


def _conditional_target(facts: ScriptFacts, sampler: CallSite) -> str | None:
    """``sampler = DistributedSampler(ds) if distributed else None`` → ``sampler``."""
    statement = sampler.statement.node if sampler.statement else None
    for binding in facts.bindings:
        value = binding.value
        if binding.statement is not None and binding.statement.node is statement and isinstance(value, cst.IfExp):
            if sampler.node in (value.body, value.orelse):
                return binding.target
    return None


def _loader_owning(info: DistributedFacts, sampler: CallSite) -> str | None:
    """``loader = DataLoader(ds, sampler=DistributedSampler(ds))`` → ``loader``."""
    for call in info.dataloaders:
        value = call.arg("sampler")
        if value is sampler.node:
            return info.dataloader_name(call)
    return None


# -- a name for the sampler at the loop --------------------------------------------------------------------


def _receiver(facts: ScriptFacts, sampler: CallSite, loop: Frame) -> tuple[str, str | None]:
    """``(expression for the sampler at the loop, a condition to call it under or None)``."""
    info = distributed_facts(facts)
    name = info.target_of(sampler.node)
    if name is None:  # ``sampler = DistributedSampler(ds) if distributed else None``
        name = _target_of_enclosing(facts, sampler)
    if name is not None:
        if sampler.ctx.inside(loop.node):
            raise DeclineFix("the sampler is created inside the epoch loop; create it once, before the loop")
        values = [b.value for b in _scope_bindings(facts, name, sampler.ctx)]
        maybe_none = _may_be_none(facts, values)
        seen = _visible(facts, name, loop)
        if seen is not None:
            return seen, (f"{seen} is not None" if maybe_none else None)
    # Through the DataLoader that holds it.
    loader = _loader_holding(facts, sampler, name)
    if loader is None:
        raise DeclineFix("the sampler has no name the epoch loop can see; call set_epoch on it by hand")
    if loader.ctx.inside(loop.node):
        raise DeclineFix("the DataLoader is created inside the epoch loop; create it once, before the loop")
    for owner, bindings in _loader_names(facts, loader).items():
        seen = _visible(facts, owner, loop)
        if seen is None:
            continue
        guards = []
        loader_type = _other_iterables(facts, owner, bindings, loader)
        if loader_type is not None:
            guards.append(f"isinstance({seen}, {loader_type})")
        if _may_be_none(facts, [loader.arg("sampler")]):
            guards.append(f"{seen}.sampler is not None")
        return f"{seen}.sampler", " and ".join(guards) or None
    raise DeclineFix("the DataLoader holding the sampler has no name the epoch loop can see")


def _other_iterables(facts: ScriptFacts, owner: str, bindings: list[Binding], loader: CallSite) -> str | None:
    """When ``owner`` holds something other than this DataLoader on some paths (``SyntheticBatches(...)
    if args.synthetic``), the DataLoader class as the file spells it, to test for; None otherwise.
    Declines for another DataLoader without a DistributedSampler (its sampler has no set_epoch)."""
    if not bindings:
        return None
    scope = bindings[0].ctx
    helpers = {id(b.value) for b in bindings}
    others = False
    for binding in _scope_bindings(facts, owner, scope):
        if id(binding.value) in helpers or binding.value is loader.node:
            continue
        for leaf in facts.binding_values(binding.value):
            if leaf is loader.node or isinstance(leaf, (cst.IfExp, cst.BooleanOperation)):
                continue
            if isinstance(leaf, (cst.Name, cst.Attribute)) and facts.bindings_of(full_name(leaf) or ""):
                continue
            site = next((c for c in facts.calls if c.node is leaf), None)
            if site is not None and site.node is not loader.node and is_dataloader(callee_type(facts, site)):
                sampler = site.arg("sampler")
                if sampler is None or not _is_distributed_sampler_expr(facts, sampler):
                    raise DeclineFix(
                        f"`{owner}` is on some paths a DataLoader without a DistributedSampler; reseed the "
                        "sampler by hand"
                    )
                continue
            others = True
    if not others:
        return None
    func = loader.node.func
    qual = facts.qualname(func) or ""
    if not qual.startswith("torch.utils.data") or not any(
        site.local == (full_name(func) or "").split(".")[0] and site.ctx is facts.module_frame
        for site in facts.imports
    ):
        raise DeclineFix(f"`{owner}` is not a DataLoader on every path; reseed the sampler by hand")
    return facts.code(func)


def _is_distributed_sampler_expr(facts: ScriptFacts, expr: cst.BaseExpression) -> bool:
    for leaf in facts.binding_values(expr):
        if isinstance(leaf, cst.Call):
            site = next((c for c in facts.calls if c.node is leaf), None)
            if site is not None and is_distributed_sampler(callee_type(facts, site)):
                return True
    return False


def _target_of_enclosing(facts: ScriptFacts, sampler: CallSite) -> str | None:
    for binding in _statement_bindings(facts, sampler):
        value = binding.value
        if isinstance(value, cst.IfExp) and sampler.node in (value.body, value.orelse):
            return binding.target
    return None


def _statement_bindings(facts: ScriptFacts, call: CallSite) -> list[Binding]:
    statement = call.statement.node if call.statement else None
    return [b for b in facts.bindings if b.statement is not None and b.statement.node is statement]


def _scope_bindings(facts: ScriptFacts, name: str, ctx: Frame) -> list[Binding]:
    """Bindings of ``name`` in the function (or class, for ``self.x``) of ``ctx``."""
    if name.startswith("self."):
        return [b for b in facts.bindings_of(name) if b.ctx.class_def is ctx.class_def]
    return [b for b in facts.bindings_of(name) if b.ctx.function is ctx.function]


def _may_be_none(facts: ScriptFacts, values: list[cst.BaseExpression]) -> bool:
    """True when the sampler may be None; declines when it may be another kind of sampler."""
    maybe_none = False
    for value in values:
        for leaf in facts.binding_values(value):
            if isinstance(leaf, (cst.IfExp, cst.BooleanOperation)):
                continue
            if isinstance(leaf, cst.Name) and leaf.value == "None":
                maybe_none = True
            elif isinstance(leaf, cst.Call):
                site = next((c for c in facts.calls if c.node is leaf), None)
                if site is None or not is_distributed_sampler(callee_type(facts, site)):
                    raise DeclineFix("the sampler is not a DistributedSampler on every path; reseed it by hand")
            elif isinstance(leaf, (cst.Name, cst.Attribute)) and facts.bindings_of(full_name(leaf) or ""):
                continue  # an alias: its values are in the list too
            else:
                raise DeclineFix("the sampler is not a DistributedSampler on every path; reseed it by hand")
    return maybe_none


def _visible(facts: ScriptFacts, dotted: str, loop: Frame) -> str | None:
    return _visible_at(facts, dotted, loop, facts.line_of(loop.node))


def _visible_at(facts: ScriptFacts, dotted: str, ctx: Frame, line: int, depth: int = 0) -> str | None:
    """An expression for ``dotted`` (bound where it was built) that code at ``ctx``/``line`` can use: the
    name itself, or the parameter its function receives it through from every caller."""
    fn = ctx.function
    head = dotted.split(".")[0]
    if head == "self":
        cls = ctx.class_def
        if cls is not None and fn is not None and _first_param(fn) == "self":
            if any(b.ctx.class_def is cls for b in facts.bindings_of(dotted)):
                return dotted
        return None
    bindings = facts.bindings_of(head)
    if fn is not None and head in param_names(fn, stars=False):
        pass  # a parameter shadows any global of the same name: follow the callers below
    elif any(
        b.ctx.function is fn and b.ctx.class_def is ctx.class_def and facts.line_of(b.value) < line for b in bindings
    ):
        return dotted
    elif any(b.ctx.function is None and b.ctx.class_def is None for b in bindings):
        return dotted
    if fn is None or depth > 1:
        return None
    # Passed in: every call of the function hands the same visible name to one parameter.
    callers = callers_of(facts, fn, how="exact", outside=True)
    chosen: set[str] = set()
    for caller in callers:
        param = parameter_receiving(fn, caller.node, head)
        if param is None or _visible_at(facts, head, caller.ctx, facts.line_of(caller.node), depth + 1) is None:
            return None
        chosen.add(param)
    if len(chosen) != 1:
        return None
    return chosen.pop() + dotted[len(head):]


def _first_param(fn: cst.FunctionDef) -> str | None:
    params = fn.params.posonly_params + fn.params.params
    return params[0].name.value if params else None


# -- the loader that holds the sampler ------------------------------------------------------------------


def _loader_holding(facts: ScriptFacts, sampler: CallSite, name: str | None) -> CallSite | None:
    """The DataLoader whose ``sampler=`` is this sampler call, or the sampler's name in the same function."""
    info = distributed_facts(facts)
    for loader in info.dataloaders:
        value = loader.arg("sampler")
        if value is None:
            continue
        if value is sampler.node:
            return loader
        if isinstance(value, cst.IfExp) and sampler.node in (value.body, value.orelse):
            return loader
        if name is not None and full_name(value) == name and loader.ctx.function is sampler.ctx.function:
            return loader
    return None


def _loader_names(facts: ScriptFacts, loader: CallSite) -> dict[str, list[Binding]]:
    """Names the loader is bound to, with those bindings: its assignment target, the targets of calls of
    the helper that returns it (``train_loader = build_loader(...)``, ``self.loader =
    self._make_loader()``), and the attribute a class it is handed to keeps it in (``self.loader``)."""
    out: dict[str, list[Binding]] = {}
    for binding in facts.bindings:
        if binding.value is loader.node:
            out.setdefault(binding.target, []).append(binding)
    fn = loader.ctx.function
    targets = set(out)
    returned = function_returns(fn) if fn is not None else []
    if any(r is loader.node or full_name(r) in targets for r in returned):
        for binding in facts.bindings:
            value = binding.value
            if isinstance(value, cst.Call):
                callee = full_name(value.func) or ""
                if callee.removeprefix("self.") == fn.name.value:
                    out.setdefault(binding.target, []).append(binding)
    # Handed to a class that keeps it (``Trainer(model, loader)``), whether built where it is handed on
    # or returned by a helper first.
    for name in [n for n in out if "." not in n]:
        out.update(_kept_by_classes(facts, name))
    return out


def _kept_by_classes(facts: ScriptFacts, name: str) -> dict[str, list[Binding]]:
    """``Trainer(model, train_data, ...)`` whose ``__init__`` keeps the loader as ``self.train_data =
    train_data`` (the DDP tutorial's Trainer): ``self.train_data``, which the class's epoch loop sees."""
    out: dict[str, list[Binding]] = {}
    classes = facts.classes_by_name
    for call in facts.calls:
        cls = classes.get(call.name or "")
        init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None) \
            if cls is not None and isinstance(cls.body, cst.IndentedBlock) else None
        if init is None:
            continue
        params = [p.name.value for p in (*init.params.posonly_params, *init.params.params)][1:]
        positional = [a for a in call.node.args if a.keyword is None and not a.star]
        param = next((params[i] for i, a in enumerate(positional) if i < len(params)
                      and full_name(a.value) == name), None)
        param = param or next((a.keyword.value for a in call.node.args
                               if a.keyword is not None and full_name(a.value) == name), None)
        if param is None:
            continue
        for binding in facts.bindings:
            if (binding.ctx.function is init and binding.target.startswith("self.")
                    and isinstance(binding.value, cst.Name) and binding.value.value == param):
                out.setdefault(binding.target, []).append(binding)
    return out


class SamplerSetEpochFix(Codemod):
    rule = "TC504"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _FirstStatementEditor()
        for finding in findings:
            plan: InsertSetEpoch = finding.fix.plan
            statements = list(cst.parse_module(plan.code, config=module.config_for_parsing).body)
            if plan.before is not None and plan.hoisted is not None and plan.name:
                editor.hoist(plan.before, plan.hoisted, plan.name, statements)
            else:
                for statement in statements:
                    editor.prepend(plan.loop, statement)
        return module.visit(editor)


# -- the edit --------------------------------------------------------------------------------------------


class _FirstStatementEditor(StatementEditor):
    """Also puts statements first in a loop's body (a one-line body becomes an indented block)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[int, list[cst.BaseStatement]] = {}
        self.named: dict[int, str] = {}  # id(loader call in a loop header) → the name it is iterated through
        self.moved: set[int] = set()  # batch loops whose comments above go above the statements put before them

    def prepend(self, loop: cst.CSTNode, statement: cst.BaseStatement) -> None:
        self.first.setdefault(id(loop), []).append(statement)

    def hoist(self, batch_loop: cst.For, call: cst.Call, name: str, statements: list[cst.BaseStatement]) -> None:
        """``statements`` before ``batch_loop``, taking its comments, and ``name`` in place of ``call``."""
        statements[0] = statements[0].with_changes(leading_lines=batch_loop.leading_lines)
        self.insert_before(batch_loop, statements)
        self.named[id(call)] = name
        self.moved.add(id(batch_loop))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = self.named.get(id(original_node))
        return cst.Name(name) if name else updated_node

    def _body(self, original: cst.CSTNode, updated):
        if id(original) in self.moved:
            updated = updated.with_changes(leading_lines=[])
        statements = self.first.get(id(original))
        if not statements:
            return updated
        body = updated.body
        if isinstance(body, cst.SimpleStatementSuite):
            body = cst.IndentedBlock(
                body=[cst.SimpleStatementLine(body=list(body.body))], header=body.trailing_whitespace
            )
        return updated.with_changes(body=body.with_changes(body=[*statements, *body.body]))

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return self._body(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return self._body(original_node, updated_node)
