"""TC512 compile-ddp-order: the model is compiled before it is wrapped in DistributedDataParallel.

``DDP(torch.compile(model))``, or ``model = torch.compile(model)`` / ``model.compile()`` and then
``model = DDP(model, ...)``: Dynamo compiles the bare module without knowing DDP's gradient buckets, so
its compiled backward hands every gradient to DDP only at its end and the all-reduces cannot overlap
the backward. PyTorch's DDP notes ask for the other order (wrap, then compile), where DDPOptimizer
splits the graph at the bucket boundaries.

Report only: swapping the two changes the checkpoint keys (``_orig_mod.`` and ``module.`` prefixes trade
places), which the script's save and load code must follow.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.distributed import Wrap, distributed_facts, in_test_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import exclusive

COMPILE = "torch.compile"


class CompileDdpOrder(ScriptRule):
    id = "TC512"
    triggers = (r"DistributedDataParallel",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        for wrap in info.wraps_of("ddp"):
            if in_test_code(wrap.call.ctx):
                continue
            module = wrap.call.arg("module", 0)
            if module is None:
                continue
            compiled = _compiled_before(facts, wrap, module)
            if compiled is None:
                continue
            shown = facts.module.code_for_node(compiled)
            yield self.finding(
                facts,
                wrap.call.node,
                f"the model is compiled (line {facts.line_of(compiled)}) before its DDP wrap: wrap it first, "
                "then compile",
                explanation=(
                    f"`{shown}` compiles the bare module: Dynamo makes one backward graph that hands every gradient "
                    "to DDP at its end, so DDP's all-reduces cannot overlap the backward. Compiling the DDP model "
                    "(`model = DDP(model); model = torch.compile(model)`) lets DDPOptimizer split the graph at DDP's "
                    "bucket boundaries (PyTorch's DDP notes: apply the DDP wrapper before compiling). Not fixed "
                    "automatically: the checkpoint keys' `_orig_mod.` and `module.` prefixes change with the order."
                ),
            )


def _is_compile_call(facts: ScriptFacts, node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and facts.qualname(node.func) == COMPILE


def _compiled_before(facts: ScriptFacts, wrap: Wrap, module: cst.BaseExpression) -> cst.CSTNode | None:
    """The compile that made ``module`` (the wrap's first argument) a compiled model: the argument
    itself (``DDP(torch.compile(m))``), the assignment that last bound its name before the wrap in the
    same function (``m = torch.compile(m)``), or an ``m.compile()`` between that assignment and the wrap."""
    if _is_compile_call(facts, module):
        return module
    name = get_full_name_for_node(module) if isinstance(module, (cst.Name, cst.Attribute)) else None
    if not name:
        return None
    function = wrap.call.ctx.function
    wrap_line = facts.line_of(wrap.call.node)
    earlier = [
        b for b in facts.bindings_of(name)
        if b.ctx.function is function and facts.line_of(b.value) < wrap_line and not exclusive(b.ctx, wrap.call.ctx)
    ]
    last = max(earlier, key=lambda b: facts.line_of(b.value), default=None)
    if last is not None and _is_compile_call(facts, last.value):
        return last.value
    since = facts.line_of(last.value) if last is not None else 0
    for call in facts.method_calls("compile"):
        if call.receiver_name != name or call.ctx.function is not function or facts.qualname(call.node.func) == COMPILE:
            continue
        if since < facts.line_of(call.node) < wrap_line and not exclusive(call.ctx, wrap.call.ctx):
            return call.node
    return None
