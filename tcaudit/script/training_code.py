"""Facts about a script's training code, the base of the pipeline facts (tcaudit/script/pipeline.py).

* **Is this CUDA training the user owns?** A training step in the file, CUDA text, no framework
  that owns the loop; whether the steps run under autocast.
* **Which code reaches a training step:** the functions holding one, and the functions calling them
  (:mod:`tcaudit.script.callers`).
* **Deliberate settings.** Code under an ``if``/``else`` (other than the main guard), or in a helper
  only called under one, is the user's choice behind a flag.
"""

from __future__ import annotations

import functools

import libcst as cst

from tcaudit.script.callers import callers_of, calling_functions
from tcaudit.script.expressions import literal
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.source.syntax import is_main_guard, keyword


def flag_frames(ctx: Frame) -> list[Frame]:
    """The ``if``/``else``/``except`` frames around ``ctx``, the main guard excepted."""
    return [f for f in ctx.chain() if f.kind in ("if", "else", "except") and not is_main_guard(f.node)]


class TrainingCodeFacts:
    """The first layer of :class:`tcaudit.script.pipeline.PipelineFacts`: the script's training code."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts

    # -- the script --------------------------------------------------------------------------------
    @functools.cached_property
    def uses_cuda(self) -> bool:
        """CUDA-specific advice (TF32, cuDNN, pinned memory, fused optimizers) needs a script that may
        run on CUDA (``ScriptFacts.uses_cuda``: ``device = 0`` and a device parameter count): an MPS- or
        CPU-only script gets none."""
        return self.facts.uses_cuda

    @functools.cached_property
    def framework_owned(self) -> bool:
        return bool(self.facts.frameworks)

    @functools.cached_property
    def trains(self) -> bool:
        """A training loop in this file, or a framework that runs one for the code in it."""
        facts = self.facts
        return bool(facts.training_steps) or bool(facts.optimizer_steps) or self.framework_owned

    @functools.cached_property
    def owns_cuda_training(self) -> bool:
        """The TC3 precondition: the user's own loop trains on CUDA (no framework owning it)."""
        return bool(self.facts.training_steps) and self.uses_cuda and not self.framework_owned

    @functools.cached_property
    def main_guard(self) -> cst.If | None:
        for statement in self.facts.module.body:
            if is_main_guard(statement):
                return statement  # type: ignore[return-value]
        return None

    def is_flag_guarded(self, ctx: Frame, depth: int = 2) -> bool:
        """Whether code at ``ctx`` runs only behind a condition: an ``if`` around it, or every call of
        its function sits behind one. A function called nowhere in the file is an entry point."""
        if flag_frames(ctx):
            return True
        fn = ctx.function
        if fn is None or depth == 0:
            return False
        callers = callers_of(self.facts, fn, how="self", outside=True)
        if not callers:
            return False
        return all(self.is_flag_guarded(c.ctx, depth - 1) for c in callers)

    # -- training code -----------------------------------------------------------------------------
    @functools.cached_property
    def step_functions(self) -> set[cst.FunctionDef | None]:
        facts = self.facts
        out: set[cst.FunctionDef | None] = {s.function for s in facts.training_steps}
        out |= {c.ctx.function for c in facts.optimizer_steps}
        return out

    @functools.cached_property
    def functions_reaching_step(self) -> set[cst.FunctionDef]:
        """Functions that hold a training step or call (by name, ``self.name``) one that does."""
        out: set[cst.FunctionDef] = {fn for fn in self.step_functions if fn is not None}
        frontier = list(out)
        while frontier:
            fn = frontier.pop()
            for caller in calling_functions(self.facts, fn):
                if caller not in out:
                    out.add(caller)
                    frontier.append(caller)
        return out

    @functools.cached_property
    def methods_by_name(self) -> dict[str, list[cst.FunctionDef]]:
        table: dict[str, list[cst.FunctionDef]] = {}
        for fn, ctx in self.facts.functions:
            if ctx.kind == "class":
                table.setdefault(fn.name.value, []).append(fn)
        return table

    def called_functions(self, call: CallSite) -> list[cst.FunctionDef]:
        """The functions of this file a call may run: ``f(...)``, ``self.f(...)``, and
        ``obj.method(...)`` for a method defined in one of this file's classes."""
        name = call.name or ""
        short = name[5:] if name.startswith("self.") else name
        if not short:
            return []
        if "." in short:
            return self.methods_by_name.get(short.split(".")[-1], []) if call.method else []
        return self.facts.functions_by_name.get(short, [])

    def body_trains(self, node: cst.CSTNode) -> bool:
        """Whether a loop or ``with`` body holds a training step, directly or through a call."""
        facts = self.facts
        if any(step.ctx.inside(node) for step in facts.training_steps):
            return True
        if any(call.ctx.inside(node) for call in facts.optimizer_steps):
            return True
        for call in facts.calls_within(node):
            if any(fn in self.functions_reaching_step for fn in self.called_functions(call)):
                return True
        return False

    @functools.cached_property
    def trains_under_autocast(self) -> bool:
        """Whether the training forward runs under autocast somewhere (also behind an ``if args.amp``
        flag): an autocast block or decorator outside eval code that is not ``enabled=False`` or
        CPU-only, or a training step inside one."""
        facts = self.facts
        if any(facts.in_autocast(step.ctx) for step in facts.training_steps):
            return True
        for node, ctx in facts.autocast_withs:
            if facts.in_eval(ctx) or "eval" in facts.with_kinds(node):
                continue
            if all(self._disabled_autocast(item.item) for item in node.items if facts.is_autocast_expr(item.item)):
                continue
            return True
        for fn, ctx in facts.functions:
            if facts.function_has_autocast_decorator(fn) and not facts.in_eval(ctx) and not facts.function_is_eval(fn):
                return True
        return False

    def _disabled_autocast(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Call):
            return False
        enabled = keyword(expr, "enabled")
        if enabled is not None and literal(enabled.value) is False:
            return True
        device = keyword(expr, "device_type")
        first = device.value if device is not None else (expr.args[0].value if expr.args and expr.args[0].keyword is None else None)
        return literal(first) == "cpu" or (self.facts.qualname(expr.func) or "").startswith("torch.cpu.")
