"""Facts about DataLoader construction: which calls build a ``torch.utils.data.DataLoader``, with
which keywords, and which of them feed training.

Only ``torch.utils.data.DataLoader`` (however imported or aliased) is a DataLoader: a custom loader
class is not judged by its name. Keyword arguments are read from the call, from positional slots,
and from ``**kwargs`` dicts followed through their literal, ``dict(...)``, ``update(...)``,
``setdefault`` and ``kw["key"] = value`` writes; a dict that cannot be followed makes the keyword set
*incomplete* and the rules stay silent about missing keys.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.expressions import assigned_name, function_returns, literal, moves_to_device
from tcaudit.script.facts import CallSite, Frame
from tcaudit.script.trained_models import TrainedModelFacts
from tcaudit.script.training_code import flag_frames
from tcaudit.source.syntax import full_name, keyword, nodes_of, param_names

DATALOADER_QUALNAMES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# DataLoader's positional parameters, in order (PyTorch 2.x); the rest are keyword-only.
DATALOADER_POSITIONAL = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)
_EVAL_WORDS = frozenset(
    {"val", "valid", "validation", "test", "testing", "eval", "evaluation", "evaluate", "inference", "infer",
     "predict", "prediction", "dev", "holdout"}
)
_NAME_SUFFIXES = ("dataloader", "loader", "dataset", "data", "set", "ds", "dl", "iter")
_BUILTINS = frozenset(
    {"range", "len", "min", "max", "int", "float", "bool", "list", "tuple", "dict", "zip", "enumerate", "iter",
     "next", "super", "isinstance", "sorted", "reversed", "sum", "abs", "round"}
)
# ``tcaudit fix --dali`` wraps the training DataLoader in this function of the script (its batches are
# the DataLoader's, decoded on the GPU): loops over it are loops over that DataLoader.
DALI_LOADER = "tcaudit_dali_loader"
# torch.utils.data functions and classes whose result is a view of the dataset passed first.
_DATASET_VIEWS = frozenset(
    f"torch.utils.data.{module}{name}" for module in ("", "dataset.") for name in ("random_split", "Subset")
)


def name_tokens(name: str | None) -> list[str]:
    if not name:
        return []
    last = name.split(".")[-1]
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", last)
    return [t for t in spaced.lower().split("_") if t]


def is_eval_name(name: str | None) -> bool:
    """``val_loader``, ``testloader``, ``evalDataset``, ``val_dataloader`` — names of evaluation data."""
    for token in name_tokens(name):
        if token in _EVAL_WORDS:
            return True
        for suffix in _NAME_SUFFIXES:
            if token.endswith(suffix) and token[: -len(suffix)] in _EVAL_WORDS:
                return True
    return False


@dataclass
class KeyValue:
    """One place a DataLoader keyword gets its value: the call itself, a positional slot, or a dict."""

    value: cst.BaseExpression
    node: cst.CSTNode  # where it is written
    source: str  # "keyword", "positional" or the name of the kwargs dict
    conditional: bool  # written on some paths only (a branch the DataLoader call is not in)


@dataclass
class LoaderSite:
    """A ``torch.utils.data.DataLoader(...)`` call and the keywords it receives."""

    call: CallSite
    keys: dict[str, list[KeyValue]]
    complete: bool  # False when ``*args`` or an untraceable ``**kwargs`` may add keywords
    kwargs_dicts: list[str]
    target: str | None  # the name it is assigned to, if any
    training: bool

    def values(self, key: str) -> list[cst.BaseExpression]:
        return [kv.value for kv in self.keys.get(key, [])]

    def has(self, key: str) -> bool:
        return key in self.keys

    def in_dict(self, key: str) -> KeyValue | None:
        return next((kv for kv in self.keys.get(key, []) if kv.source not in ("keyword", "positional")), None)


class LoaderConstructionFacts(TrainedModelFacts):
    """The DataLoaders, on top of the training code (which loaders train) and the models (a class of
    this file is a factory, not a loader)."""

    # -- DataLoaders -------------------------------------------------------------------------------
    @functools.cached_property
    def loaders(self) -> list[LoaderSite]:
        facts = self.facts
        out = []
        for call in facts.calls:
            if call.qualname not in DATALOADER_QUALNAMES:
                continue
            keys, complete, dicts = self._loader_keys(call)
            target = assigned_name(call)
            out.append(LoaderSite(call, keys, complete, dicts, target, self._is_training_loader(call, target)))
        return out

    def dali_wrapped(self, site: LoaderSite) -> bool:
        """``tcaudit_dali_loader(DataLoader(...))``, or ``loader = tcaudit_dali_loader(loader)``: ``fix --dali``
        converted this loader."""
        for call in self.facts.calls:
            if call.name != DALI_LOADER or not call.node.args:
                continue
            first = call.node.args[0].value
            if first is site.call.node or (site.target is not None and full_name(first) == site.target):
                return True
        return False

    def loaders_over(self, dataset: cst.Call) -> list[LoaderSite]:
        """The DataLoaders whose dataset is this call's result (passed directly or through names)."""
        out = []
        for site in self.loaders:
            argument = site.call.arg("dataset", 0)
            if argument is not None and any(value is dataset for value in self.facts.binding_values(argument)):
                out.append(site)
        return out

    @functools.cached_property
    def training_loaders(self) -> list[LoaderSite]:
        if not self.trains:
            return []
        return [site for site in self.loaders if site.training]

    def loader_for(self, node: cst.Call) -> LoaderSite | None:
        return next((site for site in self.loaders if site.call.node is node), None)

    def _is_training_loader(self, call: CallSite, target: str | None) -> bool:
        facts = self.facts
        if facts.in_eval(call.ctx) or is_eval_name(target):
            return False
        for frame in call.ctx.chain():
            if frame.kind == "def" and is_eval_name(frame.node.name.value):  # type: ignore[attr-defined]
                return False
        dataset = call.arg("dataset", 0)
        if dataset is not None and is_eval_name(full_name(dataset)):
            return False
        return not self._dict_key_is_eval(call)

    def _dict_key_is_eval(self, call: CallSite) -> bool:
        """``{"train": DataLoader(...), "val": DataLoader(...)}``: the value under an eval key."""
        statement = call.statement.node if call.statement else None
        if statement is None:
            return False
        verdict = False
        for node in nodes_of(statement, cst.DictElement):  # the last element holding the call decides
            if node.value is call.node:
                key = literal(node.key)
                verdict = isinstance(key, str) and is_eval_name(key)
        return verdict

    def _loader_keys(self, call: CallSite) -> tuple[dict[str, list[KeyValue]], bool, list[str]]:
        keys: dict[str, list[KeyValue]] = {}
        complete = True
        dicts: list[str] = []
        positional = 0
        for arg in call.node.args:
            if arg.star == "*":
                complete = False
            elif arg.star == "**":
                name = full_name(arg.value)
                if name:
                    dicts.append(name)
                if not self._collect_dict(arg.value, call.ctx, keys, name or "**", 0):
                    complete = False
            elif arg.keyword is not None:
                keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, "keyword", False))
            else:
                if positional < len(DATALOADER_POSITIONAL):
                    key = DATALOADER_POSITIONAL[positional]
                    keys.setdefault(key, []).append(KeyValue(arg.value, arg, "positional", False))
                positional += 1
        return keys, complete, dicts

    def _collect_dict(
        self, expr: cst.BaseExpression, ctx: Frame, keys: dict[str, list[KeyValue]], label: str, depth: int
    ) -> bool:
        """Add the keys a ``**expr`` may hold; False when some of them cannot be known."""
        if depth > 5:
            return False
        facts = self.facts
        if isinstance(expr, cst.Dict):
            ok = True
            for element in expr.elements:
                if isinstance(element, cst.StarredDictElement):
                    ok &= self._collect_dict(element.value, ctx, keys, label, depth + 1)
                    continue
                key = literal(element.key)
                if not isinstance(key, str):
                    ok = False
                    continue
                keys.setdefault(key, []).append(KeyValue(element.value, element, label, False))
            return ok
        if isinstance(expr, cst.Call):
            dotted = full_name(expr.func)
            if dotted == "dict":
                ok = True
                for arg in expr.args:
                    if arg.keyword is not None:
                        keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, label, False))
                    else:
                        ok &= self._collect_dict(arg.value, ctx, keys, label, depth + 1)
                return ok
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "copy" and not expr.args:
                return self._collect_dict(expr.func.value, ctx, keys, label, depth + 1)
            return False
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.BitOr):
            left = self._collect_dict(expr.left, ctx, keys, label, depth + 1)
            right = self._collect_dict(expr.right, ctx, keys, label, depth + 1)
            return left and right
        if isinstance(expr, cst.IfExp):
            before = {k: len(v) for k, v in keys.items()}
            ok = self._collect_dict(expr.body, ctx, keys, label, depth + 1)
            ok &= self._collect_dict(expr.orelse, ctx, keys, label, depth + 1)
            for key, values in keys.items():
                for kv in values[before.get(key, 0):]:
                    kv.conditional = True
            return ok
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        name = full_name(expr)
        if not name:
            return False
        fn = ctx.function
        if fn is not None and name in param_names(fn):
            return False  # filled by the caller
        bindings = [b for b in facts.bindings_of(name) if b.ctx.function is fn]
        if not bindings and fn is not None:
            bindings = [b for b in facts.bindings_of(name) if b.ctx.function is None]
        if not bindings:
            return False
        ok = True
        creations = 0
        for binding in bindings:
            key_write = _subscript_key(binding)
            if key_write is not None:
                keys.setdefault(key_write, []).append(
                    KeyValue(binding.value, binding.statement.node if binding.statement else binding.value, name,
                             self._conditional(ctx, binding.ctx))
                )
                continue
            if key_write is None and binding.is_item_write:
                ok = False  # kw[some_variable] = value
                continue
            creations += 1
            before = {k: len(v) for k, v in keys.items()}
            ok &= self._collect_dict(binding.value, binding.ctx, keys, label if label != "**" else name, depth + 1)
            if self._conditional(ctx, binding.ctx):
                for key, values in keys.items():
                    for kv in values[before.get(key, 0):]:
                        kv.conditional = True
        if creations > 1:
            # Several creations (``if a: kw = {...} else: kw = {...}``): a key is certain only if each has it.
            for values in keys.values():
                for kv in values:
                    if kv.source == name:
                        kv.conditional = True
        for call in facts.calls:
            if call.receiver_name != name or (call.ctx.function is not fn and call.ctx.function is not None):
                continue
            if call.method == "update":
                conditional = self._conditional(ctx, call.ctx)
                for arg in call.node.args:
                    before = {k: len(v) for k, v in keys.items()}
                    if arg.keyword is not None:
                        keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, name, conditional))
                    else:
                        ok &= self._collect_dict(arg.value, call.ctx, keys, name, depth + 1)
                    if conditional:
                        for key, values in keys.items():
                            for kv in values[before.get(key, 0):]:
                                kv.conditional = True
            elif call.method == "setdefault" and call.node.args:
                key = literal(call.node.args[0].value)
                if isinstance(key, str) and len(call.node.args) > 1:
                    keys.setdefault(key, []).append(
                        KeyValue(call.node.args[1].value, call.node, name, self._conditional(ctx, call.ctx))
                    )
                else:
                    ok = False
        for call in facts.calls:
            # Passed to a helper that may fill it in (``add_cuda_options(kwargs)``).
            if call.ctx.function is fn and any(
                arg.keyword is None and not arg.star and full_name(arg.value) == name for arg in call.node.args
            ) and call.method != "update" and call.name not in ("print", "len", "dict", "logging.info", "logger.info", "log"):
                ok = False
        return ok

    def _conditional(self, use: Frame, write: Frame) -> bool:
        """A write is conditional when it sits under a flag frame the use is not under."""
        use_frames = {id(f.node) for f in use.chain()}
        return any(id(f.node) not in use_frames for f in flag_frames(write))

    @functools.cached_property
    def iterable_dataset_classes(self) -> dict[str, bool]:
        """Classes deriving from IterableDataset → whether they shard by ``get_worker_info``."""
        facts = self.facts
        out: dict[str, bool] = {}
        for node, _ in facts.classes:
            for base in node.bases:
                qual = facts.qualname(base.value) or full_name(base.value) or ""
                if qual.endswith("IterableDataset"):
                    shards = any(
                        (c.name or "").endswith("get_worker_info") for c in facts.calls if c.ctx.class_def is node
                    )
                    out[node.name.value] = shards
        return out

    @functools.cached_property
    def indexing_dataset_classes(self) -> set[str]:
        """Classes of this file whose ``__getitem__`` only indexes what ``__init__`` stored (``return
        self.data[i]``, ``return self.x[i], self.y[i]``, a dict of such): nothing to load or augment, so
        worker processes would only add pickling, as for a TensorDataset."""
        out: set[str] = set()
        for node, _ in self.facts.classes:
            for statement in node.body.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value == "__getitem__":
                    if _only_indexes_self(statement):
                        out.add(node.name.value)
        return out

    def dataset_kind(self, site: LoaderSite) -> str:
        """``"device"`` (tensors already on the GPU), ``"memory"`` (a TensorDataset of host tensors, or a
        dataset class whose items are only indexed), ``"iterable-unsharded"`` (an IterableDataset that
        does not split work across workers) or ``"other"``. A dataset handed to the loader's helper as a
        parameter (``def build_loader(ds): return DataLoader(ds, ...)``, a lambda) is judged at every call
        of the helper: "memory" or "device" only when each call agrees."""
        dataset = site.call.arg("dataset", 0)
        if dataset is None:
            return "other"
        kind = self._kind_of(dataset)
        if kind != "other" or not isinstance(dataset, cst.Name) or self.facts.bindings_of(dataset.value):
            return kind
        arguments = self._parameter_arguments(site, dataset.value)
        kinds = {self._kind_of(argument) for argument in arguments}
        return kinds.pop() if len(kinds) == 1 and arguments else "other"

    def _parameter_arguments(self, site: LoaderSite, name: str) -> list[cst.BaseExpression]:
        """What every call of the loader's helper passes for its parameter ``name``; [] when one cannot
        be told."""
        facts = self.facts
        lambdas = [f.node for f in site.call.ctx.chain() if f.kind == "lambda"]
        if lambdas:
            params = [p.name.value for p in lambdas[0].params.params]  # type: ignore[attr-defined]
            calls = callers_of(facts, lambdas[0])
        else:
            function = site.call.ctx.function
            if function is None:
                return []
            params = [p.name.value for p in function.params.params]
            calls = callers_of(facts, function, outside=True)
        if name not in params or not calls:
            return []
        out = []
        for call in calls:
            position = params.index(name)
            if params[:1] in (["self"], ["cls"]) and call.method is not None:
                position -= 1  # ``self.build_loader(ds)``
            argument = call.arg(name, position)
            if argument is None:
                return []
            out.append(argument)
        return out

    def _kind_of(self, dataset: cst.BaseExpression) -> str:
        facts = self.facts
        for value in self._dataset_values(dataset):
            if not isinstance(value, cst.Call):
                continue
            qual = facts.qualname(value.func) or ""
            dotted = full_name(value.func) or ""
            if qual.endswith("TensorDataset"):
                if any(self._on_device(arg.value) for arg in value.args):
                    return "device"
                return "memory"
            short = dotted.split(".")[-1]
            if self.iterable_dataset_classes.get(short) is False:
                return "iterable-unsharded"
            if short in self.indexing_dataset_classes:
                return "memory"
        return "other"

    def _dataset_values(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        """What a dataset expression may hold, looking through the views of another dataset that
        ``random_split`` and ``Subset`` make (their items are that dataset's items), including the
        names a ``train, val = random_split(ds, ...)`` unpacks."""
        if depth > 3:
            return []
        facts = self.facts
        out: list[cst.BaseExpression] = []
        values = facts.binding_values(expr)
        if isinstance(expr, cst.Name) and len(values) == 1:
            values = values + self._unpacked_from(expr.value)
        if isinstance(expr, cst.Name):
            for returned in self._returned_at_position(expr.value):
                out += self._dataset_values(returned, depth + 1)
        for value in values:
            out.append(value)
            if isinstance(value, cst.Call) and facts.qualname(value.func) in _DATASET_VIEWS:
                source = value.args[0].value if value.args and value.args[0].keyword is None else None
                if source is not None:
                    out += self._dataset_values(source, depth + 1)
        return out

    def _unpackings(self, name: str) -> list[tuple[cst.Call, int, int]]:
        """(the call, ``name``'s position, the number of targets) of every ``a, name, b = call(...)`` in
        the file."""
        out = []
        for node in self._tuple_assignments:
            for target in node.targets:
                if not isinstance(target.target, (cst.Tuple, cst.List)):
                    continue
                names = [e.value.value if isinstance(e.value, cst.Name) else None for e in target.target.elements]
                if name in names:
                    out.append((node.value, names.index(name), len(names)))
        return out

    def _returned_at_position(self, name: str) -> list[cst.BaseExpression]:
        """What a function of this file returns in the place ``name`` takes when it is unpacked from
        its call (``dataset, model, optimizer = load_train_objs()`` whose ``return train_set, model,
        optimizer``): the ``train_set`` expression."""
        out: list[cst.BaseExpression] = []
        for call, position, width in self._unpackings(name):
            func = full_name(call.func)
            for fn in self.facts.functions_by_name.get(func or "", []):
                for returned in function_returns(fn):
                    if isinstance(returned, cst.Tuple) and len(returned.elements) == width:
                        out.append(returned.elements[position].value)
        return out

    def _unpacked_from(self, name: str) -> list[cst.BaseExpression]:
        """The calls ``name`` is unpacked from (``name, other = call(...)``), anywhere in the file."""
        calls: dict[int, cst.BaseExpression] = {}
        for call, _, _ in self._unpackings(name):
            calls.setdefault(id(call), call)  # one per assignment, however many of its targets name it
        return list(calls.values())

    @functools.cached_property
    def _tuple_assignments(self) -> list[cst.Assign]:
        return [
            node for node in nodes_of(self.facts.module, cst.Assign)
            if isinstance(node.value, cst.Call) and any(isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets)
        ]

    def _on_device(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        if depth > 4:
            return False
        facts = self.facts
        for value in facts.binding_values(expr):
            if isinstance(value, cst.Call):
                if isinstance(value.func, cst.Attribute) and value.func.attr.value in ("cuda", "to"):
                    site = CallSite(value, None, None, self.facts.module_frame, None)
                    if moves_to_device(site):
                        return True
                if keyword(value, "device") is not None and literal(keyword(value, "device").value) != "cpu":
                    return True
        return False

    def loader_sites_for(
        self, expr: cst.BaseExpression, fn: cst.FunctionDef | None, depth: int = 0,
        own_iterables: list[cst.Call] | None = None,
    ) -> list[LoaderSite] | None:
        """The DataLoader calls ``expr`` may hold, or None when any of its values is something else
        (a custom loader, a framework-prepared loader, a parameter whose callers are not all known).
        With ``own_iterables``, an instance of an iterable class of this file is collected there instead."""
        if depth > 3:
            return None
        facts = self.facts
        name = full_name(expr)
        if name and fn is not None and name in param_names(fn):
            return self._param_loaders(name, fn, depth)
        sites: list[LoaderSite] = []
        leaves = 0
        values = facts.binding_values(expr)
        for value in values:
            if isinstance(value, cst.Call) and full_name(value.func) == DALI_LOADER and value.args:
                # ``loader = tcaudit_dali_loader(loader)`` (``fix --dali``) yields the wrapped DataLoader's batches.
                value = value.args[0].value
                if isinstance(value, (cst.Name, cst.Attribute)) and any(
                    v is not value and isinstance(v, type(value)) and full_name(v) == full_name(value)
                    for v in values
                ):
                    continue  # the same name: its other values are followed already
            if isinstance(value, (cst.Name, cst.Attribute)):
                dotted = full_name(value)
                if dotted and facts.bindings_of(dotted):
                    continue  # followed by binding_values
                if dotted and fn is not None and dotted in param_names(fn):
                    more = self._param_loaders(dotted, fn, depth)
                    if more is None:
                        return None
                    sites += more
                    leaves += 1
                    continue
                return None
            if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                continue
            leaves += 1
            site = self.loader_for(value) if isinstance(value, cst.Call) else None
            if site is not None:
                sites.append(site)
                continue
            built = self._factory_loaders(value, depth)
            if built is None:
                if own_iterables is not None and self._own_iterable_class(value) is not None:
                    own_iterables.append(value)  # type: ignore[arg-type]
                    continue
                return None
            sites += built
        return sites if leaves else None

    def _own_iterable_class(self, value: cst.BaseExpression) -> cst.ClassDef | None:
        """The class of this file (with ``__iter__`` or ``__getitem__``) that ``value`` constructs."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        for node, _ in self.facts.classes:
            if node.name.value == value.func.value and isinstance(node.body, cst.IndentedBlock):
                methods = {s.name.value for s in node.body.body if isinstance(s, cst.FunctionDef)}
                if methods & {"__iter__", "__getitem__"}:
                    return node
        return None

    def yields_plain_tensors(self, value: cst.Call) -> bool:
        """Whether an own iterable visibly builds nothing but torch tensors (every call in its class is
        ``torch.*``, a builtin, or a method of its own), and no class of this file defines a tensor-like
        ``.to``/``.cuda`` of its own."""
        cls = self._own_iterable_class(value)
        if cls is None:
            return False
        for node, _ in self.facts.classes:
            if isinstance(node.body, cst.IndentedBlock) and any(
                isinstance(s, cst.FunctionDef) and s.name.value in ("to", "cuda", "pin_memory") for s in node.body.body
            ):
                return False
        for call in self.facts.calls:
            if call.ctx.class_def is not cls or call.name is None:
                continue
            if call.qualname is not None:
                if not call.qualname.startswith("torch."):
                    return False
            elif call.name not in _BUILTINS and not call.name.startswith("self."):
                return False
        return True

    def _factory_loaders(self, value: cst.BaseExpression, depth: int) -> list[LoaderSite] | None:
        """``build_loader(ds, 64)`` → the DataLoaders that helper of this file returns."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        name = value.func.value
        functions = self.facts.functions_by_name.get(name, [])
        if not functions or name in self.class_names or self.facts.resolve(name):
            return None
        sites: list[LoaderSite] = []
        for fn in functions:
            returned = function_returns(fn)
            if not returned:
                return None
            for expr in returned:
                more = self.loader_sites_for(expr, fn, depth + 1)
                if more is None:
                    return None
                sites += more
        return sites or None

    def _param_loaders(self, name: str, fn: cst.FunctionDef, depth: int) -> list[LoaderSite] | None:
        params = _positional_params(fn)
        index = params.index(name) if name in params else None
        callers = callers_of(self.facts, fn, how="self", outside=True)
        sites: list[LoaderSite] = []
        for caller in callers:
            offset = 1 if params and params[0] in ("self", "cls") and (caller.name or "").startswith(("self.", "cls.")) else 0
            arg = caller.arg(name, None if index is None else index - offset)
            if arg is None:
                continue
            more = self.loader_sites_for(arg, caller.ctx.function, depth + 1)
            if more is None:
                return None
            sites += more
        if sites:
            return sites
        if callers:
            return None
        # Called from elsewhere (a framework, another module): a parameter named like a loader is
        # taken to be one of this file's DataLoaders when every one of them is plain.
        if "loader" in name.lower() and self.loaders:
            return list(self.loaders)
        return None


def _positional_params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]


def _subscript_key(binding) -> str | None:
    """``kw["pin_memory"] = True`` → ``"pin_memory"`` (facts records it as a binding of ``kw``)."""
    statement = binding.statement.node if binding.statement else None
    smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
    for small in smalls:
        if isinstance(small, cst.Assign) and small.value is binding.value:
            for target in small.targets:
                node = target.target
                if isinstance(node, cst.Subscript) and len(node.slice) == 1:
                    index = node.slice[0].slice
                    if isinstance(index, cst.Index):
                        key = literal(index.value)
                        if isinstance(key, str):
                            return key
    return None


def _only_indexes_self(function: cst.FunctionDef) -> bool:
    """``__getitem__`` is one ``return`` of ``self.<attr>[<index>]`` items (alone, in a tuple, a list or
    a dict with string keys), the index being its parameter."""
    params = [p.name.value for p in function.params.params]
    if len(params) != 2 or not isinstance(function.body, cst.IndentedBlock):
        return False
    body = [s for s in function.body.body if not (isinstance(s, cst.SimpleStatementLine) and isinstance(
        s.body[0], cst.Expr) and isinstance(s.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))]
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine):
        return False
    statement = body[0].body[0]
    if not isinstance(statement, cst.Return) or statement.value is None:
        return False
    index = params[1]

    def indexed(expr: cst.BaseExpression) -> bool:
        if isinstance(expr, (cst.Tuple, cst.List)):
            return bool(expr.elements) and all(indexed(e.value) for e in expr.elements)
        if isinstance(expr, cst.Dict):
            return bool(expr.elements) and all(
                isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) and indexed(e.value)
                for e in expr.elements
            )
        if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1:
            return False
        target = expr.value
        key = expr.slice[0].slice
        return (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
                and target.value.value == "self" and isinstance(key, cst.Index)
                and isinstance(key.value, cst.Name) and key.value.value == index)

    return indexed(statement.value)
