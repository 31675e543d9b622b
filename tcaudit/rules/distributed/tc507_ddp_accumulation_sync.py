"""TC507 ddp-accumulation-sync: gradient accumulation on a DDP model that all-reduces every micro-step.

Fix (safe): the statements from the micro-step's forward to its backward go under
``with (model.no_sync() if <not the step's condition> else contextlib.nullcontext()):`` (for a
micro-step loop, ``if i != n - 1``). Declined where the condition cannot be tested before the
forward, the forward is elsewhere, or the model is DDP only on some paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_expression
from tcaudit.rewrite.edits import add_stdlib_import, contains
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.accumulation import ACCUMULATION_NAME
from tcaudit.script.callers import callers_of, parameter_receiving
from tcaudit.script.distributed import (
    DistributedFacts,
    distributed_facts,
    has_modulo,
    in_test_code,
    innermost_loop,
    loops_of,
)
from tcaudit.script.facts import CallSite, Frame, ScriptFacts, TrainingStep
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.script.training_code import flag_frames
from tcaudit.source.syntax import call_nodes, full_name, names_in, param_names

_SYNC_CONTROL = re.compile(r"no_sync|require_backward_grad_sync|set_requires_gradient_sync")


def _is_accumulation_test(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    """``(i + 1) % accum == 0``, ``step_now`` bound to such an expression, or a name saying so."""
    if has_modulo(test):
        return True
    for name in names_in(test):
        if ACCUMULATION_NAME.search(name):
            return True
        for binding in facts.bindings_of(name):
            if has_modulo(binding.value):
                return True
    return False


def _conditional_steps(facts: ScriptFacts, info: DistributedFacts) -> list[tuple[Frame, Frame]]:
    """(loop, if-frame) for optimizer steps that run only every few iterations of their loop."""
    out = []
    for step in facts.optimizer_steps:
        for ctx in info.call_contexts(step.ctx):
            loop = innermost_loop(ctx)
            if loop is None:
                continue
            for frame in ctx.chain():
                if frame is loop:
                    break
                if frame.kind == "if" and _is_accumulation_test(facts, frame.node.test):  # type: ignore[attr-defined]
                    out.append((loop, frame))
                    break
    return out


def accumulating_backwards(facts: ScriptFacts, info: DistributedFacts) -> list[tuple[CallSite, str]]:
    """Backward calls that run on micro-steps between two optimizer steps, with how we know."""
    found: dict[int, tuple[CallSite, str]] = {}
    conditional = _conditional_steps(facts, info)
    step_loops = {}
    for step in facts.optimizer_steps:
        for ctx in info.call_contexts(step.ctx):
            loop = innermost_loop(ctx)
            if loop is not None:
                step_loops[id(loop.node)] = loop
    for training in facts.training_steps:
        backward = training.backward
        for ctx in info.call_contexts(backward.ctx):
            loop = innermost_loop(ctx)
            if loop is None:
                continue
            for step_loop, guard in conditional:
                if step_loop.node is loop.node and not ctx.inside(guard.node):
                    found.setdefault(id(backward.node), (backward, "the optimizer steps only under `if "
                                     + facts.code(guard.node.test) + "`"))  # type: ignore[attr-defined]
            if id(loop.node) in step_loops:
                continue
            outer = loops_of(loop.parent)[:1] if loop.parent is not None else []
            if outer and id(outer[0].node) in step_loops:
                found.setdefault(id(backward.node), (backward, "backward runs in an inner micro-step loop and "
                                 "the optimizer steps once after it"))
    return list(found.values())


@dataclass(frozen=True, eq=False)
class WrapNoSync(FixPlan):
    kind = "wrap-no-sync"
    statements: tuple[cst.BaseStatement, ...]  # the forward-to-backward run of one block
    line: int  # the backward
    model: str
    context: str  # the ``with`` item: ``(model.no_sync() if ... else contextlib.nullcontext())``
    import_contextlib: bool


class DdpAccumulationSync(ScriptRule):
    id = "TC507"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        ddp = info.wraps_of("ddp")
        if not ddp or facts.frameworks or _SYNC_CONTROL.search(info.text):
            return
        model = next((w.target for w in ddp if w.target), None)
        wrapped: set[int] = set()  # statements an earlier finding's fix wraps
        for backward, how in accumulating_backwards(facts, info):
            if in_test_code(backward.ctx):
                continue

            def plan(backward=backward) -> WrapNoSync:
                if not model:
                    raise DeclineFix("the DDP-wrapped model is not bound to a name")
                made = _plan(facts, backward)
                if any(id(s) in wrapped for s in made.statements):
                    raise DeclineFix("two backward calls share these statements; add no_sync by hand")
                wrapped.update(id(s) for s in made.statements)
                return made

            yield self.finding(
                facts,
                backward.node,
                "every micro-step's backward all-reduces the gradients of this DDP model under gradient accumulation",
                explanation=f"Gradient accumulation: {how}. Skip the sync on non-final micro-steps with "
                "`no_sync()` (or `require_backward_grad_sync = False`).",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    f"run the forward and backward of non-final micro-steps under `{model or 'model'}.no_sync()`",
                    plan,
                ),
            )


# -- the plan for one backward --------------------------------------------------------------------------

# A ``with`` header longer than this is split over several lines.
_LINE_LENGTH = 100
# Calls a condition may make and still give the same answer when evaluated twice.
_PURE_CALLS = frozenset({"len", "int", "min", "max", "abs", "bool", "float"})
_NEGATED = {
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.LessThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.LessThan, cst.GreaterThan: cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThan,
    cst.Is: cst.IsNot, cst.IsNot: cst.Is, cst.In: cst.NotIn, cst.NotIn: cst.In,
}


def _plan(facts: ScriptFacts, backward: CallSite) -> WrapNoSync:
    step = next((s for s in facts.training_steps if s.backward.node is backward.node), None)
    if step is None:
        raise DeclineFix("the backward call could not be located")
    site, loop = _site(facts, step)
    statement = site.statement
    if statement is None or not _in_indented_block(statement.node, statement.block):
        raise DeclineFix("the backward is not a statement of its own block")
    block, index = statement.block, statement.index
    model, start = _forward(facts, block, index, site.ctx)
    statements = tuple(block[start:index + 1])
    for call in facts.optimizer_steps:
        if any(contains(s, call.node) for s in statements):
            raise DeclineFix("an optimizer step sits between the forward and the backward")
    skip_sync, sync = _condition(facts, loop, site, list(statements))
    nullcontext, import_contextlib = _nullcontext(facts)
    if skip_sync is not None:
        first, test, second = f"{model}.no_sync()", skip_sync, nullcontext
    else:
        first, test, second = nullcontext, sync, f"{model}.no_sync()"
    code = f"({first} if {test} else {second})"
    if facts.position(statements[0]).start.column + len(code) + len("with :") > _LINE_LENGTH:
        indent = facts.module.default_indent
        code = f"(\n{indent}{first}\n{indent}if {test}\n{indent}else {second}\n)"
    return WrapNoSync(statements, facts.line_of(backward.node), model, code, import_contextlib)


def _site(facts: ScriptFacts, step: TrainingStep) -> tuple[CallSite, Frame]:
    """The call whose statement runs the backward inside the accumulation loop (the backward itself, or
    the call of the helper that holds it), and that loop."""
    backward = step.backward
    loop = innermost_loop(backward.ctx)
    if loop is not None:
        return backward, loop
    fn = backward.ctx.function
    callers = [c for c in callers_of(facts, fn, how="exact", outside=True) if not facts.in_eval(c.ctx)] if fn is not None else []
    looped = [c for c in callers if innermost_loop(c.ctx) is not None]
    if len(looped) != 1:
        raise DeclineFix("the backward runs in a helper called from several places; add no_sync by hand")
    return looped[0], innermost_loop(looped[0].ctx)


def _in_indented_block(node: cst.CSTNode, block: tuple) -> bool:
    return any(item is node for item in block) and isinstance(node, cst.BaseStatement)


# -- the forward -----------------------------------------------------------------------------------------


def _forward(facts: ScriptFacts, block: tuple, index: int, ctx: Frame) -> tuple[str, int]:
    """(the DDP model's name at ``ctx``, the index of the first statement of the block, up to ``index``,
    that runs its forward: a call of the model, or of a function of this file that calls it)."""
    ddp_names = _ddp_names(facts, ctx)
    for start in range(index + 1):
        for call in _calls_in(facts, block[start]):
            model = _forward_model(facts, call, ddp_names)
            if model is not None:
                return model, start
    models = set(facts.model_names) | set(pipeline_facts(facts).trained_model_names)
    for statement in block[:index + 1]:
        for call in _calls_in(facts, statement):
            if call.name in models:
                raise DeclineFix(
                    f"the forward calls `{call.name}`, which is not bound to DistributedDataParallel here"
                )
    raise DeclineFix("the forward is not in the backward's block (they are in different functions)")


def _calls_in(facts: ScriptFacts, statement: cst.CSTNode) -> list[CallSite]:
    pos = facts.position(statement)
    return [
        c for c in facts.calls
        if pos.start.line <= facts.line_of(c.node) <= pos.end.line and contains(statement, c.node)
    ]


def _forward_model(facts: ScriptFacts, call: CallSite, ddp_names: dict[str, str], depth: int = 0) -> str | None:
    """The DDP model (its name at the call's position) that the call runs: ``model(x)``, or
    ``helper(model, x)`` / ``self._forward(x)`` whose body calls it."""
    if call.name in ddp_names:
        return ddp_names[call.name]
    if depth > 1 or not call.name:
        return None
    short = call.name.removeprefix("self.")
    if "." in short:
        return None
    for fn in facts.functions_by_name.get(short, []):
        inner_names = _ddp_names(facts, _frame_of(facts, fn))
        for inner in facts.calls_in(fn):
            found = _forward_model(facts, inner, inner_names, depth + 1)
            if found is None:
                continue
            if found in param_names(fn, stars=False):  # the helper's parameter: the caller's name for it
                found = _argument_for(fn, call.node, found, ddp_names)
            if found is not None:
                return found
    return None


def _argument_for(fn: cst.FunctionDef, call: cst.Call, param: str, ddp_names: dict[str, str]) -> str | None:
    for name in ddp_names:
        if parameter_receiving(fn, call, name) == param:
            return ddp_names[name]
    return None


def _frame_of(facts: ScriptFacts, fn: cst.FunctionDef) -> Frame:
    for call in facts.calls:
        if call.ctx.function is fn:
            return call.ctx
    for other, ctx in facts.functions:
        if other is fn:
            return ctx
    return facts.module_frame


def _ddp_names(facts: ScriptFacts, ctx: Frame, depth: int = 0) -> dict[str, str]:
    """Names that hold a DistributedDataParallel model at ``ctx``, mapped to themselves (a parameter of
    ctx's function counts when every caller passes it such a name). Declines for a model wrapped only
    on some paths: a plain module has no ``no_sync``."""
    info = distributed_facts(facts)
    fn, cls = ctx.function, ctx.class_def
    out: dict[str, str] = {}
    conditional: list[str] = []
    params = param_names(fn, stars=False) if fn is not None else []
    for wrap in info.wraps_of("ddp"):
        name, where = wrap.target, wrap.call.ctx
        if not name:
            continue
        if name.startswith("self."):
            visible = cls is not None and where.class_def is cls
        else:
            module_level = where.function is None and where.class_def is None and "." not in name
            local = fn is not None and (name in params or any(b.ctx.function is fn for b in facts.bindings_of(name)))
            visible = where.function is fn or (module_level and not local)
        if not visible:
            continue
        if flag_frames(where):
            conditional.append(name)
            continue
        out[name] = name
    if fn is not None and depth < 2:
        callers = callers_of(facts, fn, how="exact", outside=True)
        for param in params:
            if param in out or not callers:
                continue
            if all(
                any(parameter_receiving(fn, c.node, n) == param for n in _ddp_names(facts, c.ctx, depth + 1))
                for c in callers
            ):
                out[param] = param
    if not out and conditional:
        raise DeclineFix(
            f"`{conditional[0]}` is wrapped in DistributedDataParallel only on some paths; "
            "a plain module has no no_sync()"
        )
    return out


# -- the condition ----------------------------------------------------------------------------------------


def _condition(
    facts: ScriptFacts, loop: Frame, site: CallSite, statements: list[cst.CSTNode]
) -> tuple[str | None, str | None]:
    """(condition under which to skip the sync, or None; the step's own condition when it cannot be
    negated cleanly)."""
    info = distributed_facts(facts)
    guards = [guard for step_loop, guard in _conditional_steps(facts, info) if step_loop.node is loop.node]
    guards = [g for g in guards if not site.ctx.inside(g.node)]
    if guards:
        tests = {facts.code(g.node.test) for g in guards}  # type: ignore[attr-defined]
        if len(tests) != 1:
            raise DeclineFix("the optimizer steps under different conditions; add no_sync by hand")
        test = guards[0].node.test  # type: ignore[attr-defined]
        _check_stable(facts, test, loop, statements, guards[0].node)
        negated = _negate(test)
        code = facts.code(test)
        if negated is None:
            return None, code
        return facts.code(negated), code
    # A micro-step loop with one optimizer step after it: the last micro-step syncs.
    outer = loops_of(loop.parent)[:1] if loop.parent is not None else []
    node = loop.node
    if not outer or not isinstance(node, cst.For):
        raise DeclineFix("could not tell which micro-step is the last; add no_sync by hand")
    counter, last = _range_last(facts, node)
    return f"{counter} != {last}", None


def _range_last(facts: ScriptFacts, loop: cst.For) -> tuple[str, str]:
    """``for micro_step in range(n)`` → ("micro_step", "n - 1")."""
    it = loop.iter
    if not (
        isinstance(loop.target, cst.Name)
        and isinstance(it, cst.Call)
        and isinstance(it.func, cst.Name)
        and it.func.value == "range"
        and 1 <= len(it.args) <= 2
        and all(a.keyword is None and not a.star for a in it.args)
    ):
        raise DeclineFix("the micro-step loop is not `for i in range(n)`: no counter tells the last micro-step")
    stop = it.args[-1].value
    code = facts.code(stop)
    if not isinstance(stop, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)):
        code = f"({code})"
    if _assigns(loop.body, {loop.target.value}):
        raise DeclineFix(f"`{loop.target.value}` is reassigned inside the micro-step loop")
    return loop.target.value, f"{code} - 1"


def _check_stable(
    facts: ScriptFacts, test: cst.BaseExpression, loop: Frame, statements: list, guard: cst.CSTNode
) -> None:
    """The step's condition must mean the same before the forward as at the step."""
    for call in call_nodes(test):
        name = full_name(call.func)
        if name not in _PURE_CALLS:
            raise DeclineFix(
                f"the step's condition calls `{name or 'a function'}()`, which may not answer the same "
                "before the forward; add no_sync by hand"
            )
    names = {n for n in names_in(test) if n not in _PURE_CALLS}
    start = facts.position(statements[0]).start.line
    end = facts.line_of(guard)
    changed = _assigned_between(facts, loop.node, names, start, end)
    if changed:
        raise DeclineFix(
            f"`{changed}` changes between the forward and the optimizer step, so the step's condition "
            "cannot be tested before the forward"
        )


def _negate(test: cst.BaseExpression) -> cst.BaseExpression | None:
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        swapped = _NEGATED.get(type(target.operator))
        if swapped is None:
            return None
        operator = target.operator
        kwargs = {"whitespace_before": operator.whitespace_before, "whitespace_after": operator.whitespace_after}
        if swapped in (cst.IsNot, cst.NotIn):
            kwargs["whitespace_between"] = cst.SimpleWhitespace(" ")
        new_operator = swapped(**kwargs)
        return test.with_changes(comparisons=[target.with_changes(operator=new_operator)])
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        inner = test.expression
        return inner.with_changes(lpar=[], rpar=[]) if _atomic(inner) else inner
    if isinstance(test, (cst.Name, cst.Attribute)) and not test.lpar:
        return cst.UnaryOperation(operator=cst.Not(), expression=test)
    return None


def _atomic(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))


def _assigns(node: cst.CSTNode, names: set[str]) -> bool:
    return any(True for _ in _assignments(node, names))


def _assignments(node: cst.CSTNode, names: set[str]):
    """(name, target node) for every assignment to one of ``names`` under ``node``."""
    found: list[tuple[str, cst.CSTNode]] = []

    def targets(target: cst.BaseExpression):
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                yield from targets(element.value)
        elif isinstance(target, cst.StarredElement):
            yield from targets(target.value)
        else:
            dotted = full_name(target)
            if dotted in names:
                found.append((dotted, target))

    class _V(cst.CSTVisitor):
        def visit_Assign(self, n: cst.Assign) -> None:
            for t in n.targets:
                list(targets(t.target))

        def visit_AugAssign(self, n: cst.AugAssign) -> None:
            list(targets(n.target))

        def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
            list(targets(n.target))

        def visit_NamedExpr(self, n: cst.NamedExpr) -> None:
            list(targets(n.target))

        def visit_For(self, n: cst.For) -> None:
            list(targets(n.target))

        def visit_AsName(self, n: cst.AsName) -> None:
            list(targets(n.name))

    node.visit(_V())
    return found


def _assigned_between(facts: ScriptFacts, loop: cst.CSTNode, names: set[str], start: int, end: int) -> str | None:
    body = loop.body  # type: ignore[attr-defined]
    for name, target in _assignments(body, names):
        if start <= facts.line_of(target) < end:
            return name
    return None


# -- imports ----------------------------------------------------------------------------------------------


def _nullcontext(facts: ScriptFacts) -> tuple[str, bool]:
    """How to spell ``contextlib.nullcontext()`` in this file, and whether ``import contextlib`` is needed."""
    for site in facts.imports:
        if site.ctx is not facts.module_frame or site.in_import_error_fallback:
            continue
        if site.qualname == "contextlib.nullcontext":
            return f"{site.local}()", False
        if site.qualname == "contextlib":
            return f"{site.local}.nullcontext()", False
    if facts.bindings_of("contextlib") or any(site.local == "contextlib" for site in facts.imports):
        raise DeclineFix("the name `contextlib` is bound to something else in this file")
    return "contextlib.nullcontext()", True


class DdpAccumulationSyncFix(Codemod):
    rule = "TC507"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _WrapEditor()
        import_contextlib = False
        for finding in findings:
            plan: WrapNoSync = finding.fix.plan
            editor.wrap(list(plan.statements), parse_expression(plan.context, module))
            import_contextlib |= plan.import_contextlib
        new = module.visit(editor)
        if import_contextlib:
            new = add_stdlib_import(new, "contextlib")
        return new


# -- the edit ---------------------------------------------------------------------------------------------


class _WrapEditor(StatementEditor):
    """Wraps runs of statements of one block in a ``with``."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: dict[int, tuple[int, cst.BaseExpression]] = {}
        self.wrapped: set[int] = set()

    def wrap(self, statements: list[cst.CSTNode], item: cst.BaseExpression) -> None:
        self.plans[id(statements[0])] = (len(statements), item)
        self.wrapped |= {id(s) for s in statements}

    def _rebuild(self, original_body, updated_body) -> list:
        originals, updated = list(original_body), list(updated_body)
        out: list = []
        index = 0
        while index < len(originals):
            plan = self.plans.get(id(originals[index]))
            if plan is None:
                out.append(updated[index])
                index += 1
                continue
            count, item = plan
            inner = updated[index:index + count]
            leading = inner[0].leading_lines
            inner[0] = inner[0].with_changes(leading_lines=[])
            out.append(cst.With(items=[cst.WithItem(item)], body=cst.IndentedBlock(body=inner), leading_lines=leading))
            index += count
        return out
