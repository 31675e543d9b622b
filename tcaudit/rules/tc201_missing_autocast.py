"""TC201 missing-autocast: a training step whose forward and loss run in fp32 on a GPU."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.amp import amp_facts
from tcaudit.script.facts import ScriptFacts, loss_statements
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import DeclineFix, FixContext, StatementEditor, ensure_import, parse_expression, parse_statement, torch_import_name
from tcaudit.rules.base import Codemod
from tcaudit.script.facts import CallSite, Frame, ScriptFacts, TrainingStep


class MissingAutocast(ScriptRule):
    id = "TC201"
    triggers = (r"\.backward\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or not facts.uses_accelerator or not facts.updates_parameters:
            return  # a framework owns precision; a CPU-only script gets no AMP advice
        amp = amp_facts(facts)
        if amp.half_model_casts or amp.double_model:
            return  # TC206 covers a model cast to half; float64 models ignore autocast on purpose
        uncovered: dict[object, list] = {}
        for step in facts.training_steps:
            if not amp.step_is_covered(step):
                uncovered.setdefault(step.function, []).append(step)
        dtype, scaler, why = amp.recommended_precision(context.settings.precision)
        recipe = "bf16 autocast" if dtype == "bfloat16" else "fp16 autocast with a GradScaler"
        for function, steps in uncovered.items():
            ranges = []
            first_node = None
            for step in steps:
                statements = loss_statements(facts, step)
                if statements:
                    start = facts.line_of(statements[0].node)
                    end = facts.position(statements[-1].node).end.line
                    node = statements[0].node
                else:
                    node = step.backward.statement.node if step.backward.statement else step.backward.node
                    start = end = facts.line_of(node)
                ranges.append({"start_line": start, "end_line": end, "backward_line": facts.line_of(step.backward.node)})
                if first_node is None:
                    first_node = node
            where = f"in `{function.name.value}`" if function is not None else "at module level"
            lines = ", ".join(
                f"{r['start_line']}" if r["start_line"] == r["end_line"] else f"{r['start_line']}-{r['end_line']}"
                for r in ranges
            )
            message = (
                f"training step {where} runs forward and loss in fp32 (line {lines}): "
                f"wrap them in torch.autocast; {recipe} ({why})"
            )
            reason = None
            if amp.uses_lbfgs and scaler:
                reason = "LBFGS closures cannot use GradScaler"
            yield self.finding(
                facts,
                first_node,
                message,
                fix=Fix(
                    FixClass.NUMERICS,
                    f"wrap forward and loss in torch.autocast(device_type, dtype=torch.{dtype})"
                    + (" and scale the loss with torch.amp.GradScaler" if scaler else ""),
                    available=reason is None,
                    reason=reason,
                    anchor={"kind": "wrap-autocast", "ranges": ranges, "dtype": dtype, "scaler": scaler},
                ),
            )


# -- the fix ------------------------------------------------------------------------------------

_DEVICE_NAMES = ("device", "dev", "self.device", "args.device")


def _device_expr(facts: ScriptFacts, step: TrainingStep, torch_name: str) -> tuple[str, str]:
    """(device-type expression, enabled expression) usable at the step's position."""
    function = step.function
    if function is not None:
        params = {p.name.value for p in function.params.params + function.params.kwonly_params}
        for name in _DEVICE_NAMES:
            if name in params:
                expr = f"{torch_name}.device({name}).type"
                return expr, f'{expr} == "cuda"'
    for name in _DEVICE_NAMES:
        for binding in facts.bindings_of(name):
            scope = binding.ctx.function
            # A global set under ``if __name__ == "__main__":`` is not visible to importers: skip it.
            visible = (
                (scope is function and function is not None)
                or binding.ctx is facts.module_frame
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
    return '"cuda"', f"{torch_name}.cuda.is_available()"


def _plain_device_type_strings(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    """True when every value the expression may take is a string literal without a device index."""
    leaves = [v for v in facts.binding_values(value) if not isinstance(v, (cst.IfExp, cst.BooleanOperation))]
    return bool(leaves) and all(
        isinstance(v, cst.SimpleString) and ":" not in str(v.evaluated_value) for v in leaves
    )


def _block_statements(facts: ScriptFacts, step: TrainingStep, start: int, end: int):
    """The statements of the step's block whose lines fall in [start, end], and the block."""
    statement = step.backward.statement
    if statement is None:
        raise DeclineFix("the backward call is not a plain statement")
    chosen = [
        node for node in statement.block
        if start <= facts.line_of(node) and facts.position(node).end.line <= end
    ]
    if not chosen:
        raise DeclineFix("the forward and loss are not statements of the backward's block")
    indices = [next(i for i, n in enumerate(statement.block) if n is node) for node in chosen]
    if indices != list(range(indices[0], indices[0] + len(indices))):
        raise DeclineFix("the forward and loss statements are not contiguous")
    return chosen


def _outermost_loop(facts: ScriptFacts, ctx: Frame, function) -> cst.CSTNode | None:
    loop = None
    for frame in ctx.chain():
        if frame.kind == "def" and frame.node is function:
            break
        if frame.kind == "loop":
            loop = frame.node
    return loop


def _unique_name(facts: ScriptFacts, base: str) -> str:
    taken = {b.target for b in facts.bindings} | {site.local for site in facts.imports}
    name, index = base, 2
    while name in taken:
        name, index = f"{base}{index}", index + 1
    return name


class MissingAutocastFix(Codemod):
    rule = "TC201"

    def __init__(self) -> None:
        self._device_vars: dict[int, tuple[str, str]] = {}

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        torch_name = torch_import_name(facts) or "torch"
        editor = _AutocastEditor()
        self._device_vars: dict[int, tuple[str, str]] = {}
        for finding in findings:
            anchor = finding.fix.anchor
            dtype = anchor["dtype"]
            for step_range in anchor["ranges"]:
                step = next(
                    (s for s in facts.training_steps if facts.line_of(s.backward.node) == step_range["backward_line"]),
                    None,
                )
                if step is None:
                    raise DeclineFix("the training step moved; run fix again")
                device_type, enabled = self._device(facts, step, torch_name, editor)
                statements = _block_statements(facts, step, step_range["start_line"], step_range["end_line"])
                editor.wrap(statements, f"{torch_name}.autocast(device_type={device_type}, "
                                        f"dtype={torch_name}.{dtype}, enabled={enabled})")
            if anchor.get("scaler"):
                steps = [
                    s for s in facts.training_steps
                    if any(facts.line_of(s.backward.node) == r["backward_line"] for r in anchor["ranges"])
                ]
                add_grad_scaler(self, facts, steps, editor, torch_name)
        new = module.visit(editor)
        if torch_import_name(facts) is None:
            new = ensure_import(new, "import torch")
        return new

    def _device(self, facts: ScriptFacts, step: TrainingStep, torch_name: str, editor: "_AutocastEditor"):
        """The device-type expression; a long one is named once, before the step's outermost loop."""
        device_type, enabled = _device_expr(facts, step, torch_name)
        if "(" not in device_type:
            return device_type, enabled
        key = id(step.function)
        if key in self._device_vars:
            return self._device_vars[key]
        loop = _outermost_loop(facts, step.ctx, step.function)
        if loop is None:
            return device_type, enabled
        name = _unique_name(facts, "amp_device")
        editor.insert_before(loop, [parse_statement(f"{name} = {device_type}", facts.module)])
        self._device_vars[key] = (name, f'{name} == "cuda"')
        return self._device_vars[key]

def add_grad_scaler(
    codemod: "MissingAutocastFix", facts: ScriptFacts, steps: list[TrainingStep], editor: "_AutocastEditor",
    torch_name: str,
) -> None:
    """Create one GradScaler for these steps (before their outermost loop, or in ``__init__`` when the
    step is a method without a loop), scale each backward, route each optimizer step through the
    scaler and update it once after the last step."""
    function = steps[0].function
    opt_steps = [c for c in facts.optimizer_steps if c.ctx.function is function]
    if not opt_steps:
        raise DeclineFix("optimizer.step() is not in the same function as the backward; "
                         "add the GradScaler by hand or use precision = \"bf16\"")
    if any(c.receiver_name in facts.scalers for c in opt_steps):
        raise DeclineFix("a GradScaler already drives this optimizer")
    if any(len(c.node.args) for c in opt_steps):
        raise DeclineFix("optimizer.step(closure) cannot be driven by a GradScaler")
    device_type, enabled = codemod._device(facts, steps[0], torch_name, editor)
    loop = _outermost_loop(facts, steps[0].ctx, function)
    create = f"{torch_name}.amp.GradScaler({device_type}, enabled={enabled})"
    if loop is not None:
        name = _unique_name(facts, "scaler")
        editor.insert_before(loop, [parse_statement(f"{name} = {create}", facts.module)])
    else:
        cls = steps[0].ctx.class_def
        init = _init_of(cls) if cls is not None else None
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            raise DeclineFix("no loop or __init__ to create the GradScaler in; add it by hand")
        if "self." in device_type.replace("self.device", "") or (
            device_type not in ('"cuda"',) and "self." not in device_type
        ):
            device_type, enabled = '"cuda"', f"{torch_name}.cuda.is_available()"
            create = f"{torch_name}.amp.GradScaler({device_type}, enabled={enabled})"
        name = "self." + _unique_name(facts, "scaler")
        editor.insert_after(init.body.body[-1], [parse_statement(f"{name} = {create}", facts.module)])
    for step in steps:
        editor.scale_backward(step, name)
    for call in opt_steps:
        editor.scaler_step(call, name)
    last = max(opt_steps, key=lambda c: facts.line_of(c.node))
    if last.statement is None:
        raise DeclineFix("optimizer.step() is not a plain statement")
    editor.insert_after(last.statement.node, [parse_statement(f"{name}.update()", facts.module)])


def _init_of(cls: cst.ClassDef) -> cst.FunctionDef | None:
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    for item in cls.body.body:
        if isinstance(item, cst.FunctionDef) and item.name.value == "__init__":
            return item
    return None


class _AutocastEditor(StatementEditor):
    def __init__(self) -> None:
        super().__init__()
        self.wraps: dict[int, tuple[list[int], str]] = {}
        self.backwards: dict[int, str] = {}
        self.steps: dict[int, str] = {}

    def wrap(self, statements: list[cst.CSTNode], context_expr: str) -> None:
        self.wraps[id(statements[0])] = ([id(s) for s in statements], context_expr)

    def scale_backward(self, step: TrainingStep, scaler: str) -> None:
        self.backwards[id(step.backward.node)] = scaler

    def scaler_step(self, call: CallSite, scaler: str) -> None:
        self.steps[id(call.node)] = scaler

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
        if not self.wraps:
            return super()._rebuild(original_body, updated_body)
        originals = list(original_body)
        updated = list(updated_body)
        out_original: list = []
        out_updated: list = []
        index = 0
        while index < len(originals):
            node = originals[index]
            plan = self.wraps.get(id(node))
            if plan is None:
                out_original.append(node)
                out_updated.append(updated[index])
                index += 1
                continue
            ids, context_expr = plan
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
