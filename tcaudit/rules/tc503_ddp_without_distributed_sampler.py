"""TC503 ddp-without-distributed-sampler: a DDP script whose training DataLoader has no sampler.

Fix (safe): ``sampler=DistributedSampler(dataset, shuffle=<the loader's shuffle>)`` in place of the
loader's ``shuffle=`` (shuffle beside a sampler is a ValueError), importing DistributedSampler where
needed; a dataset built inside the DataLoader call is bound to a name on the line before. Declined
for a batch_sampler, a sampler already given, an IterableDataset, a loader built before
``init_process_group`` or ``shuffle=`` set where it cannot be moved safely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import DeclineFix, FixContext, ensure_import, parse_expression
from tcaudit.rewrite.edits import CallEditor, add_keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.distributed import (
    EVAL_NAME,
    TRAIN_NAME,
    DistributedFacts,
    code,
    distributed_facts,
    in_test_code,
    is_dataloader,
    literal_value,
    passes_keyword,
)
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.loader_construction import KeyValue, LoaderSite
from tcaudit.script.pipeline import pipeline_facts

# A dataset built per rank (``Subset(ds, indices[rank::world])``, ``split_dataset_by_node``, a
# ``shard(...)``) already gives each process its own data; a streaming dataset splits itself.
_SHARDED_TEXT = re.compile(
    r"rank|world_size|num_replicas|shard|split_dataset_by_node|num_shards|streaming|IterableDataset|nodesplitter",
    re.IGNORECASE,
)
# Input libraries that split the data across ranks themselves.
_SELF_SHARDING_LIBRARIES = {"webdataset", "ffcv", "torchdata", "streaming", "nvidia", "ray"}

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
_SAMPLER_POSITION = 3


def _dataset_expr(call: CallSite) -> cst.BaseExpression | None:
    return call.arg("dataset", 0)


def _is_sharded(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> bool:
    dataset = _dataset_expr(call)
    if dataset is None:
        return True  # cannot tell what it loads
    classes = facts.classes_by_name
    for value in facts.binding_values(dataset):
        if _SHARDED_TEXT.search(code(facts, value)):
            return True
        # A Dataset class of this file that picks its rank's part itself.
        if isinstance(value, cst.Call):
            cls = classes.get((get_full_name_for_node(value.func) or "").split(".")[-1])
            if cls is not None and _SHARDED_TEXT.search(code(facts, cls)):
                return True
    return False


_ITERATION_WRAPPERS = re.compile(r"(^|\.)(enumerate|iter|tqdm|trange|track|islice|zip|progress\w*|Progress\w*)$")


def _iterated(facts: ScriptFacts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a loop header iterates, through ``enumerate``/``tqdm``/``zip``/``iter`` wrappers."""
    if isinstance(expr, cst.Call) and _ITERATION_WRAPPERS.search(get_full_name_for_node(expr.func) or ""):
        out: list[cst.BaseExpression] = []
        for arg in expr.args:
            if arg.keyword is None and not arg.star:
                out += _iterated(facts, arg.value)
        return out
    return [expr]


def _step_loop_sources(facts: ScriptFacts, info: DistributedFacts) -> list[cst.BaseExpression]:
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
                    if isinstance(value, cst.Call) and get_full_name_for_node(value.func) == "iter" and value.args:
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
        for caller in facts.callers(fn):
            if caller.ctx.inside(fn):
                continue
            position = index
            if position is not None and params[:1] in (["self"], ["cls"]) and caller.method is not None:
                position -= 1
            arg = caller.arg(value.value, position)
            if arg is not None:
                out += _values(facts, arg, caller.ctx.function, depth + 1)
    return out


def _feeds_training(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> bool | None:
    """Whether this DataLoader's batches reach a training step, by data flow (no names): True when a
    loop that trains iterates it (directly, through a helper that returns it, a parameter, a lambda),
    False when only loops that do not train do, None when its batches cannot be followed."""
    pipeline = pipeline_facts(facts)
    site = pipeline.loader_for(call.node)
    reached = [b for b in pipeline.batch_loops if any(s is site for s in b.loaders)] if site is not None else []
    if any(pipeline.is_training_loop(b) or id(b.loop) in info.step_loops for b in reached):
        return True
    made = _made_by(facts, call)
    if made:
        sources = {id(v) for v in _step_loop_sources(facts, info)}
        if any(id(node) in sources for node in made):
            return True
    if reached:
        return False
    return None


def _also_feeds_other_loops(facts: ScriptFacts, info: DistributedFacts, call: CallSite) -> str | None:
    """The helper's name when the DataLoader is built in a helper (a function or a lambda) that also
    builds loaders no training loop iterates (``holdout = build_loader(ds)`` evaluated under no_grad):
    a sampler in the helper would split those too."""
    made = _made_by(facts, call)
    if not made:
        return None
    sources = {id(v) for v in _step_loop_sources(facts, info)}
    for node in made:
        if id(node) not in sources:
            return get_full_name_for_node(node.func) or "the helper"
    return None


def _made_by(facts: ScriptFacts, call: CallSite) -> list[cst.Call]:
    """The calls whose value is this DataLoader when a helper returns it (``def build_loader(ds):
    return DataLoader(ds, ...)``) or a lambda bound to a name builds it (``make = lambda ds:
    DataLoader(ds, ...)``): the helper's calls in this file."""
    lambdas = [f.node for f in call.ctx.chain() if f.kind == "lambda"]
    if lambdas and lambdas[0].body is call.node:  # type: ignore[attr-defined]
        names = [b.target for b in facts.bindings if b.value is lambdas[0]]
        return [c.node for c in facts.calls if c.name in names]
    fn = call.ctx.function
    statement = call.statement
    if lambdas or fn is None or statement is None or not isinstance(statement.node, cst.SimpleStatementLine):
        return []
    if not any(isinstance(s, cst.Return) and s.value is call.node for s in statement.node.body):
        return []
    return [c.node for c in facts.callers(fn) if not c.ctx.inside(fn)]


def _is_training_loader(facts: ScriptFacts, info: DistributedFacts, call: CallSite, name: str | None) -> bool:
    """The fallback where data flow cannot follow the loader (handed to code outside this file)."""
    if facts.in_eval(call.ctx):
        return False
    dataset = _dataset_expr(call)
    dataset_text = code(facts, dataset) if dataset is not None else ""
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
        if re.search(rf"\b{re.escape(short)}\b", code(facts, header)):
            return True
        if isinstance(node, cst.While) and re.search(rf"\b{re.escape(short)}\b", code(facts, node)):
            return True
    return False


@dataclass
class _SamplerEdits:
    """The edits of one DataLoader call (nodes of the analysed module)."""

    sampler: cst.BaseExpression  # ``DistributedSampler(dataset, shuffle=...)``, as written at the call
    import_sampler: bool = False
    hoist: tuple[cst.SimpleStatementLine, cst.BaseExpression, str] | None = None  # (statement, dataset, new name)
    shuffle_keyword: cst.Arg | None = None  # replaced by sampler= in place
    shuffle_positional: cst.Arg | None = None  # becomes False
    removed: list[cst.CSTNode] = field(default_factory=list)  # shuffle entries of a ``**`` dict


@dataclass(frozen=True, eq=False)
class AddSampler(FixPlan):
    kind = "add-distributed-sampler"
    call: cst.Call  # the DataLoader(...) call
    edits: _SamplerEdits
    line: int
    dataset: str | None
    shuffle: str | None  # the loader's shuffle= as written, None when it has none
    loader: str | None
    sampler: str  # the sampler expression written
    import_sampler: bool


class DdpWithoutDistributedSampler(ScriptRule):
    id = "TC503"
    triggers = (r"DistributedDataParallel|FullyShardedDataParallel|fully_shard",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if not info.is_ddp_script or facts.frameworks or info.iterable_dataset_defined:
            return
        if facts.imported_roots() & _SELF_SHARDING_LIBRARIES:
            return
        for call in info.dataloaders:
            if in_test_code(call.ctx):
                continue
            positional = [a for a in call.node.args if a.keyword is None and not a.star]
            if len(positional) > _SAMPLER_POSITION:
                continue  # sampler passed by position
            sampler = passes_keyword(facts, call, "sampler")
            batch_sampler = passes_keyword(facts, call, "batch_sampler")
            if sampler is None or batch_sampler is None:
                continue  # a **kwargs dict we cannot see may hold one
            if sampler and literal_value(call.arg("sampler")) is not None:
                continue
            if batch_sampler and literal_value(call.arg("batch_sampler")) is not None:
                continue
            if facts.in_eval(call.ctx):
                continue  # built in evaluation code (no_grad, inference_mode): its batches train nothing
            name = info.target_of(call.node)
            flow = _feeds_training(facts, info, call)
            if flow is False or (flow is None and not _is_training_loader(facts, info, call, name)):
                continue
            if _is_sharded(facts, info, call):
                continue
            dataset = _dataset_expr(call)
            shuffle = call.arg("shuffle", 2)

            def plan(call=call, name=name, dataset=dataset, shuffle=shuffle) -> AddSampler:
                shared = _also_feeds_other_loops(facts, info, call)
                if shared:
                    raise DeclineFix(
                        f"`{shared}` also builds loaders that no training loop iterates; a sampler there "
                        "would split them across ranks too: add it where training builds its loader, by hand"
                    )
                edits = _plan(facts, call)
                return AddSampler(
                    call.node,
                    edits,
                    facts.line_of(call.node),
                    code(facts, dataset) if dataset is not None else None,
                    code(facts, shuffle) if shuffle is not None else None,
                    name,
                    code(facts, edits.sampler),
                    edits.import_sampler,
                )

            yield self.finding(
                facts,
                call.node,
                _message(name),
                explanation=_EXPLANATION,
                fix=self.planned_fix(
                    FixClass.SAFE,
                    "pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle= "
                    "(shuffle with a sampler is a ValueError)",
                    plan,
                ),
            )
        yield from self._partial_loaders(facts, info)

    def _partial_loaders(self, facts: ScriptFacts, info: DistributedFacts) -> Iterator[Finding]:
        """``make = functools.partial(DataLoader, batch_size=64, shuffle=True)``; ``loader = make(train_set)``
        iterated by the training loop: reported at the call that builds the loader, fix declined."""
        sources = None
        for partial in facts.calls:
            if not (partial.qualname or "").endswith("functools.partial") or not partial.node.args:
                continue
            inner = partial.node.args[0].value
            if not is_dataloader(facts.qualname(inner)) or in_test_code(partial.ctx):
                continue
            if any(a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler") for a in partial.node.args):
                continue
            names = [b.target for b in facts.bindings if b.value is partial.node]
            if sources is None:
                sources = {id(v) for v in _step_loop_sources(facts, info)}
            for made in facts.calls:
                if made.name not in names or id(made.node) not in sources:
                    continue
                if any(a.star or (a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler")) for a in made.node.args):
                    continue
                dataset = made.arg("dataset", 0)
                if dataset is not None and _SHARDED_TEXT.search(code(facts, dataset)):
                    continue
                yield self.finding(
                    facts,
                    made.node,
                    _message(info.target_of(made.node)),
                    explanation=_EXPLANATION,
                    fix=Fix(
                        FixClass.SAFE,
                        "pass sampler=DistributedSampler(dataset, shuffle=...) and drop shuffle=",
                        available=False,
                        reason=f"the DataLoader is built through `functools.partial` (`{made.name}`); its "
                        "shuffle= and the sampler must be changed where the partial is made, by hand",
                    ),
                )


def _message(name: str | None) -> str:
    return f"the training DataLoader{f' `{name}`' if name else ''} of this DDP job has no DistributedSampler"


_EXPLANATION = "Every rank iterates the whole dataset, so N GPUs do the work of one."


# -- the plan for one DataLoader ---------------------------------------------------------------------------

SAMPLER_QUALNAMES = ("torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler")
SAMPLER_IMPORT = "from torch.utils.data.distributed import DistributedSampler"


def _plan(facts: ScriptFacts, call: CallSite) -> _SamplerEdits:
    site = pipeline_facts(facts).loader_for(call.node)
    if site is None:
        raise DeclineFix("the DataLoader call could not be located")
    _check_loader(facts, call, site)
    hoist: list = []
    dataset = _dataset(facts, call, hoist)
    callee, imported = _sampler_callee(facts, call)
    edits = _SamplerEdits(sampler=cst.Name("None"), import_sampler=not imported, hoist=hoist[0] if hoist else None)
    shuffle = _plan_shuffle(facts, call, site, edits)
    edits.sampler = parse_expression(f"{callee}({dataset}, shuffle={shuffle})", facts.module)
    return edits


class DdpDistributedSamplerFix(Codemod):
    rule = "TC503"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _SamplerEditor()
        needs_import = False
        for finding in findings:
            plan: AddSampler = finding.fix.plan
            editor.take(plan.call, plan.edits)
            needs_import |= plan.import_sampler
        new = module.visit(editor)
        if needs_import:
            new = ensure_import(new, SAMPLER_IMPORT)
        return new


# -- checks ---------------------------------------------------------------------------------------------


def _check_loader(facts: ScriptFacts, call: CallSite, site: LoaderSite) -> None:
    if not site.complete:
        raise DeclineFix("the DataLoader takes *args or a **kwargs dict that cannot be followed")
    for value in site.values("batch_sampler"):
        if literal_value(value) is not None:
            raise DeclineFix("the DataLoader has a batch_sampler, which excludes sampler=")
    for kv in site.keys.get("sampler", []):
        if kv.source != "keyword" or literal_value(kv.value) is not None:
            raise DeclineFix("the DataLoader already receives a sampler; make it distributed by hand")
    info = distributed_facts(facts)
    fn = call.ctx.function
    line = facts.line_of(call.node)
    inits = [c for c in info.init_process_group_calls if c.ctx.function is fn]
    if inits and all(facts.line_of(c.node) > line for c in inits):
        raise DeclineFix(
            "the DataLoader is built before init_process_group, and DistributedSampler needs the process group"
        )


_HOIST_NAMES = ("train_dataset", "train_set", "dataset")


def _hoist(facts: ScriptFacts, call: CallSite, dataset: cst.BaseExpression, hoist: list) -> str:
    """``DataLoader(Numbers(48), ...)``: bind the dataset to a new name on the line before, so the
    sampler and the loader share one dataset (naming the expression twice would build it twice)."""
    refusal = ("the dataset is built in the DataLoader call where it cannot be bound to a name first "
               "(naming the expression twice would build the dataset twice)")
    statement = call.statement
    if statement is None or not isinstance(statement.node, cst.SimpleStatementLine) or len(statement.node.body) != 1:
        raise DeclineFix(refusal)
    if any(frame.kind == "lambda" for frame in call.ctx.chain()):
        raise DeclineFix(refusal)
    if any(isinstance(n, (cst.IfExp, cst.BooleanOperation, cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.Lambda))
           for n in _ancestors_within(statement.node, call.node)):
        raise DeclineFix(refusal)
    taken = {b.target for b in facts.bindings} | {site.local for site in facts.imports}
    taken |= {fn.name.value for fn, _ in facts.functions}
    fn = call.ctx.function
    if fn is not None:
        taken |= {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params)}
    name = next((n for n in _HOIST_NAMES if n not in taken), None)
    if name is None:
        raise DeclineFix(refusal)
    hoist.append((statement.node, dataset, name))
    return name


def _ancestors_within(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes on the path from ``root`` down to ``target`` (both excluded)."""
    path: list[cst.CSTNode] = []
    found: list[cst.CSTNode] = []

    class _Path(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if found:
                return False
            if node is target:
                found.extend(path[1:])
                return False
            path.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if path and path[-1] is original_node:
                path.pop()

    root.visit(_Path())
    return found


def _dataset(facts: ScriptFacts, call: CallSite, hoist: list) -> str:
    dataset = call.arg("dataset", 0)
    if dataset is None:
        raise DeclineFix("the DataLoader's dataset could not be found")
    if not isinstance(dataset, (cst.Name, cst.Attribute)) or get_full_name_for_node(dataset) is None:
        if isinstance(dataset, cst.Call):
            callee = facts.qualname(dataset.func) or get_full_name_for_node(dataset.func) or ""
            if "IterableDataset" in callee or "IterDataPipe" in callee or "datapipes" in callee:
                raise DeclineFix("an IterableDataset cannot take a sampler; shard it per rank instead")
        return _hoist(facts, call, dataset, hoist)
    for value in facts.binding_values(dataset):
        if isinstance(value, cst.Call):
            callee = facts.qualname(value.func) or get_full_name_for_node(value.func) or ""
            if "IterableDataset" in callee or "IterDataPipe" in callee or "datapipes" in callee:
                raise DeclineFix("an IterableDataset cannot take a sampler; shard it per rank instead")
    return facts.module.code_for_node(dataset)


def _sampler_callee(facts: ScriptFacts, call: CallSite) -> tuple[str, bool]:
    """How to spell DistributedSampler at the call, and whether the file already imports it so."""
    fn = call.ctx.function
    for site in facts.imports:
        if site.qualname in SAMPLER_QUALNAMES and (site.ctx is facts.module_frame or site.ctx.function is fn):
            return site.local, True
    taken = facts.bindings_of("DistributedSampler") or any(
        site.local == "DistributedSampler" for site in facts.imports
    )
    if taken:
        raise DeclineFix("the name DistributedSampler is bound to something else in this file")
    return "DistributedSampler", False


# -- shuffle ---------------------------------------------------------------------------------------------


def _plan_shuffle(facts: ScriptFacts, call: CallSite, site: LoaderSite, edits: _SamplerEdits) -> str:
    """Take ``shuffle`` off the loader (planning the edit) and return the code it had (``False`` if none)."""
    written = site.keys.get("shuffle", [])
    if not written:
        return "False"
    if len(written) > 1 or written[0].conditional:
        raise DeclineFix("shuffle= is set in more than one place; move it into the sampler by hand")
    kv = written[0]
    code = facts.module.code_for_node(kv.value)
    if kv.source == "keyword":
        edits.shuffle_keyword = kv.node
    elif kv.source == "positional":
        edits.shuffle_positional = kv.node
    else:
        _plan_dict_removal(facts, call, kv, edits)
    return code


def _plan_dict_removal(facts: ScriptFacts, call: CallSite, kv: KeyValue, edits: _SamplerEdits) -> None:
    name = kv.source
    if not isinstance(kv.node, (cst.DictElement, cst.Arg)):
        raise DeclineFix(f"shuffle is set on `{name}` by assignment; move it into the sampler by hand")
    bindings = facts.bindings_of(name)
    if len(bindings) != 1 or bindings[0].ctx.function is not call.ctx.function:
        raise DeclineFix(f"shuffle comes from the `{name}` dict, bound elsewhere; move it into the sampler by hand")
    # Only this loader may read the dict: another loader (or a copy) would lose its shuffle.
    scope = call.ctx.function or facts.module
    if _occurrences(scope, name) != 2:  # the assignment and the ``**`` at this call
        raise DeclineFix(f"the `{name}` dict that holds shuffle= is used elsewhere too; a sampler beside "
                         "shuffle=True is a ValueError")
    edits.removed.append(kv.node)


def _occurrences(node: cst.CSTNode, dotted: str) -> int:
    """How often a (dotted) name is written or read under ``node``."""
    count = 0

    class _V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> bool:
            nonlocal count
            if get_full_name_for_node(n) == dotted:
                count += 1
                return False
            n.value.visit(self)
            return False

        def visit_Name(self, n: cst.Name) -> None:
            nonlocal count
            if n.value == dotted:
                count += 1

    node.visit(_V())
    return count


# -- the edit --------------------------------------------------------------------------------------------


class _SamplerEditor(CallEditor):
    def __init__(self) -> None:
        super().__init__()
        self.samplers: dict[int, cst.BaseExpression] = {}
        self.shuffle_keyword: dict[int, cst.Arg] = {}
        self.shuffle_positional: dict[int, cst.Arg] = {}
        self.removed: set[int] = set()  # dict entries and dict(...) keywords
        self.hoisted: dict[int, tuple[cst.BaseExpression, str]] = {}  # loader call → (dataset expression, new name)
        self.leading_moved: set[int] = set()  # statements whose comments moved to the hoisted line

    def take(self, call: cst.Call, edits: _SamplerEdits) -> None:
        self.samplers[id(call)] = edits.sampler
        if edits.hoist is not None:
            statement, dataset, name = edits.hoist
            assign = cst.SimpleStatementLine(
                body=[cst.Assign(targets=[cst.AssignTarget(target=cst.Name(name))], value=dataset)],
                leading_lines=statement.leading_lines,
            )
            self.insert_before(statement, [assign])
            self.leading_moved.add(id(statement))
            self.hoisted[id(call)] = (dataset, name)
        if edits.shuffle_keyword is not None:
            self.shuffle_keyword[id(call)] = edits.shuffle_keyword
        if edits.shuffle_positional is not None:
            self.shuffle_positional[id(call)] = edits.shuffle_positional
        self.removed.update(id(node) for node in edits.removed)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if id(original_node) in self.leading_moved:
            return updated_node.with_changes(leading_lines=[])
        return updated_node

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        return updated_node.with_changes(elements=_without(original_node.elements, updated_node.elements, self.removed))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        updated_node = updated_node.with_changes(args=_without(original_node.args, updated_node.args, self.removed))
        sampler = self.samplers.get(id(original_node))
        if sampler is None:
            return super().leave_Call(original_node, updated_node)
        args = list(updated_node.args)
        originals = list(original_node.args)
        hoisted = self.hoisted.get(id(original_node))
        if hoisted is not None:
            index = next(i for i, a in enumerate(originals) if a.value is hoisted[0])
            args[index] = args[index].with_changes(value=cst.Name(hoisted[1]))
        positional = self.shuffle_positional.get(id(original_node))
        if positional is not None:
            index = originals.index(positional)
            args[index] = args[index].with_changes(value=cst.Name("False"))
        existing = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "sampler"), None)
        shuffle = self.shuffle_keyword.get(id(original_node))
        if existing is not None:  # sampler=None
            args[existing] = args[existing].with_changes(value=sampler)
            if shuffle is not None:
                args = _without_index(args, originals.index(shuffle))
            node = updated_node.with_changes(args=args)
        elif shuffle is not None:
            index = originals.index(shuffle)
            args[index] = args[index].with_changes(keyword=cst.Name("sampler"), value=sampler)
            node = updated_node.with_changes(args=args)
        else:
            node = add_keyword(updated_node.with_changes(args=args), "sampler", sampler)
        return super().leave_Call(original_node, node)


def _without(originals: Sequence, updated: Sequence, removed: set[int]) -> list:
    out = list(updated)
    for index in reversed([i for i, node in enumerate(originals) if id(node) in removed]):
        out = _without_index(out, index)
    return out


def _without_index(items: list, index: int) -> list:
    """Drop one argument or dict entry, keeping the commas right: the last one's comma (trailing or
    none) passes to the one before it."""
    items = list(items)
    removed = items.pop(index)
    if index == len(items) and index > 0:
        previous = items[index - 1]
        changes = {"comma": removed.comma}
        if isinstance(previous, cst.Arg):
            changes["whitespace_after_arg"] = removed.whitespace_after_arg
        items[index - 1] = previous.with_changes(**changes)
    return items
