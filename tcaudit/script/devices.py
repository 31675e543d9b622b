"""Which device the script's code runs on, as code valid where the fix writes it: one answer,
:func:`device_expression`, for every rule that writes a device (TC201 and TC204's autocast and
GradScaler, TC209's migration from apex, TC305's compile condition, TC406's factory ``device=``).

The answer is read from the script, not the machine: a name that holds the device (``device``, the
name a step moves its tensors to, the argument of a ``.to(...)``) and what every binding of it is
(:func:`device_kind`: a ``torch.device(...)``, a plain device-type string, a string with an index, or
something else), written as its device type (:func:`type_expression`) and, for a condition, compared
with ``"cuda"``; else the test the script runs its moves under; else CUDA where it is there. Where
the callers need different code for the same script, the difference is in :func:`device_expression`'s
``at`` (what the code is written for) and its docstring says why; the facts are read once, here.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable, Literal, Sequence

import libcst as cst

from tcaudit.script.expressions import moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts, TrainingStep, outermost_loop
from tcaudit.script.guards import branches, is_pure_test
from tcaudit.source.syntax import call_nodes, evaluated_value, full_name, is_main_guard, names_in

# The names a script usually keeps its device in, and the device types a string may name.
DEVICE_NAMES = ("device", "dev", "self.device", "args.device")
DEVICE_TYPES = ("cuda", "cpu", "mps", "xpu")


# -- what a device value is --------------------------------------------------------------------------


class DeviceKind(Enum):
    """What every value a name holding a device may take is."""

    DEVICE = "torch.device"  # ``torch.device(...)``
    TYPE = "type"  # a string naming a device type only: ``"cuda"``, ``"cpu"``
    INDEXED = "indexed"  # strings, some with an index: ``"cuda:0"``
    OTHER = "other"  # anything else, a mix of devices and strings, or nothing known


class Follow(Enum):
    """How far the values of an expression are read before they are classified."""

    WRITTEN = "written"  # the expression as written: a branch or a name is a value of its own
    BRANCHES = "branches"  # through ``a if c else b`` and ``a or b``; a name among them is a value of its own
    NAMES = "names"  # also through the names bound to another name (``dev = device``)


def device_values(facts: ScriptFacts, expr: cst.BaseExpression, follow: Follow) -> list[cst.BaseExpression]:
    """The values ``expr`` may take, read as far as ``follow`` says (the branches of a conditional and,
    with ``Follow.NAMES``, the names that have bindings stand for their values, not for themselves)."""
    if follow is Follow.WRITTEN:
        return [expr]
    leaves = [v for v in facts.binding_values(expr) if not isinstance(v, (cst.IfExp, cst.BooleanOperation))]
    if follow is Follow.NAMES:
        leaves = [
            v for v in leaves
            if not (isinstance(v, (cst.Name, cst.Attribute)) and facts.bindings_of(full_name(v) or ""))
        ]
    return leaves


def value_kind(facts: ScriptFacts, value: cst.BaseExpression) -> DeviceKind:
    """The kind of one value: ``DeviceKind.OTHER`` for anything not a ``torch.device(...)`` or a string."""
    if isinstance(value, cst.Call) and facts.qualname(value.func) == "torch.device":
        return DeviceKind.DEVICE
    if isinstance(value, cst.SimpleString):
        return DeviceKind.INDEXED if ":" in str(evaluated_value(value)) else DeviceKind.TYPE
    return DeviceKind.OTHER


def device_kind(facts: ScriptFacts, values: Iterable[cst.BaseExpression], follow: Follow) -> DeviceKind:
    """What every one of ``values`` (each read as far as ``follow`` says) is: all ``torch.device(...)``,
    all plain device-type strings, all strings with some index among them; ``DeviceKind.OTHER`` for
    anything else, a mix of devices and strings, or no value at all."""
    kinds = {value_kind(facts, leaf) for value in values for leaf in device_values(facts, value, follow)}
    if kinds == {DeviceKind.DEVICE}:
        return DeviceKind.DEVICE
    if kinds == {DeviceKind.TYPE}:
        return DeviceKind.TYPE
    if kinds and kinds <= {DeviceKind.TYPE, DeviceKind.INDEXED}:
        return DeviceKind.INDEXED
    return DeviceKind.OTHER


def type_expression(name: str, kind: DeviceKind, torch_name: str) -> str | None:
    """The device type of ``name`` holding values of ``kind``: ``name.type`` for torch.devices,
    ``name`` itself for plain device-type strings (``"cuda" if ... else "cpu"``),
    ``torch.device(name).type`` for strings with an index; None for anything else."""
    if kind is DeviceKind.DEVICE:
        return f"{name}.type"
    if kind is DeviceKind.TYPE:
        return name
    if kind is DeviceKind.INDEXED:
        return _any_device_type(name, torch_name)
    return None


def _any_device_type(name: str, torch_name: str) -> str:
    """``torch.device(name).type``: the device type of any device value (a torch.device or a string)."""
    return f"{torch_name}.device({name}).type"


def device_argument(call: cst.Call) -> cst.BaseExpression | None:
    """The device a move (``x.to(device)``, ``x.cuda(0)``, ``x.to(device=d)``) names: its first
    positional argument, else its ``device=``; None where it names none. (Torch rejects a move that
    gives both, so the order only matters for a line that raises.)"""
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if positional:
        return positional[0]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            return arg.value
    return None


# -- the one answer ----------------------------------------------------------------------------------

Want = Literal["type", "condition", "device"]


def device_expression(
    facts: ScriptFacts,
    at: TrainingStep | CallSite | Sequence[cst.CSTNode],
    want: Want = "type",
    torch_name: str = "torch",
    *,
    guard: str | None = None,
) -> str:
    """The device ``at`` runs on, as code: its device type (``want="type"``: ``device.type``,
    ``device``, ``torch.device(device).type``, ``"cuda"``), a condition true where that is CUDA
    (``want="condition"``: the type ``== "cuda"``, else ``guard``, else ``torch.cuda.is_available()``),
    or, for a move, the device it moves to as a factory's ``device=`` (``want="device"``).

    ``at`` says what the code is written for, and with it how sure the answer must be:

    - a :class:`TrainingStep` (TC201, TC204: an autocast or GradScaler added at the step): the first
      name holding the device the step sees (a parameter or a visible binding among ``DEVICE_NAMES``,
      then a name the step moves tensors to), else the test every move of the step's function runs
      under (``if use_cuda:``; ``guard`` where given), else CUDA. A name found counts as a device by
      its name or use, so a value not read as one still gets the type ``torch.device(name).type``
      (valid for every device value); the step must get some device type.
    - the statements that build and prepare a model (TC305: the condition its compile runs under):
      the device of every ``.to(...)`` among them, read through names; where those agree on one
      type, the condition on it; else ``guard`` (the test the script puts the model's own moves
      under, which the caller finds), else CUDA. A device not read as one gives no answer: the
      compile must not run under a condition that is not about the model's device.
    - a move (TC406: the device a factory gets instead of the move): the move's own argument, as
      written (``"cuda:0"`` for ``.cuda(0)``; ``"cuda"`` for ``.cuda()``; ``device`` for a ``.to()``
      without one).
    - any other call (TC209: the GradScaler and autocast replacing apex.amp): ``device.type`` where
      every binding of ``device`` visible at the call (every binding where ``device`` is a parameter
      there) is written ``torch.device(...)``, else ``"cuda"``. Stricter than at a step: apex.amp runs
      on CUDA only, so ``"cuda"`` is what the script did, and only a device the script surely reads as
      a torch.device may say otherwise.
    """
    if want == "device":
        if not isinstance(at, CallSite):
            raise ValueError("want='device' is the device a move goes to: pass the move's CallSite")
        return _moved_to(facts, at)
    if isinstance(at, TrainingStep):
        type_, condition = _at_step(facts, at, torch_name, guard)
    elif isinstance(at, CallSite):
        type_, condition = _at_call(facts, at, torch_name)
    else:
        type_, condition = _of_moves(facts, at, torch_name, guard)
    return type_ if want == "type" else condition


def _on_cuda(type_: str) -> tuple[str, str]:
    """(a device-type expression, the condition that it is CUDA)."""
    return type_, f'{type_} == "cuda"'


def _unknown(torch_name: str, guard: str | None) -> tuple[str, str]:
    """Where the script names no device: CUDA, under the script's own test or where CUDA is there."""
    return '"cuda"', guard if guard is not None else f"{torch_name}.cuda.is_available()"


def _moved_to(facts: ScriptFacts, move: CallSite) -> str:
    """The device ``move`` copies to, as code a factory's ``device=`` takes."""
    arg = device_argument(move.node)
    if move.method == "cuda":
        if isinstance(arg, cst.Integer):
            return f'"cuda:{facts.code(arg)}"'
        return facts.code(arg) if arg is not None else '"cuda"'
    return facts.code(arg) if arg is not None else "device"


def _at_call(facts: ScriptFacts, site: CallSite, torch_name: str) -> tuple[str, str]:
    """``device.type`` where every binding of ``device`` ``site`` may see is written
    ``torch.device(...)``; CUDA otherwise."""
    function = site.ctx.function
    candidates = facts.bindings_of("device")
    if not (function is not None and any(p.name.value == "device" for p in function.params.params)):
        candidates = [b for b in candidates if b.ctx.function in (function, None)]
    if device_kind(facts, [b.value for b in candidates], Follow.WRITTEN) is DeviceKind.DEVICE:
        return _on_cuda("device.type")
    return _unknown(torch_name, None)


def _of_moves(
    facts: ScriptFacts, statements: Sequence[cst.CSTNode], torch_name: str, guard: str | None
) -> tuple[str, str]:
    """The type of the device every ``.to(...)`` among ``statements`` that names a known device
    moves to, where they agree on one; ``_unknown`` otherwise."""
    types: set[str | None] = set()
    for statement in statements:
        for call in call_nodes(statement):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "to":
                device = device_argument(call)
                if device is not None:
                    types.add(_moved_type(facts, device, torch_name))
    types.discard(None)
    if len(types) == 1:
        return _on_cuda(types.pop())  # type: ignore[arg-type]  # None was discarded
    return _unknown(torch_name, guard)


def _moved_type(facts: ScriptFacts, device: cst.BaseExpression, torch_name: str) -> str | None:
    """The device type of a name a move goes to, from every value it holds; None for a literal, a
    name without bindings, or values not all devices or all strings."""
    if not isinstance(device, (cst.Name, cst.Attribute)):
        return None
    dotted = full_name(device)
    if not dotted or not facts.bindings_of(dotted):
        return None
    return type_expression(dotted, device_kind(facts, [device], Follow.NAMES), torch_name)


def _at_step(facts: ScriptFacts, step: TrainingStep, torch_name: str, guard: str | None) -> tuple[str, str]:
    """The device the step trains on where a name in scope tells it (a ``device`` variable or
    parameter, the name the step moves its tensors to), so a "CPU unless --cuda" run on a GPU machine
    keeps autocast and the GradScaler off; else the flag every ``.cuda()`` of the function runs under;
    else CUDA when it is there."""
    function = step.function
    if function is not None:
        params = {p.name.value for p in function.params.params + function.params.kwonly_params}
        for name in DEVICE_NAMES:
            if name in params:
                return _on_cuda(_any_device_type(name, torch_name))
    for name in (*DEVICE_NAMES, *_names_moved_to(facts, step)):
        for binding in facts.bindings_of(name):
            scope = binding.ctx.function
            # A global set under ``if __name__ == "__main__":`` is not visible to importers: skip it,
            # unless the step itself is module-level code (it then runs only where the guard does).
            visible = (
                (scope is function and function is not None)
                or binding.ctx is facts.module_frame
                or (function is None and scope is None)
                or (name.startswith("self.") and step.ctx.class_def is not None
                    and binding.ctx.class_def is step.ctx.class_def)
            )
            if not visible:
                continue
            if binding.statement is not None and function is scope:
                # Must be bound before the step in the same function.
                if facts.line_of(binding.statement.node) > facts.line_of(step.backward.node):
                    continue
            return _on_cuda(_binding_type(facts, name, binding.value, torch_name))
    if guard is None:
        guard = _cuda_flag(facts, step)
    return _unknown(torch_name, guard)


def _binding_type(facts: ScriptFacts, name: str, value: cst.BaseExpression, torch_name: str) -> str:
    """The device type of ``name`` from the one binding the step sees: ``name.type`` for a value
    written ``torch.device(...)``, ``name`` where every branch is a plain device-type string, else
    ``torch.device(name).type``. A conditional of torch.devices gets that general form too, and a name
    among the values is not followed: the binding is read as the step's code has always read it."""
    if device_kind(facts, [value], Follow.WRITTEN) is DeviceKind.DEVICE:
        kind = DeviceKind.DEVICE
    elif device_kind(facts, [value], Follow.BRANCHES) is DeviceKind.TYPE:
        kind = DeviceKind.TYPE
    else:
        kind = DeviceKind.OTHER
    # Any other value still holds a device, by the name's name or use: the general form fits them all.
    return type_expression(name, kind, torch_name) or _any_device_type(name, torch_name)


def _names_moved_to(facts: ScriptFacts, step: TrainingStep) -> list[str]:
    """Names other than the usual device names that the step's function moves tensors to with
    ``.to(name)``, where every value the name may hold is a device (``torch.device(...)`` or a
    device-type string): ``target = torch.device("cuda" if args.cuda else "cpu")``."""
    out: list[str] = []
    for call in facts.calls_in(step.function):
        if call.method != "to":
            continue
        arg = device_argument(call.node)
        name = full_name(arg) if isinstance(arg, (cst.Name, cst.Attribute)) else None
        if not name or name in DEVICE_NAMES or name in out:
            continue
        values = [b.value for b in facts.bindings_of(name)]
        if values and all(_names_a_device(facts, v) for v in values):
            out.append(name)
    return out


def _names_a_device(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    """Whether every branch of ``value`` is a ``torch.device(...)`` or a string naming one of
    ``DEVICE_TYPES`` (``"cuda:1"`` too)."""
    leaves = device_values(facts, value, Follow.BRANCHES)
    return bool(leaves) and all(
        value_kind(facts, leaf) is DeviceKind.DEVICE
        or (isinstance(leaf, cst.SimpleString) and str(evaluated_value(leaf)).split(":")[0] in DEVICE_TYPES)
        for leaf in leaves
    )


def _cuda_flag(facts: ScriptFacts, step: TrainingStep) -> str | None:
    """The test every device move of the step's function runs under (``if use_cuda: model.cuda()``
    and ``if use_cuda: x = x.cuda()``), as code valid before its training loop: that flag, not the
    machine, says whether the run is on CUDA. None where some move runs unconditionally, the moves
    share no such test, or the loop assigns a name it reads."""
    moves = [c for c in facts.calls_in(step.function) if moves_to_device(c)]
    if not moves:
        return None
    common: list[str] | None = None
    for call in moves:
        # The main guard is around every move of a module-level script and says nothing of devices.
        codes = [facts.code(b.test.test) for b in branches(call.ctx)
                 if b.taken and is_pure_test(b.test.test) and not is_main_guard(b.test)]
        common = codes if common is None else [code for code in common if code in codes]
    if not common:
        return None
    test = next(b.test.test for b in branches(moves[0].ctx) if b.taken and facts.code(b.test.test) == common[0])
    loop = outermost_loop(step.ctx, step.function)
    if loop is not None and any(
        b.ctx.inside(loop) for name in names_in(test) for b in facts.bindings_of(name)
    ):
        return None
    return common[0]
