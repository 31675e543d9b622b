"""The autocast editing TC201 and TC204 share: wrapping statements in an autocast ``with``, and the
GradScaler an fp16 autocast needs (created once, scaling each backward, driving each optimizer step,
updated after the last), planned at detection and applied by :class:`AutocastEditor`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from tcaudit.findings import DeclineFix
from tcaudit.rewrite.codemod import StatementEditor, parse_expression, parse_statement, torch_import_name, unique_name
from tcaudit.script.devices import device_expression
from tcaudit.script.facts import ScriptFacts, TrainingStep, outermost_loop


@dataclass(frozen=True, eq=False)
class DeviceVariable:
    """``name = code`` inserted before ``loop``, so a long device-type expression is computed once."""

    name: str
    code: str
    loop: cst.CSTNode


@dataclass(frozen=True, eq=False)
class GradScalerPlan:
    """Create one GradScaler, scale these backwards, step these optimizers through it, update it."""

    name: str  # ``scaler`` or ``self.scaler``
    create: str  # the statement creating it
    before: cst.CSTNode | None  # the outermost loop it is created before, or
    after: cst.CSTNode | None  # the last statement of ``__init__`` it is created after
    backwards: tuple[cst.Call, ...]
    optimizer_steps: tuple[cst.Call, ...]
    last_step: cst.BaseStatement  # ``scaler.update()`` goes after it


# -- the plan -------------------------------------------------------------------------------------


class DevicePlanner:
    """The device-type expression of each step of one function; a long one (a call) is named once,
    before the function's outermost loop, and that name is used from then on."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts
        self.torch_name = torch_import_name(facts) or "torch"
        self.variable: DeviceVariable | None = None

    def at(self, step: TrainingStep) -> tuple[str, str]:
        device_type = device_expression(self.facts, step, "type", self.torch_name)
        enabled = device_expression(self.facts, step, "condition", self.torch_name)
        if "(" not in device_type:
            return device_type, enabled
        if self.variable is not None:
            return self.variable.name, f'{self.variable.name} == "cuda"'
        loop = outermost_loop(step.ctx, step.function)
        if loop is None:
            return device_type, enabled
        self.variable = DeviceVariable(unique_name(self.facts, "amp_device"), device_type, loop)
        return self.variable.name, f'{self.variable.name} == "cuda"'


def plan_grad_scaler(
    facts: ScriptFacts, steps: list[TrainingStep], device: "DevicePlanner | None" = None
) -> GradScalerPlan:
    """One GradScaler for these steps of one function (before their outermost loop, or in
    ``__init__`` when the step is a method without a loop); raises DeclineFix when the optimizer
    steps cannot be driven by it."""
    function = steps[0].function
    opt_steps = [c for c in facts.optimizer_steps if c.ctx.function is function]
    if not opt_steps:
        raise DeclineFix("optimizer.step() is not in the same function as the backward; "
                         "add the GradScaler by hand or use precision = \"bf16\"")
    if any(c.receiver_name in facts.scalers for c in opt_steps):
        raise DeclineFix("a GradScaler already drives this optimizer")
    if any(len(c.node.args) for c in opt_steps):
        raise DeclineFix("optimizer.step(closure) cannot be driven by a GradScaler")
    device = device or DevicePlanner(facts)
    torch_name = device.torch_name
    device_type, enabled = device.at(steps[0])
    loop = outermost_loop(steps[0].ctx, function)
    create = f"{torch_name}.amp.GradScaler({device_type}, enabled={enabled})"
    init_last = None
    if loop is not None:
        name = unique_name(facts, "scaler")
    else:
        cls = steps[0].ctx.class_def
        init = _init_of(cls) if cls is not None else None
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            raise DeclineFix("no loop or __init__ to create the GradScaler in; add it by hand")
        # ``__init__`` sees only ``self.`` names: a device or flag local to the step is not there.
        if "self." in device_type.replace("self.device", "") or (
            device_type not in ('"cuda"',) and "self." not in device_type
        ) or (device_type == '"cuda"' and enabled != f"{torch_name}.cuda.is_available()"):
            device_type, enabled = '"cuda"', f"{torch_name}.cuda.is_available()"
            create = f"{torch_name}.amp.GradScaler({device_type}, enabled={enabled})"
        name = "self." + unique_name(facts, "scaler")
        init_last = init.body.body[-1]
    last = max(opt_steps, key=lambda c: facts.line_of(c.node))
    if last.statement is None:
        raise DeclineFix("optimizer.step() is not a plain statement")
    return GradScalerPlan(
        name=name,
        create=f"{name} = {create}",
        before=loop,
        after=init_last,
        backwards=tuple(step.backward.node for step in steps),
        optimizer_steps=tuple(c.node for c in opt_steps),
        last_step=last.statement.node,
    )


def _init_of(cls: cst.ClassDef) -> cst.FunctionDef | None:
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    for item in cls.body.body:
        if isinstance(item, cst.FunctionDef) and item.name.value == "__init__":
            return item
    return None


# -- the edit -------------------------------------------------------------------------------------


class AutocastEditor(StatementEditor):
    """Statement edits plus wrapping statements in a ``with`` and routing backwards and optimizer
    steps through a GradScaler, all by node identity."""

    def __init__(self) -> None:
        super().__init__()
        self.wraps: dict[int, tuple[list[int], str]] = {}
        self.backwards: dict[int, str] = {}
        self.steps: dict[int, str] = {}
        self.widened: dict[int, list[int]] = {}  # an autocast ``with`` -> the statements moved into it
        self.moved: set[int] = set()

    def widen(self, autocast: cst.With, statements: list[cst.CSTNode]) -> None:
        """Move ``statements`` (just before ``autocast`` in its block) to the start of its body."""
        self.widened[id(autocast)] = [id(s) for s in statements]
        self.moved.update(id(s) for s in statements)

    def wrap(self, statements: list[cst.CSTNode], context_expr: str) -> None:
        self.wraps[id(statements[0])] = ([id(s) for s in statements], context_expr)

    def add_grad_scaler(self, plan: GradScalerPlan, module: cst.Module) -> None:
        create = [parse_statement(plan.create, module)]
        if plan.before is not None:
            self.insert_before(plan.before, create)
        else:
            self.insert_after(plan.after, create)
        for backward in plan.backwards:
            self.backwards[id(backward)] = plan.name
        for call in plan.optimizer_steps:
            self.steps[id(call)] = plan.name
        self.insert_after(plan.last_step, [parse_statement(f"{plan.name}.update()", module)])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        scaler = self.backwards.get(id(original_node))
        if scaler is not None and isinstance(updated_node.func, cst.Attribute):
            loss = updated_node.func.value
            scaled = cst.Call(
                func=cst.Attribute(value=parse_expression(scaler, cst.Module([])), attr=cst.Name("scale")),
                args=[cst.Arg(loss)],
            )
            return updated_node.with_changes(func=updated_node.func.with_changes(value=scaled))
        scaler = self.steps.get(id(original_node))
        if scaler is not None and isinstance(updated_node.func, cst.Attribute):
            optimizer = updated_node.func.value
            return cst.Call(
                func=cst.Attribute(value=parse_expression(scaler, cst.Module([])), attr=cst.Name("step")),
                args=[cst.Arg(optimizer)],
            )
        return updated_node

    def _rebuild(self, original_body, updated_body) -> list:
        if not self.wraps and not self.widened:
            return super()._rebuild(original_body, updated_body)
        originals = list(original_body)
        updated = list(updated_body)
        out_original: list = []
        out_updated: list = []
        pending: list = []  # moved statements waiting for their autocast block
        index = 0
        while index < len(originals):
            node = originals[index]
            if id(node) in self.moved:
                pending.append(updated[index])
                index += 1
                continue
            if id(node) in self.widened and pending:
                widened = updated[index]
                leading = [*getattr(pending[0], "leading_lines", ()), *widened.leading_lines]
                pending[0] = pending[0].with_changes(leading_lines=[])
                widened = widened.with_changes(
                    leading_lines=leading,
                    body=widened.body.with_changes(body=[*pending, *widened.body.body]),
                )
                pending = []
                out_original.append(node)
                out_updated.append(widened)
                index += 1
                continue
            wrap = self.wraps.get(id(node))
            if wrap is None:
                out_original.append(node)
                out_updated.append(updated[index])
                index += 1
                continue
            ids, context_expr = wrap
            count = len(ids)
            inner = updated[index: index + count]
            first = inner[0]
            leading = getattr(first, "leading_lines", ())
            inner[0] = first.with_changes(leading_lines=[])
            with_node = cst.With(
                items=[cst.WithItem(parse_expression(context_expr, cst.Module([])))],
                body=cst.IndentedBlock(body=inner),
                leading_lines=leading,
            )
            # Keep insert/replace plans keyed on the wrapped statements working on the new node.
            for key in (self.before, self.after):
                if id(node) in key:
                    key[id(with_node)] = key.pop(id(node))
            out_original.append(with_node)
            out_updated.append(with_node)
            index += count
        return super()._rebuild(out_original, out_updated)
