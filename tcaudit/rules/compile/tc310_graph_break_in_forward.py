"""TC310 graph-break-in-forward: host reads and data-dependent branches in the ``forward`` of a
module that the script compiles.

``torch.compile`` traces ``forward`` into graphs; ``.item()``, ``.tolist()``, ``.cpu()``,
``print(tensor)`` and a Python ``if``/``while`` on a tensor's value cannot be traced, so Dynamo ends
the graph there, runs the statement eagerly (syncing with the GPU), and starts a new graph after it.
Each break costs a sync, a guard check and lost fusion across it; a few in the hot path make the
compiled model slower than eager. No automatic fix: what replaces the host value (``torch.where``,
a mask, a flag decided outside ``forward``) is the model author's decision.
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.rules.compile.forward_breaks import (
    branches,
    host_read,
    is_module_class,
    reads_tensor_value,
    tensor_params,
    under_flag,
)
from tcaudit.script.distributed import in_test_code
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.triggers import all_of


class GraphBreakInForward(ScriptRule):
    id = "TC310"
    # The rule speaks only where the model is compiled: by the file (its text says "compile":
    # ``torch.compile`` however imported, or ``model.compile()``; ``re.compile`` is neither), or by
    # `fix --compile` when the config asks for it (then the file need not say "compile").
    triggers = (all_of(r"def forward", r"compile(?<!\wcompile)(?<!\bre\.compile)\b"),)
    structural_triggers = {"compile": (r"def forward",)}

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        compiles = any(self._is_compile(call) for call in facts.calls)
        will_compile = "compile" in context.settings.structural_fixes
        if not (compiles or will_compile):
            return
        note = "" if compiles else " (`tcaudit fix --compile` would compile this model)"
        for fn, ctx in facts.functions:
            cls = ctx.class_def
            if fn.name.value != "forward" or ctx.kind != "class" or cls is None or in_test_code(ctx):
                continue
            if not is_module_class(facts, cls):
                continue
            tensors = tensor_params(fn)
            for call in facts.calls_in(fn):
                what = host_read(facts, call)
                if what is None or under_flag(call, fn):
                    continue
                yield self.finding(
                    facts, call.node,
                    f"{what} in `{cls.name.value}.forward` breaks the compiled graph (a host sync)",
                    explanation="It breaks the compiled graph: the GPU syncs and Dynamo starts a new graph after "
                    f"it; keep the value on the device{note}.",
                )
            for node in branches(fn):
                if reads_tensor_value(facts, node.test, tensors):
                    keyword = "if" if isinstance(node, cst.If) else "while"
                    yield self.finding(
                        facts, node.test,
                        f"`{keyword}` on a tensor's value in `{cls.name.value}.forward` breaks the compiled graph",
                        explanation="Data-dependent control flow breaks the compiled graph; use `torch.where` or "
                        f"decide outside forward{note}.",
                    )

    @staticmethod
    def _is_compile(call: CallSite) -> bool:
        return call.qualname == "torch.compile" or (
            call.method == "compile" and call.qualname is None and call.receiver_name is not None and not call.node.args
        )
