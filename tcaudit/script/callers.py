"""Who calls a function of the script, and what a function calls: the file's call graph, by name.

:func:`callers_of` answers "which calls run this function" for every rule and facts module, in the
spelling the question takes (the answers differ on purpose, and ``how`` names the one asked):

* ``how="name"``: every call by the function's name, with any receiver (``train(...)``,
  ``self.train(...)``, ``model.train(...)``); for a ``__call__`` method, the calls of the names its
  class's instances are bound to (``scaler = NativeScaler()`` ... ``scaler(loss, optimizer)``).
* ``how="self"``: ``name(...)``, ``self.name(...)`` and ``cls.name(...)`` alike.
* ``how="exact"``: only the spelling that calls this very function: ``self.name(...)`` for a method,
  ``name(...)`` otherwise (never ``model.train()`` for a ``def train``).
* ``how="bare"``: ``name(...)`` alone; for a class, its constructions (``Net(...)``).

A lambda has no name of its own: its callers are the calls of the names it is bound to (``make =
lambda ds: DataLoader(ds)`` ... ``make(train_set)``), however ``how`` asks.

``outside=True`` leaves out the calls from inside the function itself (its recursion).

Around it: under which parameter name a caller's value arrives (:func:`parameter_receiving`: how a
rule follows a sampler or a DDP model from a function to the calls of it), the functions a function
calls (:func:`callees`, :func:`reachable_functions`) and the functions that call it
(:func:`calling_functions`), both by ``name(...)`` and ``self.name(...)``.

ScriptFacts itself asks who calls a function that takes a device (``uses_cuda``), so this module
sits below tcaudit/script/facts.py and imports nothing of it: it reads the facts it is given through
:class:`CallFacts`, and keeps its indexes on them (``derived``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Callable, Literal, Protocol, TypeVar

import libcst as cst
from tcaudit.source.syntax import full_name

How = Literal["name", "self", "exact", "bare"]
_CallSite = Any  # a tcaudit.script.facts.CallSite (not imported: see the module's docstring)
_T = TypeVar("_T")


class CallFacts(Protocol):
    """What this module reads of a file's facts (a :class:`tcaudit.script.facts.ScriptFacts`)."""

    @property
    def calls(self) -> Sequence[_CallSite]: ...

    @property
    def functions(self) -> Sequence[tuple[cst.FunctionDef, Any]]: ...  # (function, its Frame)

    @property
    def bindings(self) -> Sequence[Any]: ...  # Binding

    @property
    def functions_by_name(self) -> Mapping[str, list[cst.FunctionDef]]: ...

    def calls_in(self, function: cst.FunctionDef | None) -> Sequence[_CallSite]: ...

    def derived(self, key: object, build: Callable[[Any], _T]) -> _T: ...


def callers_of(
    facts: CallFacts, fn: cst.FunctionDef | cst.ClassDef | cst.Lambda, how: How = "name", *, outside: bool = False
) -> list[_CallSite]:
    """The calls of ``fn`` in this file, in the file's order, found ``how`` (see the module's
    docstring); with ``outside``, only those from outside ``fn``."""
    if isinstance(fn, cst.Lambda):
        names = [b.target for b in facts.bindings if b.value is fn]
        found = [c for c in facts.calls if c.name in names]
        return [c for c in found if not c.ctx.inside(fn)] if outside else found
    name = fn.name.value
    if how == "name":
        if name == "__call__":
            found = list(_cached(facts, "instance_calls", _instance_calls).get(id(fn), []))
        else:
            found = list(_cached(facts, "by_callee_name", _calls_by_callee_name).get(name, []))
    elif how == "self":
        spellings = (name, f"self.{name}", f"cls.{name}")
        named = _cached(facts, "by_callee_name", _calls_by_callee_name).get(name, [])
        found = [c for c in named if c.name in spellings]
    elif how == "exact":
        method = any(other is fn and ctx.kind == "class" for other, ctx in facts.functions)
        wanted = f"self.{name}" if method else name
        named = _cached(facts, "by_callee_name", _calls_by_callee_name).get(name, [])
        found = [c for c in named if c.name == wanted]
    elif how == "bare":
        found = [c for c in _cached(facts, "by_callee_name", _calls_by_callee_name).get(name, []) if c.name == name]
    else:
        raise ValueError(f"unknown way to find callers: {how!r}")
    if outside:
        found = [c for c in found if not c.ctx.inside(fn)]
    return found


def parameter_receiving(fn: cst.FunctionDef, call: cst.Call, dotted: str) -> str | None:
    """The parameter of ``fn`` that ``call`` passes ``dotted`` to (positionally or by keyword)."""
    params = [x.name.value for x in (*fn.params.posonly_params, *fn.params.params)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, cst.Attribute):
        params = params[1:]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for index, arg in enumerate(positional):
        if full_name(arg.value) == dotted and index < len(params):
            return params[index]
    for arg in call.args:
        if arg.keyword is not None and full_name(arg.value) == dotted:
            return arg.keyword.value
    return None


# -- the call graph by name ---------------------------------------------------------------------------


def callees(facts: CallFacts, function: cst.FunctionDef | None) -> set[cst.FunctionDef]:
    """Functions of this file that ``function`` (None: the module's own code) calls by name or as
    ``self.name``."""
    out: set[cst.FunctionDef] = set()
    for call in facts.calls_in(function):
        name = call.name or ""
        short = name[5:] if name.startswith("self.") else name
        if "." in short:
            continue
        for target in facts.functions_by_name.get(short, []):
            if target is not function:
                out.add(target)
    return out


def reachable_functions(facts: CallFacts, function: cst.FunctionDef | None, depth: int = 3) -> set[cst.FunctionDef]:
    """The functions ``function`` reaches through :func:`callees`, up to ``depth`` calls deep."""
    seen: set[cst.FunctionDef] = set()
    frontier = {function}
    for _ in range(depth):
        nxt: set[cst.FunctionDef] = set()
        for fn in frontier:
            for callee in callees(facts, fn):
                if callee not in seen:
                    seen.add(callee)
                    nxt.add(callee)
        frontier = nxt  # type: ignore[assignment]
    return seen


def calling_functions(facts: CallFacts, fn: cst.FunctionDef) -> AbstractSet[cst.FunctionDef]:
    """The functions of this file that call ``fn`` by name or as ``self.name`` (those whose
    :func:`callees` hold it); read it, do not change it."""
    return _cached(facts, "calling_functions", _calling_functions).get(id(fn), frozenset())


# -- the indexes, built once per file on first use ------------------------------------------------------


def _calls_by_callee_name(facts: CallFacts) -> dict[str, list[_CallSite]]:
    """Calls by their dotted callee, and a method call also by the method's name."""
    table: dict[str, list[_CallSite]] = {}
    for call in facts.calls:
        if not call.name:
            continue
        keys = {call.name}
        method = call.method
        if method and call.name.endswith("." + method):
            keys.add(method)
        for key in keys:
            table.setdefault(key, []).append(call)
    return table


def _instance_calls(facts: CallFacts) -> dict[int, list[_CallSite]]:
    """For each ``__call__`` method (by ``id``), the calls of the names its class's instances are bound to."""
    methods = {
        frame.class_def.name.value: node
        for node, frame in facts.functions
        if node.name.value == "__call__" and frame.class_def is not None
    }
    holders: dict[str, cst.FunctionDef] = {}
    for binding in facts.bindings:
        value = binding.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in methods:
            holders[binding.target] = methods[value.func.value]
    table: dict[int, list[_CallSite]] = {}
    for call in facts.calls:
        method = holders.get(call.name or "")
        if method is not None:
            table.setdefault(id(method), []).append(call)
    return table


def _calling_functions(facts: CallFacts) -> dict[int, set[cst.FunctionDef]]:
    """For each function (by ``id``), the functions that call it by name or as ``self.name``."""
    table: dict[int, set[cst.FunctionDef]] = {}
    for call in facts.calls:
        caller = call.ctx.function
        if caller is None:
            continue
        name = call.name or ""
        short = name[5:] if name.startswith("self.") else name
        if not short or "." in short:
            continue
        for target in facts.functions_by_name.get(short, []):
            if target is not caller:
                table.setdefault(id(target), set()).add(caller)
    return table


def _cached(facts: CallFacts, key: str, build: Callable[[CallFacts], _T]) -> _T:
    # Kept on the facts (ScriptFacts.derived), living as long as they do; the indexes hold the file's nodes.
    return facts.derived(("callers", key), build)
