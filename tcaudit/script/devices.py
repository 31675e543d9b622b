"""Which device a training step runs on, as code valid at the step: the device-type and enabled
expressions an autocast or a GradScaler added there uses (TC201, TC204).

Three rules ask nearby questions and answer them their own way, writing other code for the same
script: TC209 writes ``device.type`` only for a ``device`` whose every binding is a ``torch.device``
(else ``"cuda"``); TC305 writes a condition on the device its model is moved to (``device.type ==
"cuda"``, ``device == "cuda"``, or the script's own ``if``); TC406 copies a move's device argument.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.script.distributed import names_in
from tcaudit.script.expressions import moves_to_device
from tcaudit.script.facts import ScriptFacts, TrainingStep, outermost_loop
from tcaudit.script.guards import branches, is_pure_test
from tcaudit.source.syntax import is_main_guard

# The names a script usually keeps its device in, and the device types a string may name.
DEVICE_NAMES = ("device", "dev", "self.device", "args.device")
DEVICE_TYPES = ("cuda", "cpu", "mps", "xpu")


def device_type_at(facts: ScriptFacts, step: TrainingStep, torch_name: str) -> tuple[str, str]:
    """(device-type expression, enabled expression) usable at the step's position: the device the
    script actually trains on where a name in scope tells it (a ``device`` variable or parameter, the
    name the step moves its tensors to, the flag every ``.cuda()`` of the function runs under), so a
    "CPU unless --cuda" run on a GPU machine keeps autocast and the GradScaler off; else CUDA when it
    is there."""
    function = step.function
    if function is not None:
        params = {p.name.value for p in function.params.params + function.params.kwonly_params}
        for name in DEVICE_NAMES:
            if name in params:
                expr = f"{torch_name}.device({name}).type"
                return expr, f'{expr} == "cuda"'
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
            value = binding.value
            qual = facts.qualname(value.func) if isinstance(value, cst.Call) else None
            if qual == "torch.device":
                expr = f"{name}.type"
            elif _plain_device_type_strings(facts, value):
                expr = name  # "cuda" if ... else "cpu": already a device type
            else:
                expr = f"{torch_name}.device({name}).type"
            return expr, f'{expr} == "cuda"'
    flag = _cuda_flag(facts, step)
    if flag is not None:
        return '"cuda"', flag
    return '"cuda"', f"{torch_name}.cuda.is_available()"


def _names_moved_to(facts: ScriptFacts, step: TrainingStep) -> list[str]:
    """Names other than the usual device names that the step's function moves tensors to with
    ``.to(name)``, where every value the name may hold is a device (``torch.device(...)`` or a
    device-type string): ``target = torch.device("cuda" if args.cuda else "cpu")``."""
    out: list[str] = []
    for call in facts.calls:
        if call.ctx.function is not step.function or call.method != "to":
            continue
        arg = call.arg("device", 0)
        name = get_full_name_for_node(arg) if isinstance(arg, (cst.Name, cst.Attribute)) else None
        if not name or name in DEVICE_NAMES or name in out:
            continue
        values = [b.value for b in facts.bindings_of(name)]
        if values and all(_names_a_device(facts, v) for v in values):
            out.append(name)
    return out


def _names_a_device(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    leaves = [v for v in facts.binding_values(value) if not isinstance(v, (cst.IfExp, cst.BooleanOperation))]
    for leaf in leaves:
        if isinstance(leaf, cst.Call) and facts.qualname(leaf.func) == "torch.device":
            continue
        if isinstance(leaf, cst.SimpleString) and str(leaf.evaluated_value).split(":")[0] in DEVICE_TYPES:
            continue
        return False
    return bool(leaves)


def _cuda_flag(facts: ScriptFacts, step: TrainingStep) -> str | None:
    """The test every device move of the step's function runs under (``if use_cuda: model.cuda()``
    and ``if use_cuda: x = x.cuda()``), as code valid before its training loop: that flag, not the
    machine, says whether the run is on CUDA. None where some move runs unconditionally, the moves
    share no such test, or the loop assigns a name it reads."""
    moves = [c for c in facts.calls if c.ctx.function is step.function and moves_to_device(c)]
    if not moves:
        return None
    common: list[str] | None = None
    for call in moves:
        # The main guard is around every move of a module-level script and says nothing of devices.
        codes = [facts.module.code_for_node(b.test.test) for b in branches(call.ctx)
                 if b.taken and is_pure_test(b.test.test) and not is_main_guard(b.test)]
        common = codes if common is None else [code for code in common if code in codes]
    if not common:
        return None
    test = next(b.test.test for b in branches(moves[0].ctx) if b.taken and facts.module.code_for_node(b.test.test) == common[0])
    loop = outermost_loop(step.ctx, step.function)
    if loop is not None and any(
        b.ctx.inside(loop) for name in names_in(test) for b in facts.bindings_of(name)
    ):
        return None
    return common[0]


def _plain_device_type_strings(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    """True when every value the expression may take is a string literal without a device index."""
    leaves = [v for v in facts.binding_values(value) if not isinstance(v, (cst.IfExp, cst.BooleanOperation))]
    return bool(leaves) and all(
        isinstance(v, cst.SimpleString) and ":" not in str(v.evaluated_value) for v in leaves
    )
