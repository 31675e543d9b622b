"""The DistributedSampler edit of one DataLoader call (TC503's fix; the DDP conversion plans it too,
so it converts only a script whose every training loader can be sharded): ``sampler=
DistributedSampler(dataset, shuffle=<the loader's shuffle>)`` in place of ``shuffle=``, the dataset
bound to a name first where it is built in the call, the shuffle entry taken off a ``**`` dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst

from tcaudit.findings import DeclineFix
from tcaudit.rewrite.codemod import parse_expression, parse_statement
from tcaudit.rewrite.edits import CallEditor, add_keyword
from tcaudit.script.distributed import distributed_facts, literal_value
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.loader_construction import KeyValue, LoaderSite
from tcaudit.script.loader_sharding import also_feeds_other_loops, plain_sampler
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import full_name


@dataclass
class SamplerEdits:
    """The edits of one DataLoader call (nodes of the analysed module)."""

    sampler: cst.BaseExpression  # ``DistributedSampler(dataset, shuffle=...)``, as written at the call
    import_sampler: bool = False
    hoist: tuple[cst.SimpleStatementLine, cst.BaseExpression, str] | None = None  # (statement, dataset, new name)
    shuffle_keyword: cst.Arg | None = None  # replaced by sampler= in place
    shuffle_positional: cst.Arg | None = None  # becomes False
    removed: list[cst.CSTNode] = field(default_factory=list)  # shuffle entries of a ``**`` dict
    # The loader's ``**kwargs`` argument that becomes ``**{**kwargs, "shuffle": False}`` where the dict's
    # shuffle is set conditionally or the dict is shared (the sampler reads ``kwargs.get("shuffle")``).
    star_override: cst.Arg | None = None
    # Guarded (a loader built by a helper that other scripts may also call without a process group): the
    # sampler bound on the line before the loader's statement, ``sampler = DistributedSampler(...) if
    # <process group> else None``, and the loader's shuffle kept for the other case (``shuffle=sampler is
    # None``), so the helper behaves as before outside DDP.
    guarded: tuple[cst.SimpleStatementLine, str, str] | None = None  # (statement, sampler name, its line)
    dist_import: str | None = None  # ``import torch.distributed as dist`` where the module lacks it
    shuffle_code: str = "False"  # the loader's shuffle as written




SAMPLER_QUALNAMES = ("torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler")
SAMPLER_IMPORT = "from torch.utils.data.distributed import DistributedSampler"


def plan_sampler(facts: ScriptFacts, call: CallSite, guarded: bool = False) -> SamplerEdits:
    """The edits that give this training loader a DistributedSampler, or DeclineFix with the reason.
    ``guarded``: for a loader a helper module builds (TC503 in that module), the sampler only while a
    process group is initialised, the loader's own shuffle otherwise."""
    if guarded:
        return _plan_guarded(facts, call)
    shared = also_feeds_other_loops(facts, distributed_facts(facts), call)
    if shared:
        raise DeclineFix(
            f"`{shared}` also builds loaders that no training loop iterates; a sampler there "
            "would split them across ranks too: add it where training builds its loader, by hand"
        )
    site = pipeline_facts(facts).loader_for(call.node)
    if site is None:
        raise DeclineFix("the DataLoader call could not be located")
    _check_loader(facts, call, site)
    hoist: list = []
    dataset = _dataset(facts, call, hoist)
    callee, imported = _sampler_callee(facts, call)
    edits = SamplerEdits(sampler=cst.Name("None"), import_sampler=not imported, hoist=hoist[0] if hoist else None)
    plain = plain_sampler(facts, call.arg("sampler"))
    if plain is not None:
        # ``sampler=RandomSampler(train_dataset)`` (the HF fine-tuning loop): the same order semantics per rank.
        shuffle = "True" if plain[1] else "False"
        dataset = facts.code(plain[0])
    else:
        shuffle = _plan_shuffle(facts, call, site, edits)
    edits.sampler = parse_expression(f"{callee}({dataset}, shuffle={shuffle})", facts.module)
    return edits




def _plan_guarded(facts: ScriptFacts, call: CallSite) -> SamplerEdits:
    site = pipeline_facts(facts).loader_for(call.node)
    if site is None:
        raise DeclineFix("the DataLoader call could not be located")
    _check_loader(facts, call, site)
    if plain_sampler(facts, call.arg("sampler")) is not None:
        raise DeclineFix("the DataLoader brings its own sampler; make it distributed there by hand")
    statement = _statement_before(facts, call, "the sampler")
    hoist: list = []
    dataset = _dataset(facts, call, hoist)
    callee, imported = _sampler_callee(facts, call)
    taken = _taken(facts, call)
    dist = next((i.local for i in facts.imports if i.qualname == "torch.distributed" and i.ctx is facts.module_frame),
                None)
    dist_import = None
    if dist is None:
        if "dist" in taken:
            raise DeclineFix("the name `dist` is taken in this module; shard the loader by hand")
        dist, dist_import = "dist", "import torch.distributed as dist"
    name = next((n for n in ("sampler", "train_sampler", "dist_sampler") if n not in taken), None)
    if name is None:
        raise DeclineFix("no free name for the sampler in this function; shard the loader by hand")
    written = site.keys.get("shuffle", [])
    shuffle = "False"
    edits = SamplerEdits(sampler=cst.Name(name), import_sampler=not imported, hoist=hoist[0] if hoist else None,
                         dist_import=dist_import)
    if written:
        kv = written[0]
        if len(written) > 1 or kv.conditional or kv.source not in ("keyword", "positional"):
            raise DeclineFix("shuffle= is not one keyword of the call; move it into the sampler by hand")
        shuffle = facts.code(kv.value)
        if kv.source == "keyword":
            edits.shuffle_keyword = kv.node
        else:
            edits.shuffle_positional = kv.node
    edits.shuffle_code = shuffle
    line = (f"{name} = {callee}({dataset}, shuffle={shuffle}) if {dist}.is_available() and {dist}.is_initialized() "
            "else None")
    edits.guarded = (statement, name, line)
    return edits


def guarded_shuffle(edits: SamplerEdits, module: cst.Module) -> cst.BaseExpression:
    """The loader's shuffle beside a guarded sampler: as written without a process group, off with one."""
    assert edits.guarded is not None
    name = edits.guarded[1]
    code = f"{name} is None" if edits.shuffle_code == "True" else f"({edits.shuffle_code}) and {name} is None"
    return parse_expression(code, module)


# -- checks ---------------------------------------------------------------------------------------------


def _check_loader(facts: ScriptFacts, call: CallSite, site: LoaderSite) -> None:
    if not site.complete:
        raise DeclineFix("the DataLoader takes *args or a **kwargs dict that cannot be followed")
    for value in site.values("batch_sampler"):
        if literal_value(value) is not None:
            raise DeclineFix("the DataLoader has a batch_sampler, which excludes sampler=")
    for kv in site.keys.get("sampler", []):
        if kv.source == "keyword" and kv.node in call.node.args and plain_sampler(facts, kv.value) is not None:
            continue  # RandomSampler(ds) / SequentialSampler(ds): replaced by its per-rank equivalent
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
    statement = _statement_before(facts, call, "the dataset")
    name = next((n for n in _HOIST_NAMES if n not in _taken(facts, call)), None)
    if name is None:
        raise DeclineFix(refusal)
    hoist.append((statement, dataset, name))
    return name


def _statement_before(facts: ScriptFacts, call: CallSite, what: str) -> cst.SimpleStatementLine:
    """The one-statement line holding the DataLoader call, where ``what`` can be bound on the line before
    it (not inside a lambda, a conditional expression or a comprehension, which may not run it)."""
    refusal = (f"{what} would be bound on the line before the DataLoader call, which sits where that line "
               "may not run first (a lambda, a conditional expression, a comprehension, a compound line)")
    statement = call.statement
    if statement is None or not isinstance(statement.node, cst.SimpleStatementLine) or len(statement.node.body) != 1:
        raise DeclineFix(refusal)
    if any(frame.kind == "lambda" for frame in call.ctx.chain()):
        raise DeclineFix(refusal)
    if any(isinstance(n, (cst.IfExp, cst.BooleanOperation, cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.Lambda))
           for n in _ancestors_within(statement.node, call.node)):
        raise DeclineFix(refusal)
    return statement.node


def _taken(facts: ScriptFacts, call: CallSite) -> set[str]:
    taken = {b.target for b in facts.bindings} | {site.local for site in facts.imports}
    taken |= {fn.name.value for fn, _ in facts.functions}
    fn = call.ctx.function
    if fn is not None:
        taken |= {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params, *fn.params.posonly_params)}
    return taken


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
    if not isinstance(dataset, (cst.Name, cst.Attribute)) or full_name(dataset) is None:
        if isinstance(dataset, cst.Call):
            callee = facts.qualname(dataset.func) or full_name(dataset.func) or ""
            if "IterableDataset" in callee or "IterDataPipe" in callee or "datapipes" in callee:
                raise DeclineFix("an IterableDataset cannot take a sampler; shard it per rank instead")
        return _hoist(facts, call, dataset, hoist)
    for value in facts.binding_values(dataset):
        if isinstance(value, cst.Call):
            callee = facts.qualname(value.func) or full_name(value.func) or ""
            if "IterableDataset" in callee or "IterDataPipe" in callee or "datapipes" in callee:
                raise DeclineFix("an IterableDataset cannot take a sampler; shard it per rank instead")
    return facts.code(dataset)


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


def _plan_shuffle(facts: ScriptFacts, call: CallSite, site: LoaderSite, edits: SamplerEdits) -> str:
    """Take ``shuffle`` off the loader (planning the edit) and return the code it had (``False`` if none)."""
    written = site.keys.get("shuffle", [])
    if not written:
        return "False"
    direct = [kv for kv in written if kv.source in ("keyword", "positional")]
    if len(written) == 1 and not written[0].conditional:
        kv = written[0]
        code = facts.code(kv.value)
        if kv.source == "keyword":
            edits.shuffle_keyword = kv.node
            return code
        if kv.source == "positional":
            edits.shuffle_positional = kv.node
            return code
        try:
            _plan_dict_removal(facts, call, kv, edits)
            return code
        except DeclineFix:
            pass  # a shared dict: read its shuffle instead
    if direct:
        raise DeclineFix("shuffle= is set in more than one place; move it into the sampler by hand")
    return _plan_star_override(facts, call, edits)


def _plan_star_override(facts: ScriptFacts, call: CallSite, edits: SamplerEdits) -> str:
    """``DataLoader(ds, **train_kwargs)`` whose dict gets ``shuffle`` on some paths (``if use_cuda:
    train_kwargs.update(cuda_kwargs)``) or is shared with another loader: the sampler shuffles as the
    dict says and the loader receives the dict with ``shuffle`` off, leaving the dict itself alone."""
    stars = [arg for arg in call.node.args if arg.star == "**"]
    if len(stars) != 1 or not isinstance(stars[0].value, (cst.Name, cst.Attribute)):
        raise DeclineFix("shuffle= comes from more than one `**` dict; move it into the sampler by hand")
    edits.star_override = stars[0]
    return f'{facts.code(stars[0].value)}.get("shuffle", False)'


def _plan_dict_removal(facts: ScriptFacts, call: CallSite, kv: KeyValue, edits: SamplerEdits) -> None:
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
            if full_name(n) == dotted:
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


class SamplerEditor(CallEditor):
    def __init__(self) -> None:
        super().__init__()
        self.samplers: dict[int, cst.BaseExpression] = {}
        self.shuffle_keyword: dict[int, cst.Arg] = {}
        self.shuffle_positional: dict[int, cst.Arg] = {}
        self.removed: set[int] = set()  # dict entries and dict(...) keywords
        self.star_override: dict[int, cst.Arg] = {}
        self.hoisted: dict[int, tuple[cst.BaseExpression, str]] = {}  # loader call → (dataset expression, new name)
        self.leading_moved: set[int] = set()  # statements whose comments moved to the hoisted line
        self.guarded: dict[int, cst.BaseExpression] = {}  # loader call → its shuffle beside a guarded sampler

    def take(self, call: cst.Call, edits: SamplerEdits, module: cst.Module | None = None) -> None:
        self.samplers[id(call)] = edits.sampler
        if edits.guarded is not None:
            assert module is not None
            self.guarded[id(call)] = guarded_shuffle(edits, module)
        if edits.hoist is not None:
            statement, dataset, name = edits.hoist
            assign = cst.SimpleStatementLine(
                body=[cst.Assign(targets=[cst.AssignTarget(target=cst.Name(name))], value=dataset)],
                leading_lines=statement.leading_lines,
            )
            self.insert_before(statement, [assign])
            self.leading_moved.add(id(statement))
            self.hoisted[id(call)] = (dataset, name)
        if edits.guarded is not None:
            statement, _, line = edits.guarded
            comment = cst.EmptyLine(comment=cst.Comment(
                "# DDP (tcaudit fix --ddp): each rank reads its own shard while a process group is up."))
            assign = parse_statement(line, module).with_changes(
                leading_lines=[] if edits.hoist is not None else [*statement.leading_lines, comment])
            if edits.hoist is None:
                self.leading_moved.add(id(statement))
            else:
                assign = assign.with_changes(leading_lines=[comment])
            self.insert_before(statement, [assign])
        if edits.shuffle_keyword is not None:
            self.shuffle_keyword[id(call)] = edits.shuffle_keyword
        if edits.shuffle_positional is not None:
            self.shuffle_positional[id(call)] = edits.shuffle_positional
        self.removed.update(id(node) for node in edits.removed)
        if edits.star_override is not None:
            self.star_override[id(call)] = edits.star_override

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
        star = self.star_override.get(id(original_node))
        if star is not None:
            index = originals.index(star)
            args[index] = args[index].with_changes(value=cst.Dict([
                cst.StarredDictElement(args[index].value),
                cst.DictElement(cst.SimpleString('"shuffle"'), cst.Name("False")),
            ]))
        guarded = self.guarded.get(id(original_node))
        positional = self.shuffle_positional.get(id(original_node))
        if positional is not None:
            index = originals.index(positional)
            args[index] = args[index].with_changes(value=guarded if guarded is not None else cst.Name("False"))
        if guarded is not None:
            keyword = self.shuffle_keyword.get(id(original_node))
            if keyword is not None:
                index = originals.index(keyword)
                args[index] = args[index].with_changes(value=guarded)
            node = add_keyword(updated_node.with_changes(args=args), "sampler", sampler)
            return super().leave_Call(original_node, node)
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
