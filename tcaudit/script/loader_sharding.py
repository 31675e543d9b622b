"""Which DataLoaders of a script feed its training, and whether each rank already gets its own share
of their data: the analysis TC503 (a DDP script's loader without a DistributedSampler) and the DDP
conversion (which must shard every training loader or make no edit) share."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import (
    EVAL_NAME,
    TRAIN_NAME,
    DistributedFacts,
    distributed_facts,
    in_test_code,
    literal_value,
)
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.model_classes import callee_class
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import code_text, full_name

# A dataset built per rank (``Subset(ds, indices[rank::world])``, ``split_dataset_by_node``, a
# ``shard(...)``) already gives each process its own data; a streaming dataset splits itself.
SHARDED_TEXT = re.compile(
    r"rank|world_size|num_replicas|shard|split_dataset_by_node|num_shards|streaming|IterableDataset|nodesplitter",
    re.IGNORECASE,
)
# Input libraries that split the data across ranks themselves.
SELF_SHARDING_LIBRARIES = {"webdataset", "ffcv", "torchdata", "streaming", "nvidia", "ray"}

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
SAMPLER_POSITION = 3
BATCH_SAMPLER_POSITION = 4


def dataset_expr(call: CallSite) -> cst.BaseExpression | None:
    return call.arg("dataset", 0)


def is_sharded(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> bool:
    dataset = dataset_expr(call)
    if dataset is None:
        return True  # cannot tell what it loads
    classes = facts.classes_by_name
    for value in facts.binding_values(dataset):
        if SHARDED_TEXT.search(facts.code(value)):
            return True
        # A Dataset class of this file that picks its rank's part itself.
        if isinstance(value, cst.Call):
            cls = classes.get(callee_class(value))
            text = facts.code(cls) if cls is not None else ""
            if SHARDED_TEXT.search(text) and SHARDED_TEXT.search(code_text(text)):  # its code, not its docstring
                return True
    return False


_ITERATION_WRAPPERS = re.compile(r"(^|\.)(enumerate|iter|tqdm|trange|track|islice|zip|progress\w*|Progress\w*)$")


def _iterated(facts: ScriptFacts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a loop header iterates, through ``enumerate``/``tqdm``/``zip``/``iter`` wrappers."""
    if isinstance(expr, cst.Call) and _ITERATION_WRAPPERS.search(full_name(expr.func) or ""):
        out: list[cst.BaseExpression] = []
        for arg in expr.args:
            if arg.keyword is None and not arg.star:
                out += _iterated(facts, arg.value)
        return out
    return [expr]


def step_loop_sources(facts: ScriptFacts, info: DistributedFacts) -> list[cst.BaseExpression]:
    """Every value the iterables of the training step loops may hold (``for x, y in loader`` → the
    expressions ``loader`` is bound to, a ``next(it)`` loop's ``iter(loader)`` argument's values)."""
    out: list[cst.BaseExpression] = []
    for frame in info.step_loops.values():
        node = frame.node
        heads: list[cst.BaseExpression] = []
        if isinstance(node, cst.For):
            heads = _iterated(facts, node.iter)
        for call in facts.calls:
            if call.name == "next" and call.node.args and call.ctx.inside(node):
                for value in facts.binding_values(call.node.args[0].value):
                    if isinstance(value, cst.Call) and full_name(value.func) == "iter" and value.args:
                        heads.append(value.args[0].value)
        for head in heads:
            out += _values(facts, head, frame.function)
    return out


def _values(facts: ScriptFacts, expr: cst.BaseExpression, fn: cst.FunctionDef | None, depth: int = 0) -> list[cst.BaseExpression]:
    """The values ``expr`` may hold, following assignments and, for a parameter of ``fn``, the
    arguments its callers in this file pass (``train_epoch(model, opt, loader)``), two calls deep."""
    out: list[cst.BaseExpression] = []
    for value in facts.binding_values(expr):
        out.append(value)
        if depth >= 2 or fn is None or not isinstance(value, cst.Name) or facts.bindings_of(value.value):
            continue
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        if value.value not in params and value.value not in {p.name.value for p in fn.params.kwonly_params}:
            continue
        index = params.index(value.value) if value.value in params else None
        for caller in callers_of(facts, fn, outside=True):
            position = index
            if position is not None and params[:1] in (["self"], ["cls"]) and caller.method is not None:
                position -= 1
            arg = caller.arg(value.value, position)
            if arg is not None:
                out += _values(facts, arg, caller.ctx.function, depth + 1)
    return out


def feeds_training(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> bool | None:
    """Whether this DataLoader's batches reach a training step, by data flow (no names): True when a
    loop that trains iterates it (directly, through a helper that returns it, a parameter, a lambda),
    False when only loops that do not train do, None when its batches cannot be followed."""
    pipeline = pipeline_facts(facts)
    site = pipeline.loader_for(call.node)
    reached = [b for b in pipeline.batch_loops if any(s is site for s in b.loaders)] if site is not None else []
    if any(pipeline.is_training_loop(b) or id(b.loop) in info.step_loops for b in reached):
        return True
    made = made_by(facts, call)
    if made:
        sources = {id(v) for v in step_loop_sources(facts, info)}
        if any(id(node) in sources for node in made):
            return True
    if reached:
        return False
    return None


def feeds_only_other_loops(facts: ScriptFacts, call: CallSite) -> bool:
    """The DataLoader's batches are followed, and only loops that do not train iterate them (a helper's
    loader evaluated under no_grad): not a training loader, whatever its names say."""
    verdict = feeds_training(facts, distributed_facts(facts), call)
    if verdict is not None:
        return not verdict
    # Built by a helper each of whose results is bound to an evaluation name (``eval_batches =
    # get_data(ds)``) or to a name nothing reads (a loader never iterated feeds nothing), or iterated
    # right where it is made under no_grad (``for x, y in eval_loader_fn(ds):``).
    made = {id(node) for node in made_by(facts, call)}
    if not made:
        return False
    bound = {id(b.value): b.target for b in facts.bindings if id(b.value) in made}
    for site in facts.calls:
        if id(site.node) not in made:
            continue
        target = bound.get(id(site.node))
        if target is not None:
            if not (EVAL_NAME.search(target) or facts.mentions(target) <= 1):
                return False
        elif not facts.in_eval(site.ctx):
            return False
    return True


def also_feeds_other_loops(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> str | None:
    """The helper's name when the DataLoader is built in a helper (a function or a lambda) that also
    builds loaders no training loop iterates (``holdout = build_loader(ds)`` evaluated under no_grad):
    a sampler in the helper would split those too."""
    made = made_by(facts, call)
    if not made:
        return None
    sources = {id(v) for v in step_loop_sources(facts, info)}
    for node in made:
        if id(node) not in sources:
            return full_name(node.func) or "the helper"
    return None


def made_by(facts: ScriptFacts, call: CallSite) -> list[cst.Call]:
    """The calls whose value is this DataLoader when a helper returns it (``def build_loader(ds):
    return DataLoader(ds, ...)``) or a lambda bound to a name builds it (``make = lambda ds:
    DataLoader(ds, ...)``): the helper's calls in this file."""
    lambdas = [f.node for f in call.ctx.chain() if f.kind == "lambda"]
    if lambdas and lambdas[0].body is call.node:  # type: ignore[attr-defined]
        return [c.node for c in callers_of(facts, lambdas[0])]
    fn = call.ctx.function
    statement = call.statement
    if lambdas or fn is None or statement is None or not isinstance(statement.node, cst.SimpleStatementLine):
        return []
    if not any(isinstance(s, cst.Return) and s.value is call.node for s in statement.node.body):
        return []
    return [c.node for c in callers_of(facts, fn, outside=True)]


def is_training_loader(facts: ScriptFacts, info: DistributedFacts, call: CallSite, name: str | None) -> bool:
    """The fallback where data flow cannot follow the loader (handed to code outside this file)."""
    if facts.in_eval(call.ctx):
        return False
    dataset = dataset_expr(call)
    dataset_text = facts.code(dataset) if dataset is not None else ""
    if name and EVAL_NAME.search(name) or EVAL_NAME.search(dataset_text):
        return False
    if name and TRAIN_NAME.search(name) or TRAIN_NAME.search(dataset_text):
        return True
    if not name:
        return False
    # An unnamed-purpose loader (``loader``) counts when a step loop iterates it.
    short = name.split(".")[-1]
    for loop in info.step_loops.values():
        if not name.startswith("self.") and call.ctx.function is not None and loop.function is not call.ctx.function:
            continue  # a local `loader` of another function (an evaluate helper's) is another loader
        node = loop.node
        header = node.iter if isinstance(node, cst.For) else node.test  # type: ignore[union-attr]
        if re.search(rf"\b{re.escape(short)}\b", facts.code(header)):
            return True
        if isinstance(node, cst.While) and re.search(rf"\b{re.escape(short)}\b", facts.code(node)):
            return True
    return False


_PLAIN_SAMPLERS = {
    "torch.utils.data.RandomSampler": True, "torch.utils.data.sampler.RandomSampler": True,
    "torch.utils.data.SequentialSampler": False, "torch.utils.data.sampler.SequentialSampler": False,
}


def plain_sampler(facts: ScriptFacts, expr: cst.BaseExpression | None) -> tuple[cst.BaseExpression, bool] | None:
    """``RandomSampler(ds)`` or ``SequentialSampler(ds)`` (written in the call or bound once to a name),
    with nothing but the dataset: (the dataset expression, whether it shuffles). DistributedSampler
    with the same shuffle is its per-rank equivalent; ``replacement``, ``num_samples`` or a
    ``generator`` are not."""
    if expr is None:
        return None
    values = facts.binding_values(expr)
    value = values[-1] if isinstance(expr, cst.Name) and len(values) == 2 else expr
    if not isinstance(value, cst.Call) or len(value.args) != 1 or value.args[0].keyword is not None or value.args[0].star:
        return None
    shuffles = _PLAIN_SAMPLERS.get(facts.qualname(value.func) or "")
    if shuffles is None:
        return None
    return value.args[0].value, shuffles


@dataclass(frozen=True)
class TrainingLoader:
    """A DataLoader call whose batches train, with no sampler of its own and no per-rank dataset."""

    call: CallSite
    name: str | None  # what the script calls it (``train_loader``, ``self.loader``), None if unbound
    unseen: str | None = None  # why its keywords cannot all be seen (a ``**kwargs`` dict), else None


def unsharded_training_loaders(facts: ScriptFacts, info: DistributedFacts) -> list[TrainingLoader]:
    """The training loaders that give every rank the whole dataset: no sampler or batch_sampler (by
    keyword, position or a visible ``**kwargs`` dict), not built per rank, not in test or evaluation
    code. A loader whose ``**kwargs`` cannot be followed is listed with ``unseen`` set: it may hold a
    sampler, or not."""
    out: list[TrainingLoader] = []
    for call in info.dataloaders:
        if in_test_code(call.ctx) or facts.in_eval(call.ctx):
            continue  # test code; or built in evaluation code (no_grad, inference_mode): its batches train nothing
        positional = [a for a in call.node.args if a.keyword is None and not a.star]
        if len(positional) > SAMPLER_POSITION:
            continue  # sampler passed by position
        given = [call.arg(key) for key in ("sampler", "batch_sampler")]
        if given[0] is not None and plain_sampler(facts, given[0]) is not None:
            given[0] = None  # ``sampler=RandomSampler(ds)``: becomes DistributedSampler(ds, shuffle=True)
        if any(value is not None and literal_value(value) is not None for value in given):
            continue  # a sampler of its own (``sampler=None`` is none)
        name = info.target_of(call.node)
        flow = feeds_training(facts, info, call)
        if flow is False or (flow is None and not is_training_loader(facts, info, call, name)):
            continue
        if is_sharded(facts, info, call):
            continue
        unseen = None
        site = pipeline_facts(facts).loader_for(call.node)
        if site is None or not site.complete:
            star = next((facts.code(a.value) for a in call.node.args if a.star), None)
            unseen = f"its arguments come from `{star}`, which cannot be followed" if star else (
                "its call could not be followed")
        elif any(literal_value(v) is not None and not (key == "sampler" and plain_sampler(facts, v) is not None)
                 for key in ("sampler", "batch_sampler") for v in site.values(key)):
            continue  # a visible ``**`` dict holds a sampler
        out.append(TrainingLoader(call, name, unseen))
    return out
