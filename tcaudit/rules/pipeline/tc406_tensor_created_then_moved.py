"""TC406 tensor-created-then-moved: ``torch.zeros(...).cuda()`` instead of ``torch.zeros(..., device=...)``.

Also through a slice (``torch.arange(n)[:k].cuda()``) and through a name bound in the same block and
not read before the move (``x = torch.randn(...)`` then ``x = x.to(device)``); not for a tensor made
from host data (``torch.tensor(batch)``), which is copied however it is made.

Fix (safe; numerics for random factories in the training step, whose CPU and CUDA generators draw
different numbers from one seed): pass the device to the factory and drop the ``.cuda()``/``.to()``
call. Declined when the move also changes the dtype or layout, when the tensor requires grad (created
on the device it becomes a leaf), and for a random factory outside the training step (a seeded split
or initialisation would change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import FixContext, parse_expression
from tcaudit.rewrite.edits import CallEditor, add_keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.devices import device_expression
from tcaudit.script.distributed import distributed_facts
from tcaudit.script.evidence import ACCELERATOR_NAMED
from tcaudit.script.expressions import DEVICE_FACTORIES, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.script.steps import runs_every_step
from tcaudit.source.syntax import full_name, keyword
from tcaudit.source.triggers import all_of

_MOVE_ARGUMENTS = {"cuda": ("device", "non_blocking"), "to": ("device", "non_blocking")}


@dataclass(frozen=True, eq=False)
class FoldDevice(FixPlan):
    """``factory(...).method(device)`` becomes ``factory(..., device=device)``; through a slice
    (``torch.arange(n)[:k].cuda()``) or a name (``x = torch.randn(...)`` then ``x = x.to(device)``)
    the factory gets the device and the move gives way to what it moved."""

    kind = "move-device-into-factory"
    move: cst.Call  # the ``.cuda()``/``.to()`` call, replaced by its receiver
    device: str
    method: str
    factory: cst.Call  # gets ``device=``
    removed: cst.SimpleStatementLine | None = None  # ``x = x.to(device)``: nothing left to do once folded
    others: tuple[cst.Call, ...] = ()  # ``torch.cat([torch.ones(b), torch.zeros(b)])``: the other factories


class TensorCreatedThenMoved(ScriptRule):
    id = "TC406"
    # It needs a move, an accelerator and one of the factories by name (an alias still spells it).
    triggers = (all_of(r"\.(?:cuda|to)\b", ACCELERATOR_NAMED,
                       r"\b(?:zeros|ones|empty|full|rand\w*|arange|linspace|logspace|eye|tensor|as_tensor|\w+_like"
                       r"|tril_indices|triu_indices)\("),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.uses_accelerator:
            return
        pipeline = pipeline_facts(facts)
        by_node = {id(c.node): c for c in facts.calls}
        for call in facts.calls:
            if call.method not in ("cuda", "to") or call.receiver is None or not moves_to_device(call):
                continue
            created = _created_by_factory(facts, by_node, call)
            if created is None:
                continue
            factory, removed, origin, others = created
            node = factory.node
            made = [node, *(other.node for other in others)]
            if any(keyword(n, key) is not None for n in made for key in ("device", "generator", "pin_memory", "out")):
                continue  # a CPU generator or pinned staging buffer is deliberate
            if any(arg.star for n in made for arg in n.args):
                continue
            names = [site.qualname.split(".")[-1] for site in (factory, *others)]
            name = next((n for n in names if n.startswith("rand")), names[0])
            if name.endswith("_like") and _like_a_device_tensor(facts, by_node, node):
                continue  # made where its template is: on the device already, the move copies nothing
            target = device_expression(facts, call, "device")
            # A random draw under no_grad / eval (the samples a VAE decodes after each epoch) is not part
            # of the training step: it costs one copy per evaluation, and the fix would take it off the
            # CPU generator that later shuffles and initialisations share with it.
            per_step = _per_step(facts, pipeline, call) and not (name.startswith("rand") and facts.in_eval(call.ctx))
            yield self.finding(
                facts,
                call.node,
                f"`torch.{name}(...)`{origin} is built on the host and copied to the device"
                f"{' every step' if per_step else ''}",
                explanation=f"Create it there: `torch.{name}(..., device={target})`.",
                severity=None if per_step else Severity.INFO,
                fix=self.planned_fix(
                    FixClass.NUMERICS if name.startswith("rand") else FixClass.SAFE,
                    f"pass device={target} to {'each factory it joins' if others else 'torch.' + name} and drop the "
                    f".{call.method}() call",
                    lambda call=call, target=target, name=name, per_step=per_step, made=made, removed=removed: _plan(
                        call, made, removed, target, name, per_step),
                ),
            )


def _like_a_device_tensor(facts: ScriptFacts, by_node: dict[int, CallSite], factory: cst.Call) -> bool:
    """``torch.zeros_like(rewards)`` where ``rewards`` may be a tensor moved to the device or made there."""
    if not factory.args or factory.args[0].keyword is not None:
        return False
    for value in facts.binding_values(factory.args[0].value):
        site = by_node.get(id(value)) if isinstance(value, cst.Call) else None
        if site is not None and (moves_to_device(site) or keyword(value, "device") is not None):
            return True
    return False


_JOINS = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack", "torch.vstack"})


def _created_by_factory(
    facts: ScriptFacts, by_node: dict[int, CallSite], move: CallSite
) -> tuple[CallSite, cst.SimpleStatementLine | None, str, tuple[CallSite, ...]] | None:
    """The factory call whose tensor ``move`` copies to the device, the statement a fold makes empty,
    and how the tensor got there (for the message): the factory itself (``torch.zeros(n).cuda()``), a
    slice of it (``torch.arange(n)[:k].cuda()``), or a name bound to either in the same block and read
    nowhere else before the move (``x = torch.randn(...)`` then ``x = x.to(device)``)."""
    receiver = move.receiver
    sliced = receiver
    while isinstance(sliced, cst.Subscript):
        sliced = sliced.value
    if isinstance(sliced, cst.Call):
        factory = by_node.get(id(sliced))
        if factory is not None and factory.qualname in _JOINS and sliced is receiver:
            joined = _joined_factories(by_node, factory)
            return (joined[0], None, f" in `{factory.name}([...])`", tuple(joined[1:])) if joined else None
        if factory is None or factory.qualname not in DEVICE_FACTORIES:
            return None
        if sliced is not receiver and not _builds_from_shape(factory):
            return None
        return factory, None, "" if sliced is receiver else " (sliced)", ()
    if not isinstance(receiver, cst.Name) or move.statement is None:
        return None
    found = _created_through_name(facts, by_node, move, receiver.value)
    return (*found, ()) if found is not None else None


def _joined_factories(by_node: dict[int, CallSite], join: CallSite) -> list[CallSite]:
    """``torch.cat([torch.ones(b, 1), torch.zeros(b, 1)])``: the factories it joins, when every
    element is one (a shape or literal data); empty when any element is anything else."""
    tensors = join.node.args[0].value if join.node.args and join.node.args[0].keyword is None else None
    if not isinstance(tensors, (cst.List, cst.Tuple)) or not tensors.elements:
        return []
    out: list[CallSite] = []
    for element in tensors.elements:
        site = by_node.get(id(element.value)) if isinstance(element, cst.Element) else None
        if site is None or site.qualname not in DEVICE_FACTORIES or not _builds_from_shape(site):
            return []
        out.append(site)
    return out


def _created_through_name(
    facts: ScriptFacts, by_node: dict[int, CallSite], move: CallSite, name: str
) -> tuple[CallSite, cst.SimpleStatementLine | None, str] | None:
    here = move.statement
    assert here is not None
    earlier = [
        b for b in facts.bindings_of(name)
        if b.statement is not None and b.statement.block is here.block and b.statement.index < here.index
    ]
    if not earlier:
        return None
    binding = max(earlier, key=lambda b: b.statement.index)  # type: ignore[union-attr]
    statement = binding.statement.node  # type: ignore[union-attr]
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or assign.value is not binding.value:
        return None
    value = binding.value
    while isinstance(value, cst.Subscript):
        value = value.value
    factory = by_node.get(id(value)) if isinstance(value, cst.Call) else None
    if factory is None or factory.qualname not in DEVICE_FACTORIES or not _builds_from_shape(factory):
        return None
    between = here.block[binding.statement.index + 1:here.index]  # type: ignore[union-attr]
    if any(_reads(node, name) for node in between):
        return None  # the host tensor is used on the host too before it moves
    moved = here.node
    rebinds = (
        isinstance(moved, cst.SimpleStatementLine) and len(moved.body) == 1 and isinstance(moved.body[0], cst.Assign)
        and len(moved.body[0].targets) == 1 and full_name(moved.body[0].targets[0].target) == name
    )
    if rebinds:
        if _reads(moved, name) != 2:  # the target and the moved tensor
            return None
    else:
        scope = move.ctx.function or facts.module
        if _reads(scope, name) != 2:  # the creation and the move: the host tensor has no other use
            return None
    for dependency in _reads_any(move.node.args):
        if any(b.statement is not None and any(b.statement.node is n or b.ctx.inside(n) for n in between)
               for b in facts.bindings_of(dependency)):
            return None  # the device is chosen after the tensor is made
    removed = moved if rebinds and moved.body[0].value is move.node else None  # type: ignore[union-attr]
    return factory, removed, f" (`{name}`, line {facts.line_of(statement)})"


def _builds_from_shape(factory: CallSite) -> bool:
    """Not ``torch.tensor(batch)``: a tensor made from host data is copied however it is made; only
    literal data (``torch.tensor([0.485, 0.456, 0.406])``) or a shape is worth creating on the device."""
    if factory.qualname not in ("torch.tensor", "torch.as_tensor"):
        return True
    data = factory.arg("data", 0)
    return data is not None and _is_literal(data)


def _is_literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return _is_literal(node.expression)
    if isinstance(node, (cst.List, cst.Tuple)):
        return all(isinstance(e, cst.Element) and _is_literal(e.value) for e in node.elements)
    return False


def _reads(node: cst.CSTNode, name: str) -> int:
    """How often ``name`` is written as a plain name under ``node`` (``obj.name`` does not count)."""
    count = 0

    class _Names(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            nonlocal count
            count += n.value == name

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

    node.visit(_Names())
    return count


def _reads_any(args: Sequence[cst.Arg]) -> set[str]:
    out: set[str] = set()

    class _Names(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            out.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

    for arg in args:
        arg.value.visit(_Names())
    return out


def _plan(
    call: CallSite, made: list[cst.Call], removed: cst.SimpleStatementLine | None,
    device: str, name: str, per_step: bool,
) -> FoldDevice:
    if name.startswith("rand") and not per_step:
        # Outside the step loop a random factory usually draws something the run depends on: a
        # seeded train/val split (randperm), an initialisation. The CUDA generator draws other
        # numbers than the CPU one from the same seed, so the run would change, not just its speed.
        raise DeclineFix(
            f"torch.{name} draws from the CPU generator here; on the device the same seed gives other "
            "numbers (a different split or initialisation), so the values the script computes would change"
        )
    method = call.method or ""
    allowed = _MOVE_ARGUMENTS.get(method, ())
    positional = [a for a in call.node.args if a.keyword is None]
    if any(a.star for a in call.node.args) or len(positional) > 1:
        raise DeclineFix(f"`.{method}()` passes more than the device; fold it by hand")
    if any(a.keyword is not None and a.keyword.value not in allowed for a in call.node.args):
        raise DeclineFix(f"`.{method}()` also changes the dtype or layout; fold it by hand")
    if any(keyword(factory, "requires_grad") is not None for factory in made):
        raise DeclineFix(
            "the tensor requires grad: created on the device it becomes a leaf, and in-place writes "
            "that work on the moved copy would raise"
        )
    return FoldDevice(call.node, device, method, made[0], removed, tuple(made[1:]))


def _per_step(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite) -> bool:
    """In a ``forward``, or where the training step runs (its loop, or a function called from it): a
    copy every step. Built once per epoch (the epoch loop around the batch loop) is not per step; a
    script with no optimizer step keeps the plain test: in a loop, or a function called from one."""
    fn = call.ctx.function
    if fn is not None and fn.name.value == "forward":
        return True
    if distributed_facts(facts).step_loops:
        return runs_every_step(facts, call.ctx)
    return pipeline.repeats(call.ctx)


# -- the fix ------------------------------------------------------------------------------------


class TensorCreatedThenMovedFix(Codemod):
    rule = "TC406"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan: FoldDevice = finding.fix.plan
            device = parse_expression(plan.device, module)
            # The factory is inside the move (or earlier in the file), so it is rewritten first.
            for factory in (plan.factory, *plan.others):
                editor.rewrite_call(factory, lambda node, device=device: add_keyword(node, "device", device))
            editor.rewrite_call(plan.move, _moved_value)
            if plan.removed is not None:
                editor.remove(plan.removed)
        return editor.apply(module)


def _moved_value(node: cst.Call) -> cst.BaseExpression:
    """``x.cuda()`` → ``x``, keeping the parentheses written around the call."""
    inner = node.func.value  # type: ignore[attr-defined]  # a method call, by detection
    return inner.with_changes(lpar=[*node.lpar, *inner.lpar], rpar=[*inner.rpar, *node.rpar]) if node.lpar else inner
