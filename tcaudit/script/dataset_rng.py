"""Datasets that hold their own random generator, and the DataLoaders whose workers copy it.

A map-style dataset class of this file whose ``__init__`` stores a generator on ``self``
(``np.random.default_rng(seed)``, ``np.random.RandomState(seed)``, ``random.Random(seed)``,
``torch.Generator().manual_seed(seed)``) and whose ``__getitem__`` (or a method it calls) draws from
it: every DataLoader worker gets a pickled copy of the dataset, generator state included, so the
workers draw the same numbers (PyTorch docs, torch.utils.data, "Randomness in multi-process data
loading"). TC410 reports such a DataLoader with workers; TC401's fix (:mod:`tcaudit.rewrite.workers`)
declines to give one workers.

Not such a generator: numpy's or torch's global state (PyTorch seeds both per worker), a generator
made lazily or reassigned outside ``__init__``, reseeded in place (``self.rng.seed(i)``), a class that
calls ``get_worker_info()`` or ``torch.initial_seed()`` or controls its own pickling.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.expressions import literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import PipelineFacts
from tcaudit.source.syntax import full_name, nodes_of, param_names

# The constructors of a generator object, by qualified name → its kind.
GENERATOR_KINDS = {
    "numpy.random.default_rng": "numpy",
    "numpy.random.Generator": "numpy",
    "numpy.random.RandomState": "numpy-legacy",
    "random.Random": "random",
    "torch.Generator": "torch",
}
# Methods that reseed a generator in place.
_RESEED_METHODS = frozenset({"seed", "manual_seed", "set_state", "setstate"})
# Calls that show the dataset seeds itself per worker.
_PER_WORKER_SEEDS = ("get_worker_info", "initial_seed")
# Methods through which a class controls what its pickled copies hold.
_PICKLING = frozenset({"__setstate__", "__getstate__", "__reduce__", "__reduce_ex__"})
# torch.utils.data functions and classes whose result wraps the datasets passed to them.
_WRAPPERS = frozenset(
    f"torch.utils.data.{module}{name}"
    for module in ("", "dataset.")
    for name in ("Subset", "random_split", "ConcatDataset", "ChainDataset")
)


@dataclass(frozen=True, eq=False)
class OwnGenerator:
    """``self.<attribute> = <constructor>(...)`` in a dataset's ``__init__``, drawn from in ``__getitem__``."""

    owner: cst.ClassDef  # the class whose __init__ creates it
    attribute: str
    kind: str | None  # a GENERATOR_KINDS value; None when __init__ writes it in more than one way
    constructor: cst.Call  # the constructor call (for torch: ``torch.Generator()``, without manual_seed)


@dataclass(frozen=True, eq=False)
class SharedGenerators:
    """A DataLoader's dataset, an instance of a class of this file that holds its own generators."""

    dataset: cst.ClassDef
    generators: tuple[OwnGenerator, ...]
    wrapped: bool  # the DataLoader gets a Subset / random_split / ConcatDataset of it
    alternatives: bool  # the dataset expression may also hold another dataset

    @property
    def attributes(self) -> str:
        return ", ".join(f"`{self.dataset.name.value}.{g.attribute}`" for g in self.generators)


def reseeds_workers(site: LoaderSite) -> bool:
    """Whether the DataLoader passes a ``worker_init_fn`` (anything but a written ``None``): the user
    seeds the workers."""
    return any(literal(value) is not None for value in site.values("worker_init_fn"))


def workers_repeat_generators(pipeline: PipelineFacts, site: LoaderSite) -> SharedGenerators | None:
    """The dataset's own generators, which each worker of ``site`` would copy unchanged; None when the
    dataset holds none (that this file shows) or the DataLoader passes a ``worker_init_fn``."""
    if reseeds_workers(site):
        return None
    return loader_generators(pipeline, site)


def loader_generators(pipeline: PipelineFacts, site: LoaderSite) -> SharedGenerators | None:
    datasets = site.values("dataset")
    if len(datasets) != 1:
        return None
    found: list[tuple[cst.ClassDef, tuple[OwnGenerator, ...], bool]] = []
    others = 0
    for value, wrapped in _instances(pipeline, datasets[0], site.call.ctx.function, False, 0):
        cls = _own_class(pipeline.facts, value)
        generators = own_generators(pipeline.facts, cls) if cls is not None else ()
        if generators:
            found.append((cls, generators, wrapped))  # type: ignore[arg-type]
        else:
            others += 1
    if not found:
        return None
    cls, generators, wrapped = found[0]
    alternatives = others > 0 or any(other is not cls for other, _, _ in found[1:])
    return SharedGenerators(cls, generators, wrapped or any(w for _, _, w in found), alternatives)


def own_generators(facts: ScriptFacts, cls: cst.ClassDef) -> tuple[OwnGenerator, ...]:
    """The generators ``cls`` (with its bases of this file) creates in ``__init__`` and draws from in
    ``__getitem__`` without reseeding them; cached per class."""
    table: dict[int, tuple[OwnGenerator, ...]] = facts.derived(own_generators, lambda _: {})
    if id(cls) not in table:
        table[id(cls)] = _own_generators(facts, cls)
    return table[id(cls)]




def _own_generators(facts: ScriptFacts, cls: cst.ClassDef) -> tuple[OwnGenerator, ...]:
    lineage = _lineage(facts, cls)
    methods: dict[str, cst.FunctionDef] = {}
    every: list[tuple[cst.ClassDef, cst.FunctionDef]] = []
    for owner in lineage:
        for fn in _methods(owner):
            methods.setdefault(fn.name.value, fn)
            every.append((owner, fn))
    getitem = methods.get("__getitem__")
    if getitem is None or _PICKLING & set(methods):
        return ()
    classes = {id(owner) for owner in lineage}
    for call in facts.calls:
        owner = call.ctx.class_def
        if owner is not None and id(owner) in classes and (call.qualname or call.name or "").endswith(_PER_WORKER_SEEDS):
            return ()  # seeded per worker (or from the worker's torch seed) by the dataset itself
    created: dict[str, list[tuple[str | None, cst.Call | None, cst.ClassDef]]] = {}
    reseeded: set[str] = set()
    for owner, fn in every:
        me = _self_name(fn)
        if me is None:
            continue
        in_init = fn.name.value == "__init__"
        for target, value in _attribute_writes(fn, me):
            if in_init:
                created.setdefault(target, []).append((*_classify(facts, value), owner))
            else:
                reseeded.add(target)
        if not in_init:
            reseeded |= _reseeded_in_place(fn, me)
    used = _used_from(getitem, methods)
    out = []
    for attribute, writes in created.items():
        generators = [(kind, call, owner) for kind, call, owner in writes if call is not None]
        if not generators or attribute in reseeded or attribute not in used:
            continue
        kinds = {kind for kind, _, _ in writes}
        kind = generators[0][0] if len(kinds) == 1 else None
        out.append(OwnGenerator(generators[0][2], attribute, kind, generators[0][1]))  # type: ignore[arg-type]
    return tuple(out)


def _lineage(facts: ScriptFacts, cls: cst.ClassDef, depth: int = 0) -> list[cst.ClassDef]:
    """``cls`` and its base classes of this file, nearest first."""
    out = [cls]
    if depth > 3:
        return out
    for base in cls.bases:
        name = full_name(base.value)
        parent = facts.classes_by_name.get(name) if name and not facts.resolve(name) else None
        if parent is not None and parent is not cls:
            out += [c for c in _lineage(facts, parent, depth + 1) if c not in out]
    return out


def _methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    if not isinstance(cls.body, cst.IndentedBlock):
        return []
    return [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]


def _self_name(fn: cst.FunctionDef) -> str | None:
    params = param_names(fn, stars=False)
    return params[0] if params else None


def _self_attribute(expr: cst.BaseExpression, me: str) -> str | None:
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == me:
        return expr.attr.value
    return None


def _attribute_writes(fn: cst.FunctionDef, me: str) -> list[tuple[str, cst.BaseExpression | None]]:
    """``self.x = value`` (value None for an augmented or tuple assignment, and ``setattr``)."""
    out: list[tuple[str, cst.BaseExpression | None]] = []

    def targets(target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                targets(element.value, None)
            return
        name = _self_attribute(target, me)
        if name is not None:
            out.append((name, value))

    for node in nodes_of(fn, cst.BaseSmallStatement):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                targets(target.target, node.value)
        elif isinstance(node, cst.AnnAssign):
            targets(node.target, node.value)
        elif isinstance(node, cst.AugAssign):
            targets(node.target, None)
    for call in nodes_of(fn, cst.Call):
        if full_name(call.func) == "setattr" and call.args and full_name(call.args[0].value) == me:
            key = literal(call.args[1].value) if len(call.args) > 1 else ...
            if isinstance(key, str):
                out.append((key, None))
    return out


def _reseeded_in_place(fn: cst.FunctionDef, me: str) -> set[str]:
    """The attributes ``fn`` reseeds: ``self.rng.seed(i)``, ``self.g.manual_seed(s)``."""
    out: set[str] = set()
    for call in nodes_of(fn, cst.Call):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _RESEED_METHODS:
            name = _self_attribute(func.value, me)
            if name is not None:
                out.add(name)
    return out


def _classify(facts: ScriptFacts, value: cst.BaseExpression | None) -> tuple[str | None, cst.Call | None]:
    """(kind, constructor call) of a value written to an attribute: the generator it constructs, on
    every branch of ``a if c else b`` / ``a or b``; (None, call) where only some branches construct one;
    (None, None) where none does."""
    leaves = _leaves(value) if value is not None else []
    made = [(kind, call) for kind, call in (_constructed(facts, leaf) for leaf in leaves) if call is not None]
    if not made:
        return None, None
    kinds = {kind for kind, _ in made}
    if len(made) == len(leaves) and len(kinds) == 1:
        return made[0]
    return None, made[0][1]


def _leaves(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.IfExp):
        return _leaves(expr.body) + _leaves(expr.orelse)
    if isinstance(expr, cst.BooleanOperation):
        return _leaves(expr.left) + _leaves(expr.right)
    return [expr]


def _constructed(facts: ScriptFacts, expr: cst.BaseExpression) -> tuple[str | None, cst.Call | None]:
    if not isinstance(expr, cst.Call):
        return None, None
    kind = GENERATOR_KINDS.get(facts.qualname(expr.func) or "")
    if kind is not None:
        return kind, expr
    func = expr.func
    if isinstance(func, cst.Attribute) and func.attr.value == "manual_seed" and isinstance(func.value, cst.Call):
        kind, call = _constructed(facts, func.value)  # torch.Generator().manual_seed(seed)
        if kind == "torch":
            return kind, call
    return None, None


def _used_from(getitem: cst.FunctionDef, methods: dict[str, cst.FunctionDef]) -> set[str]:
    """The ``self`` attributes ``__getitem__`` and the methods it calls on ``self`` (4 calls deep) read."""
    used: set[str] = set()
    seen: set[int] = set()
    frontier = [getitem]
    for _ in range(5):
        nxt = []
        for fn in frontier:
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            me = _self_name(fn)
            if me is None:
                continue
            for node in nodes_of(fn, cst.Attribute):
                name = _self_attribute(node, me)
                if name is None:
                    continue
                used.add(name)
                if name in methods:
                    nxt.append(methods[name])
        frontier = nxt
    return used


def _own_class(facts: ScriptFacts, value: cst.BaseExpression) -> cst.ClassDef | None:
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and not facts.resolve(value.func.value):
        return facts.classes_by_name.get(value.func.value)
    return None


def _instances(
    pipeline: PipelineFacts, expr: cst.BaseExpression, fn: cst.FunctionDef | None, wrapped: bool, depth: int
) -> list[tuple[cst.BaseExpression, bool]]:
    """The values a DataLoader's dataset expression may hold (constructor calls and other leaves), each
    with whether a torch.utils.data wrapper (Subset, random_split, ConcatDataset) stands between."""
    if depth > 3:
        return []
    facts = pipeline.facts
    out: list[tuple[cst.BaseExpression, bool]] = []
    values = facts.binding_values(expr)
    if isinstance(expr, cst.Name) and len(values) == 1:
        values = values + _unpacked_from(facts, expr.value)
    for value in values:
        if isinstance(value, (cst.Name, cst.Attribute)):
            dotted = full_name(value)
            if dotted and facts.bindings_of(dotted):
                continue  # followed by binding_values
            if dotted and fn is not None and dotted in param_names(fn):
                out += _from_callers(pipeline, dotted, fn, wrapped, depth)
                continue
            if not (dotted and _unpacked_from(facts, dotted)):
                out.append((value, wrapped))
            continue
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue  # binding_values follows both branches
        if isinstance(value, (cst.List, cst.Tuple)):
            for element in value.elements:
                out += _instances(pipeline, element.value, fn, wrapped, depth + 1)
            continue
        if isinstance(value, cst.Call) and facts.qualname(value.func) in _WRAPPERS:
            for arg in value.args:
                if arg.keyword is None and not arg.star:
                    out += _instances(pipeline, arg.value, fn, True, depth + 1)
                    break  # the first argument holds the dataset(s); the rest are indices or lengths
            continue
        out.append((value, wrapped))
    return out


def _from_callers(
    pipeline: PipelineFacts, name: str, fn: cst.FunctionDef, wrapped: bool, depth: int
) -> list[tuple[cst.BaseExpression, bool]]:
    params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
    index = params.index(name) if name in params else None
    out: list[tuple[cst.BaseExpression, bool]] = []
    for caller in callers_of(pipeline.facts, fn, how="self", outside=True):
        offset = 1 if params and params[0] in ("self", "cls") and (caller.name or "").startswith(("self.", "cls.")) else 0
        arg = caller.arg(name, None if index is None else index - offset)
        if arg is not None:
            out += _instances(pipeline, arg, caller.ctx.function, wrapped, depth + 1)
    return out


def _unpacked_from(facts: ScriptFacts, name: str) -> list[cst.BaseExpression]:
    """The calls ``name`` is unpacked from (``train_set, val_set = random_split(ds, ...)``)."""
    return [
        node.value
        for node in _tuple_assignments(facts)
        if any(
            isinstance(t.target, (cst.Tuple, cst.List))
            and any(isinstance(e.value, cst.Name) and e.value.value == name for e in t.target.elements)
            for t in node.targets
        )
    ]


def _tuple_assignments(facts: ScriptFacts) -> list[cst.Assign]:
    return facts.derived(_tuple_assignments, lambda made: [
        node for node in nodes_of(made.module, cst.Assign)
        if isinstance(node.value, cst.Call) and any(isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets)
    ])
