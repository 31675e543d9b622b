"""Who calls a function of the script, and under which parameter name a caller's value arrives: how
a rule follows a name (a sampler, a DDP model) from a function to the calls of it (TC504, TC507).

Two other questions about callers have their own answers, which differ on purpose:
:meth:`tcaudit.script.facts.ScriptFacts.callers` takes every call by the function's name (any
receiver, and the instances of a class for ``__call__``), and
:meth:`tcaudit.script.training_code.TrainingCodeFacts.direct_callers` takes ``name``, ``self.name``
and ``cls.name`` alike. :func:`direct_callers` here takes only the spelling that calls this very
function: ``self.name`` for a method, ``name`` otherwise, never from inside it.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.script.facts import CallSite, ScriptFacts


def direct_callers(facts: ScriptFacts, fn: cst.FunctionDef) -> list[CallSite]:
    """Calls of ``fn`` from outside it: ``fn(...)`` for a function, ``self.fn(...)`` for a method (never
    ``model.train()`` for a ``def train``)."""
    method = any(other is fn and ctx.kind == "class" for other, ctx in facts.functions)
    wanted = f"self.{fn.name.value}" if method else fn.name.value
    return [c for c in facts.calls if c.name == wanted and not c.ctx.inside(fn)]


def parameter_receiving(fn: cst.FunctionDef, call: cst.Call, dotted: str) -> str | None:
    """The parameter of ``fn`` that ``call`` passes ``dotted`` to (positionally or by keyword)."""
    params = [x.name.value for x in (*fn.params.posonly_params, *fn.params.params)]
    if params and params[0] in ("self", "cls") and isinstance(call.func, cst.Attribute):
        params = params[1:]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for index, arg in enumerate(positional):
        if get_full_name_for_node(arg.value) == dotted and index < len(params):
            return params[index]
    for arg in call.args:
        if arg.keyword is not None and get_full_name_for_node(arg.value) == dotted:
            return arg.keyword.value
    return None
