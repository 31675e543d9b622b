"""Whether a place in a training script runs on every training step, or only now and then.

Walk out from a call through its frames: an ``if`` on an interval (``step % 100 == 0``, ``i == 0``, a
time check), an opt-in switch (``if args.debug:``, ``if self.verbose:``) or an ``except`` means "not
every step", a step loop means "every step", and a function is followed to its callers (not through
eval functions) a couple of levels up. TC601, TC605 and TC212 ask it.

Also which optimizer step a gradient clip runs after (:func:`clipped_after_step`, TC213 and TC205).
"""

from __future__ import annotations

import re

import libcst as cst

from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import distributed_facts, has_modulo, literal_value
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.guards import exclusive
from tcaudit.source.syntax import full_name, names_in, nodes_of

_TIME_CALL = re.compile(r"\btime\b|perf_counter|monotonic")
MAX_CALL_DEPTH = 2


def comparisons(test: cst.BaseExpression) -> list[cst.Comparison]:
    return nodes_of(test, cst.Comparison)


def is_interval_guard(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    """``i % log_interval == 0``, ``it % eval_interval == 0 and master_process``, ``log_now`` bound to
    a modulo, ``i == 0``, ``i == len(loader) - 1``, a time-based ``time.time() - t0 > 10``."""
    if has_modulo(test):
        return True
    for name in names_in(test):
        if _TIME_CALL.search(name):
            return True
        if any(has_modulo(binding.value) for binding in facts.bindings_of(name)):
            return True
    for node in comparisons(test):
        for target in node.comparisons:
            if isinstance(target.operator, cst.Equal):
                sides = (node.left, target.comparator)
                if any(isinstance(s, cst.Integer) for s in sides) or any(
                    "len(" in facts.code(s) for s in sides
                ):
                    return True
    return False


OPT_IN_WORDS = re.compile(r"debug|verbose|dry_?run|profil|trace|sanity|detect_anomaly|log_every_step|print_every_step", re.IGNORECASE)


def flag_operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The plain names and attributes an ``if`` test ands together (``a and b.c`` → ``a``, ``b.c``)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return flag_operands(test.left) + flag_operands(test.right)
    if isinstance(test, (cst.Name, cst.Attribute)):
        return [test]
    return []


def argparse_option(facts: ScriptFacts, dest: str) -> bool | None:
    """For ``args.<dest>``: True when its ``add_argument`` is ``store_true`` or defaults to False/0/None,
    False when it defaults to something true, None when no such option is in the file."""
    for call in facts.method_calls("add_argument"):
        flags = [literal_value(a.value) for a in call.node.args if a.keyword is None]
        names = [f.lstrip("-").replace("-", "_") for f in flags if isinstance(f, str)]
        explicit = call.arg("dest")
        if literal_value(explicit) != dest and dest not in names:
            continue
        action = literal_value(call.arg("action"))
        if action == "store_true":
            return True
        default = call.arg("default")
        if default is None:
            return action not in ("store_false",)
        return literal_value(default) in (False, None, 0) and literal_value(default) is not ...
    return None


def parameter_default(facts: ScriptFacts, name: str | None) -> cst.BaseExpression | None:
    """The default of a parameter ``name`` of a function of this file (``def __init__(self, verbose=False)``)."""
    if not name:
        return None
    for fn, _ in facts.functions:
        for param in (*fn.params.params, *fn.params.kwonly_params):
            if param.name.value == name and param.default is not None:
                return param.default
    return None


def is_opt_in_flag(facts: ScriptFacts, test: cst.BaseExpression) -> bool:
    """``if args.debug:``, ``if self.verbose:``, ``if verbose and step > 0:``: a switch that is off
    unless the user turns it on (an argparse ``store_true``, a ``False``/``0``/``None`` default,
    a parameter defaulting to one). ``if master_process:`` (true on rank 0 every step) is not."""
    for flag in flag_operands(test):
        dotted = full_name(flag)
        if dotted and _off_by_default(facts, dotted):
            return True
    return False

def _off_by_default(facts: ScriptFacts, dotted: str) -> bool:
    last = dotted.split(".")[-1]
    values = [b.value for b in facts.bindings_of(dotted)]
    if "." in dotted and not dotted.startswith("self."):
        # ``args.debug``: the option that defines it, as ``store_true`` or with a falsy default.
        option = argparse_option(facts, last)
        if option is not None:
            return option
        return not values and bool(OPT_IN_WORDS.search(last))
    if dotted.startswith("self."):
        values = values or []
        resolved = []
        for value in values:
            name = full_name(value) if isinstance(value, cst.Name) else None
            default = parameter_default(facts, name) if name else None
            resolved.append(default if default is not None else value)
        values = resolved
    else:
        default = parameter_default(facts, dotted)
        if default is not None:
            values = values + [default]
    if values:
        return all(literal_value(v) in (False, None, 0) and literal_value(v) is not ... for v in values)
    return bool(OPT_IN_WORDS.search(last))


def runs_every_step(facts: ScriptFacts, ctx: Frame, depth: int = MAX_CALL_DEPTH) -> bool:
    """True when code at ``ctx`` runs once per training step: inside a step loop (or a function
    called from one), under no interval guard, ``except`` handler or eval function."""
    info = distributed_facts(facts)
    for frame in ctx.chain():
        kind = frame.kind
        if kind == "if" and is_interval_guard(facts, frame.node.test):  # type: ignore[attr-defined]
            return False
        if kind == "if" and is_opt_in_flag(facts, frame.node.test):  # type: ignore[attr-defined]
            return False  # ``if args.debug:``: off unless the user asks
        if kind == "except":
            return False
        if kind == "loop":
            if id(frame.node) in info.env_step_loops:
                return False  # RL interaction: the loop steps an environment, not an optimizer
            if info.is_step_loop(frame):
                return True
        if kind == "def":
            fn = frame.node
            assert isinstance(fn, cst.FunctionDef)
            if facts.function_is_eval(fn) or depth <= 0:
                return False
            callers = callers_of(facts, fn, outside=True)
            return any(runs_every_step(facts, c.ctx, depth - 1) for c in callers)
        if kind in ("class", "lambda"):
            return False
    return False


def clipped_after_step(facts: ScriptFacts, clip: CallSite) -> CallSite | None:
    """The optimizer step that runs before ``clip`` on its path, after a backward and with no backward
    between them (the clip then clips gradients the step already used), or None."""
    function = clip.ctx.function
    line = facts.line_of(clip.node)

    def before_on_path(call: CallSite) -> bool:
        return call.ctx.function is function and facts.line_of(call.node) < line and not exclusive(call.ctx, clip.ctx)

    backwards = [facts.line_of(s.backward.node) for s in facts.training_steps if before_on_path(s.backward)]
    steps = [c for c in facts.optimizer_steps if before_on_path(c)]
    for step in sorted(steps, key=lambda c: facts.line_of(c.node), reverse=True):
        step_line = facts.line_of(step.node)
        if any(b < step_line for b in backwards) and not any(step_line < b for b in backwards):
            return step
    return None
