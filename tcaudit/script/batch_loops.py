"""Facts about batch loops: the loops whose body receives batches from DataLoaders, the names that
hold the batches (``for x, y in loader``, ``enumerate(tqdm(loader))``, ``zip(a, b)``, ``batch =
next(it)`` with ``it = iter(loader)``, and their unpacking), whether a loop trains, and the host to
device copies (``.cuda()``, ``.to(device)``) made there.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.expressions import assigned_targets
from tcaudit.script.facts import CallSite, Frame
from tcaudit.script.loader_construction import LoaderConstructionFacts, LoaderSite
from tcaudit.source.syntax import contains, full_name, nodes_of, target_names
from tcaudit.source.memo import remembered

_ITER_WRAPPERS = re.compile(r"(^|\.)(tqdm|trange|track|progress\w*|Progress\w*|enumerate|iter|islice)$")


@dataclass
class BatchLoop:
    """A loop (``for`` or ``while``) whose body receives batches from DataLoaders."""

    loop: cst.CSTNode
    ctx: Frame  # the context of the loop statement itself
    names: set[str] = field(default_factory=set)
    loaders: list[LoaderSite] = field(default_factory=list)
    repeat_ctx: Frame | None = None  # where a new pass over the loader starts (the ``for``, or ``iter(...)``)
    # Instances of this file's own iterable classes the same loop may iterate instead of a DataLoader
    # (``loader = SyntheticBatches(...) if args.synthetic else DataLoader(...)``).
    own_iterables: list[cst.Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.repeat_ctx is None:
            self.repeat_ctx = self.ctx


class BatchLoopFacts(LoaderConstructionFacts):
    """The loops that receive the DataLoaders' batches, on top of the loaders and the training code."""

    @functools.cached_property
    def batch_loops(self) -> list[BatchLoop]:
        """Loops whose body receives batches from DataLoaders, with the names that hold them."""
        facts = self.facts
        loops: dict[int, BatchLoop] = {}
        seen_for: set[int] = set()
        for call in facts.calls:
            for frame in call.ctx.chain():
                if frame.kind != "loop" or not isinstance(frame.node, cst.For) or id(frame.node) in seen_for:
                    continue
                seen_for.add(id(frame.node))
                loop = frame.node
                outer = frame.parent
                assert outer is not None
                pairs = self._iteration_pairs(loop.target, loop.iter)
                batch = BatchLoop(loop, outer)
                for target, source in pairs:
                    own: list[cst.Call] = []
                    sites = self.loader_sites_for(source, outer.function, own_iterables=own)
                    if sites:
                        batch.names |= target_names(target)
                        batch.loaders += sites
                        batch.own_iterables += own
                if batch.names:
                    loops[id(loop)] = batch
        for call in facts.calls:
            if call.name != "next" or not call.node.args:
                continue
            iter_call = self._next_source(call.node.args[0].value)
            if iter_call is None:
                continue
            source = iter_call.node.args[0].value
            own: list[cst.Call] = []
            sites = self.loader_sites_for(source, call.ctx.function, own_iterables=own)
            targets = assigned_targets(call)
            if not sites or not targets:
                continue
            loop_frame = call.ctx.nearest("loop")
            loop = loop_frame.node if loop_frame is not None else (call.ctx.function or facts.module)
            outer = loop_frame.parent if loop_frame is not None and loop_frame.parent is not None else call.ctx
            batch = loops.setdefault(id(loop), BatchLoop(loop, outer, repeat_ctx=iter_call.ctx))
            for target in targets:
                batch.names |= target_names(target)
            batch.loaders += sites
            batch.own_iterables += own
        for batch in loops.values():
            _add_unpacked(batch)
        return list(loops.values())

    def _iteration_pairs(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
        """(loop target part, iterated expression) pairs: ``enumerate``, ``tqdm`` and ``zip`` unwrapped."""
        if isinstance(iterable, cst.Call):
            dotted = full_name(iterable.func) or ""
            args = [a.value for a in iterable.args if a.keyword is None and not a.star]
            if dotted == "enumerate" and args:
                if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
                    return self._iteration_pairs(target.elements[1].value, args[0])
                return []
            if dotted == "zip" and args:
                if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(args):
                    out = []
                    for element, arg in zip(target.elements, args):
                        out += self._iteration_pairs(element.value, arg)
                    return out
                return []
            if _ITER_WRAPPERS.search(dotted) and args:
                return self._iteration_pairs(target, args[0])
            return []
        return [(target, iterable)]

    def _next_source(self, expr: cst.BaseExpression) -> CallSite | None:
        """``next(it)`` with ``it = iter(loader)`` (or ``next(iter(loader))``) → the ``iter`` call."""
        for value in self.facts.binding_values(expr):
            if isinstance(value, cst.Call) and full_name(value.func) == "iter" and value.args:
                return self.call_site(value)
        return None

    @functools.cached_property
    def _call_sites(self) -> dict[int, CallSite]:
        return {id(c.node): c for c in self.facts.calls}

    def call_site(self, node: cst.Call) -> CallSite | None:
        return self._call_sites.get(id(node))

    def reiterated(self, site: LoaderSite) -> bool:
        """Whether the loader is iterated again and again (one pass per epoch): its ``for`` loop, or
        the ``iter(loader)`` that feeds ``next``, repeats."""
        for batch in self.batch_loops:
            if any(s is site for s in batch.loaders) and self.repeats(batch.repeat_ctx):
                return True
        return False

    def is_training_loop(self, batch: BatchLoop) -> bool:
        facts = self.facts
        if facts.in_eval(batch.ctx):
            return False
        if isinstance(batch.loop, (cst.For, cst.While)):
            return self.body_trains(batch.loop)
        return batch.loop in self.step_functions or batch.loop in self.functions_reaching_step

    def repeats(self, ctx: Frame, depth: int = 2) -> bool:
        """Whether code at ``ctx`` runs more than once: inside a loop, or in a function called from one."""
        if ctx.nearest("loop") is not None:
            return True
        fn = ctx.function
        if fn is None or depth == 0:
            return False
        return any(self.repeats(c.ctx, depth - 1) for c in callers_of(self.facts, fn, how="self", outside=True))


def _add_unpacked(batch: BatchLoop) -> None:
    """``inputs, labels = data`` / ``images = batch["image"]`` inside the loop: more batch names."""
    names = batch.names

    def source_name(value: cst.BaseExpression) -> str | None:
        if isinstance(value, cst.Subscript):
            value = value.value
        return full_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None

    assigns = remembered(batch.loop, "loop assigns", lambda: _loop_assigns(batch.loop))
    for _ in range(2):
        for node in assigns:
            values = node.value.elements if isinstance(node.value, (cst.Tuple, cst.List)) else None
            for target in node.targets:
                if values is not None and isinstance(target.target, (cst.Tuple, cst.List)):
                    for t, v in zip(target.target.elements, values):
                        if source_name(v.value) in names:
                            names |= target_names(t.value)
                elif source_name(node.value) in names:
                    names |= target_names(target.target)


def _loop_assigns(loop: cst.CSTNode) -> list[cst.Assign]:
    """The assignments in a batch loop (not in functions defined inside it)."""
    root = loop.body if isinstance(loop, (cst.For, cst.While)) else loop
    inner = {id(a) for d in nodes_of(root, cst.FunctionDef) if d is not loop for a in nodes_of(d, cst.Assign)}
    return [a for a in nodes_of(root, cst.Assign) if id(a) not in inner]


def element_source(statement: cst.CSTNode, node: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """What ``name`` iterates over where ``node`` (inside ``statement``) uses it as an element: the
    iterable of the comprehension whose target binds it (``[t.cuda() for t in batch]`` → ``batch``,
    ``{k: v.to(d) for k, v in batch.items()}`` → ``batch.items()``), or the sequence a ``map`` applies a
    one-parameter lambda to (``map(lambda t: t.cuda(), batch)`` → ``batch``). None otherwise."""
    found: list[cst.BaseExpression] = []

    class _Find(cst.CSTVisitor):
        def visit_CompFor(self, comp: cst.CompFor) -> None:
            if name in target_names(comp.target):
                found.append(comp.iter)

        def visit_Call(self, call: cst.Call) -> None:
            if (isinstance(call.func, cst.Name) and call.func.value == "map" and len(call.args) == 2
                    and isinstance(call.args[0].value, cst.Lambda)):
                params = call.args[0].value.params.params
                if len(params) == 1 and params[0].name.value == name and contains(call.args[0].value, node):
                    found.append(call.args[1].value)

    comprehensions = nodes_of(statement, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp))
    holders = [c for c in comprehensions if contains(c, node)]
    for holder in holders:
        holder.visit(_Find())
    if not holders:
        statement.visit(_Find())
    return found[0] if len(found) == 1 else None
