"""TC408 host-tensors-copied-each-step: CPU tensors the script built once, copied to the GPU with a
blocking copy on every training step.

The shapes: a fixed list of batches replayed (``batches = [(torch.randn(...), torch.randint(...)) for _
in range(k)]``, then ``images, labels = batches[step % len(batches)]`` and ``images.to(device)``), a
dataset preloaded into host tensors and sliced per step (``xb = X[i:i + bs].to(device)``), or the
tensor itself. Not for DataLoader batches (TC403), tensors built in the loop, fancy indexing
(``X[idx]`` gathers into a new pageable tensor, so pinning ``X`` would not make its copy asynchronous),
eval loops or CPU-only scripts.

Fix (safe): pin the host tensors once, right after the statement that builds them and only where CUDA
is available, and pass ``non_blocking=True`` to the copies. Declined where the name is bound more than
once outside opposite arms of one ``if``, where the tensor is written in place, where the list's
structure is not visible, and for data loaded from files or numpy (its size is not in the script, and
pinning makes a page-locked copy of all of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_statement
from tcaudit.rewrite.edits import CallEditor, add_keyword, with_torch_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.aliasing import assignment_targets, is_in_place_name
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import DEVICE_FACTORIES, literal, moves_to_device
from tcaudit.script.facts import Binding, CallSite, Frame, ScriptFacts, Statement
from tcaudit.script.guards import exclusive, training_loops
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import full_name, keyword, param_names, target_names
from tcaudit.source.triggers import all_of

# Host tensors whose size the script does not show: pinning them is declined (see fix_safety).
LOADED_SOURCES = frozenset({
    "torch.from_numpy", "torch.load", "torch.from_file", "torch.frombuffer", "torch.tensor", "torch.as_tensor",
})
# Methods that keep a host tensor on the host (a dtype, a shape, a copy), followed back to its source.
_HOST_METHODS = frozenset({
    "float", "double", "half", "bfloat16", "long", "int", "short", "byte", "bool", "contiguous", "clone",
    "view", "reshape", "unsqueeze", "squeeze", "flatten", "permute", "transpose", "t", "type", "to",
    "div", "mul", "sub", "add", "detach",
})
_ITERATION_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter"})


@dataclass(frozen=True)
class HostTensors:
    """A name the training loop reads host tensors from, and how the script builds it."""

    name: str  # ``batches``, ``X``, ``self.X``
    shape: str  # "tensor", "list of tensors", "list of tuples"; "mixed" across bindings (not reported)
    bindings: tuple[Binding, ...]
    loaded: str | None  # the call that loads it from outside (``torch.load``), whose size is unknown
    line: int  # where it is first built


@dataclass(frozen=True, eq=False)
class PinOnceCopyAsync(FixPlan):
    """Pin ``name`` after each statement that builds it (where CUDA is available) and pass
    ``non_blocking=True`` to the copy. Several copies of one name share the pinning statements."""

    kind = "pin-host-tensors"
    copy: cst.Call
    name: str
    after: tuple[cst.CSTNode, ...]  # the statements that build the host tensors
    code: str  # the pinning statement inserted after each


class HostTensorsCopiedEachStep(ScriptRule):
    id = "TC408"
    triggers = (all_of(r"\.(?:cuda|to)\b", BACKWARD_CALL, CUDA_EVIDENCE),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        for call in facts.calls:
            if not _blocking_copy(call) or facts.in_eval(call.ctx):
                continue
            loop = next((loop for loop in training_loops(facts, call.ctx.function) if call.ctx.inside(loop)), None)
            if loop is None:
                continue
            read = _host_read(facts, call, loop)
            if read is None:
                continue
            container, access = read
            host = _host_tensors(facts, container, call.ctx, loop)
            if host is None or not _readable_as(host, access):
                continue
            what = {"element": f"an element of `{container}`", "slice": f"a slice of `{container}`",
                    "whole": f"`{container}`"}[access]
            # A blocking host-to-device copy synchronizes the stream (PyTorch waits for it to finish), so
            # the host also waits for the GPU work queued before it, as ``.item()`` would.
            advice = (
                "pin it once (`.pin_memory()`) and pass `non_blocking=True`, or copy it to the GPU once before the loop"
                if access == "whole" else "pin them once (`.pin_memory()`) and pass `non_blocking=True`"
            )
            yield self.finding(
                facts,
                call.node,
                f"`{call.method}()` copies {what} (built once, line {host.line}) from pageable memory every step",
                explanation="A blocking copy: the host waits for it and for the GPU work queued before it; "
                f"{advice}.",
                fix=self.planned_fix(
                    FixClass.SAFE, f"pin {container} once where it is built and pass non_blocking=True",
                    lambda call=call, host=host: _plan(facts, call, host),
                ),
            )


def _blocking_copy(call: CallSite) -> bool:
    """``x.cuda()`` / ``x.to(device)`` without ``non_blocking`` (written ``False`` is a choice)."""
    if call.method not in ("cuda", "to") or call.receiver is None or not moves_to_device(call):
        return False
    if any(arg.star for arg in call.node.args) or keyword(call.node, "non_blocking") is not None:
        return False
    return len([a for a in call.node.args if a.keyword is None]) <= 1  # ``.cuda(0, True)``: non_blocking by position


# -- what the copy reads --------------------------------------------------------------------------


def _host_read(facts: ScriptFacts, call: CallSite, loop: cst.CSTNode) -> tuple[str, str] | None:
    """The name the copied value is read from and how: ``("batches", "element")`` for ``batches[i]``
    (also unpacked, or a loop over it), ``("X", "slice")`` for ``X[a:b]``, ``("X", "whole")`` for a
    name bound nowhere in the loop. None for anything else (fancy indexing, a value computed here)."""
    receiver = call.receiver
    assert receiver is not None
    direct = _subscript_read(receiver)
    if direct is not None:
        return direct
    if not isinstance(receiver, (cst.Name, cst.Attribute)):
        return None
    name = full_name(receiver)
    if name is None or call.statement is None:
        return None
    statement = call.statement
    for earlier in reversed(statement.block[:statement.index]):
        value = _assigned_value(earlier, name)
        if value is _NOT_ASSIGNED:
            continue
        return _subscript_read(value) if isinstance(value, cst.BaseExpression) else None
    if any(b.ctx.inside(loop) for b in facts.bindings_of(name)) or _assigns_in(loop, name, skip_targets_of=None):
        return _loop_target_read(call.ctx, statement, name, loop)
    return name, "whole"


def _subscript_read(expr: cst.BaseExpression) -> tuple[str, str] | None:
    """``C[i]`` → (C, "element"); ``C[a:b]`` / ``C[a:b:c]`` → (C, "slice"). ``C[i, j]`` and others: None."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1:
        return None
    if not isinstance(expr.value, (cst.Name, cst.Attribute)):
        return None
    container = full_name(expr.value)
    if container is None:
        return None
    return container, "slice" if isinstance(expr.slice[0].slice, cst.Slice) else "element"


_NOT_ASSIGNED = object()


def _assigned_value(statement: cst.CSTNode, name: str) -> object:
    """What ``statement`` assigns to ``name``: the expression (an element of a tuple on the right
    when both sides are tuples; the whole right side unpacked into ``name``'s tuple position is a
    read of one element, returned as it is), None when it binds ``name`` some other way, or
    _NOT_ASSIGNED."""
    if isinstance(statement, cst.SimpleStatementLine):
        for small in reversed(statement.body):
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    found = _value_for(target.target, small.value, name)
                    if found is not _NOT_ASSIGNED:
                        return found
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and full_name(small.target) == name:
                return None
        return _NOT_ASSIGNED
    return None if _assigns_in(statement, name, skip_targets_of=None) else _NOT_ASSIGNED


def _value_for(target: cst.BaseExpression, value: cst.BaseExpression, name: str) -> object:
    if isinstance(target, (cst.Tuple, cst.List)):
        elements = [e.value for e in target.elements]
        if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements):
            for t, v in zip(elements, value.elements):
                found = _value_for(t, v.value, name)
                if found is not _NOT_ASSIGNED:
                    return found
            return _NOT_ASSIGNED
        if any(full_name(t) == name for t in elements if isinstance(t, (cst.Name, cst.Attribute))):
            # ``images, labels = batches[i]``: one part of an element; a starred or nested target is not followed
            return value if isinstance(value, cst.Subscript) else None
        return None if any(name in target_names(t) for t in elements) else _NOT_ASSIGNED
    if isinstance(target, (cst.Name, cst.Attribute)) and full_name(target) == name:
        return value
    return _NOT_ASSIGNED


def _assigns_in(node: cst.CSTNode, name: str, skip_targets_of: cst.CSTNode | None) -> bool:
    """Whether ``name`` is bound anywhere under ``node`` (assignments, loop and ``with`` targets, the
    walrus), nested functions left out."""
    found = False

    class _Stores(cst.CSTVisitor):
        def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
            return n is node

        def visit_AssignTarget(self, n: cst.AssignTarget) -> None:
            nonlocal found
            found |= name in target_names(n.target)

        def visit_AugAssign(self, n: cst.AugAssign) -> None:
            nonlocal found
            found |= name in target_names(n.target)

        def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
            nonlocal found
            found |= name in target_names(n.target)

        def visit_For(self, n: cst.For) -> None:
            nonlocal found
            found |= n is not skip_targets_of and name in target_names(n.target)

        def visit_AsName(self, n: cst.AsName) -> None:
            nonlocal found
            found |= name in target_names(n.name)

        def visit_NamedExpr(self, n: cst.NamedExpr) -> None:
            nonlocal found
            found |= name in target_names(n.target)

    node.visit(_Stores())
    return found


def _loop_target_read(ctx: Frame, statement: Statement, name: str, loop: cst.CSTNode) -> tuple[str, str] | None:
    """``for images, labels in batches:`` (or ``enumerate(batches)``) binding ``name``, read by a
    statement directly in that loop's body with no earlier statement there rebinding it (the caller
    checked those): an element of ``batches``."""
    for frame in ctx.chain():
        if frame.kind in ("def", "class", "lambda"):
            return None
        node = frame.node
        if frame.kind != "loop" or not isinstance(node, cst.For) or name not in target_names(node.target):
            if frame.node is loop:
                return None
            continue
        if not isinstance(node.body, cst.IndentedBlock) or statement.block != tuple(node.body.body):
            return None
        iterated = node.iter
        while isinstance(iterated, cst.Call) and full_name(iterated.func) in _ITERATION_WRAPPERS:
            positional = [a.value for a in iterated.args if a.keyword is None and not a.star]
            if not positional:
                return None
            iterated = positional[0]
        if not isinstance(iterated, (cst.Name, cst.Attribute)):
            return None
        container = full_name(iterated)
        return (container, "element") if container else None
    return None


# -- how the host tensors are built ---------------------------------------------------------------


def _host_tensors(facts: ScriptFacts, name: str, used_at: Frame, loop: cst.CSTNode) -> HostTensors | None:
    """``name``'s bindings, when every one builds host tensors before the training loop: in the
    loop's function, at module level (a plain name the function does not bind), or in ``__init__``
    of the class (``self.X``). None when any is something else."""
    function = used_at.function
    if name.startswith("self."):
        cls = used_at.class_def
        bindings = [b for b in facts.bindings_of(name) if cls is not None and b.ctx.class_def is cls]
        if any(b.ctx.function is not function and (b.ctx.function is None or b.ctx.function.name.value != "__init__")
               for b in bindings):
            return None  # bound in another method: when it runs relative to the loop is not known
    elif "." in name:
        return None
    else:
        bindings = [b for b in facts.bindings_of(name) if b.ctx.function is function]
        if not bindings and function is not None and name not in param_names(function, stars=False):
            bindings = [b for b in facts.bindings_of(name) if b.ctx.function is None]
    bindings = [b for b in bindings if not b.is_item_write]  # ``X[0] = 0``: an in-place write, checked at planning
    unpacked = _unpacked_from_calls(facts, name, function)
    if not bindings and not unpacked:
        return None
    if any(b.ctx.inside(loop) or (b.ctx.function is function and facts.line_of(b.value) > facts.line_of(loop))
           for b in bindings):
        return None  # built in the loop, or after it
    shapes: set[str] = set()
    loaded: str | None = None
    for binding in bindings:
        built = _built(facts, binding.value)
        if built is None:
            return None
        shape, origin = built
        shapes.add(shape)
        loaded = loaded or origin
    for call in unpacked:
        if call.ctx.inside(loop) or facts.line_of(call.node) > facts.line_of(loop):
            return None
        built = _built(facts, call.node)
        if built is None or built[0] != "tensor" or built[1] is None:
            return None  # only loaded data comes unpacked (``X, y = torch.load(path)``)
        shapes.add("tensor")
        loaded = loaded or built[1]
    line = min([facts.line_of(b.value) for b in bindings] + [facts.line_of(c.node) for c in unpacked])
    return HostTensors(name, shapes.pop() if len(shapes) == 1 else "mixed", tuple(bindings), loaded, line)


def _unpacked_from_calls(facts: ScriptFacts, name: str, function: cst.FunctionDef | None) -> list[CallSite]:
    """``X_train, y_train = torch.load(path)``: ScriptFacts records no binding for a tuple target
    whose value is not a tuple; the call's own site stands for it."""
    out = []
    for call in facts.calls:
        if call.ctx.function is not function or call.statement is None:
            continue
        statement = call.statement.node
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and small.value is call.node and any(
                isinstance(t.target, (cst.Tuple, cst.List)) and name in target_names(t.target) for t in small.targets
            ):
                out.append(call)
    return out


def _built(facts: ScriptFacts, value: cst.BaseExpression) -> tuple[str, str | None] | None:
    """("tensor" | "list of tensors" | "list of tuples", the loading call or None) when ``value``
    builds host tensors; None otherwise (a DataLoader, a device tensor, something not seen)."""
    origin = _tensor_origin(facts, value)
    if origin is not None:
        return "tensor", origin or None
    if isinstance(value, cst.ListComp):
        items = [value.elt]
    elif isinstance(value, (cst.List, cst.Tuple)) and value.elements:
        items = [e.value for e in value.elements]
    else:
        return None
    shapes: set[str] = set()
    loaded = None
    for item in items:
        parts = [e.value for e in item.elements] if isinstance(item, cst.Tuple) else [item]
        origins = [_tensor_origin(facts, part) for part in parts]
        if any(o is None for o in origins):
            return None
        loaded = loaded or next((o for o in origins if o), None)
        shapes.add("list of tuples" if isinstance(item, cst.Tuple) else "list of tensors")
    return (shapes.pop(), loaded) if len(shapes) == 1 else None


def _tensor_origin(facts: ScriptFacts, value: cst.BaseExpression) -> str | None:
    """For an expression that makes a new host tensor: "" when a factory builds it from a shape the
    script writes, the loading call's name (``torch.from_numpy``) when its data comes from outside;
    None when it is not a host tensor maker (or is made on a device, or pinned already)."""
    node = value
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method = node.func.attr.value
        if method not in _HOST_METHODS:
            break
        if method in ("to", "type") and any(
            a.keyword is not None and a.keyword.value == "device" or _names_device(a.value) for a in node.args
        ):
            return None
        node = node.func.value
    if not isinstance(node, cst.Call):
        return None
    qualname = facts.qualname(node.func)
    if qualname in LOADED_SOURCES:
        return qualname
    if qualname not in DEVICE_FACTORIES:
        return None
    if any(keyword(node, key) is not None for key in ("device", "pin_memory", "out")):
        return None
    return ""


def _names_device(expr: cst.BaseExpression) -> bool:
    value = literal(expr)
    if isinstance(value, str):
        return True
    name = full_name(expr) or ""
    return "device" in name or "cuda" in name


def _readable_as(host: HostTensors, access: str) -> bool:
    """Only reads that give a view of the pinned memory: an element of a list, a basic slice or the
    whole of a tensor. ``X[idx]`` gathers into a fresh pageable tensor (pinning ``X`` would not help)."""
    if host.shape == "tensor":
        return access in ("slice", "whole")
    return host.shape.startswith("list") and access == "element"


# -- the plan -------------------------------------------------------------------------------------


def _plan(facts: ScriptFacts, call: CallSite, host: HostTensors) -> PinOnceCopyAsync:
    name = host.name
    if host.loaded:
        raise DeclineFix(
            f"`{name}` comes from {host.loaded}: its size is not in the script, and pin_memory() makes a "
            "page-locked copy of all of it (twice the host memory while it copies; many GB of page-locked "
            "memory can fail or starve the machine); pin it by hand if it fits, or move it to the GPU once"
        )
    bindings = host.bindings
    for i, first in enumerate(bindings):
        for second in bindings[i + 1:]:
            if not exclusive(first.ctx, second.ctx):
                lines = ", ".join(str(facts.line_of(b.value)) for b in bindings)
                raise DeclineFix(f"`{name}` is bound more than once on one path (lines {lines}): pin it by hand")
    statements = []
    for binding in bindings:
        statement = binding.statement
        if statement is None or not isinstance(statement.node, cst.SimpleStatementLine):
            raise DeclineFix(f"`{name}` is built inside a one-line statement; pin it by hand")
        statements.append(statement.node)
    written = _written_in_place(facts, host, call.ctx)
    if written is not None:
        raise DeclineFix(f"`{name}` is written in place (line {written}); pin it by hand")
    pinned = {
        "tensor": f"{name}.pin_memory()",
        "list of tensors": f"[t.pin_memory() for t in {name}]",
        "list of tuples": f"[tuple(t.pin_memory() for t in b) for b in {name}]",
    }[host.shape]
    code = with_torch_name(f"if torch.cuda.is_available():\n    {name} = {pinned}\n", facts)
    return PinOnceCopyAsync(call.node, name, tuple(statements), code)


def _written_in_place(facts: ScriptFacts, host: HostTensors, used_at: Frame) -> int | None:
    """The line of an in-place write to the host tensors (``X[i] = v``, ``X += 1``, ``X.mul_(2)``,
    on an element ``batches[0][0].zero_()``) in the scope that uses them, or None."""
    name = host.name
    scope: cst.CSTNode = used_at.class_def or used_at.function or facts.module
    if host.bindings and host.bindings[0].ctx.function is None:
        scope = facts.module

    def rooted(expr: cst.BaseExpression) -> bool:
        while isinstance(expr, cst.Subscript):
            expr = expr.value
        return isinstance(expr, (cst.Name, cst.Attribute)) and full_name(expr) == name

    for call in facts.calls:
        method = call.method
        if is_in_place_name(method) and call.receiver is not None \
                and rooted(call.receiver) and call.ctx.inside(scope):
            return facts.line_of(call.node)
    for target, statement in assignment_targets(scope):
        if isinstance(statement, cst.AugAssign) and rooted(target):
            return facts.line_of(statement)
        if isinstance(statement, cst.Assign) and isinstance(target, cst.Subscript) and rooted(target):
            return facts.line_of(next(t for t in statement.targets if t.target is target))  # ``X[i] =``'s line
    return None


# -- the fix ------------------------------------------------------------------------------------


class HostTensorsCopiedEachStepFix(Codemod):
    rule = "TC408"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        pinned: set[tuple[int, str]] = set()  # two copies read one list: pin it once
        for finding in findings:
            plan: PinOnceCopyAsync = finding.fix.plan
            editor.rewrite_call(plan.copy, lambda node: add_keyword(node, "non_blocking", cst.Name("True")))
            for statement in plan.after:
                if (id(statement), plan.code) not in pinned:
                    pinned.add((id(statement), plan.code))
                    editor.insert_after(statement, [parse_statement(plan.code, module)])
        return editor.apply(module)
