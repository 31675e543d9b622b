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
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.distributed import in_test_code
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.triggers import all_of

HOST_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
# Methods whose result is a tensor of the values: branching on it reads the value on the host.
VALUE_METHODS = frozenset({"any", "all", "item", "sum", "mean", "max", "min", "norm", "nonzero", "count_nonzero", "equal"})
# torch functions that answer about the program, not a tensor's values.
STATIC_TORCH = ("torch.is_tensor", "torch.is_grad_enabled", "torch.is_autocast_enabled", "torch.jit.",
                "torch.compiler.", "torch._dynamo.", "torch.cuda.", "torch.distributed.", "torch.backends.",
                "torch.is_floating_point", "torch.get_default_dtype", "torch.is_inference_mode_enabled")


class GraphBreakInForward(ScriptRule):
    id = "TC310"
    # The rule speaks only where the model is compiled: by the file (its text says "compile":
    # ``torch.compile`` however imported, or ``model.compile()``; ``re.compile`` is neither), or by
    # `fix --compile` when the config asks for it (then the file need not say "compile").
    triggers = (all_of(r"def forward", r"(?<!\bre\.)\bcompile\b"),)
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
            if not self._is_module(facts, cls):
                continue
            tensor_params = self._tensor_params(fn)
            for call in facts.calls_in(fn):
                what = self._host_read(facts, call)
                if what is None or self._under_flag(call, fn):
                    continue
                yield self.finding(
                    facts, call.node,
                    f"{what} in `{cls.name.value}.forward` breaks the compiled graph (a host sync)",
                    explanation="It breaks the compiled graph: the GPU syncs and Dynamo starts a new graph after "
                    f"it; keep the value on the device{note}.",
                )
            for node in _branches(fn):
                if self._reads_tensor_value(facts, node.test, tensor_params):
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

    @staticmethod
    def _is_module(facts: ScriptFacts, cls: cst.ClassDef) -> bool:
        for base in cls.bases:
            dotted = get_full_name_for_node(base.value) or ""
            qual = facts.qualname(base.value) or dotted
            if qual.endswith(("nn.Module", "nn.modules.module.Module")) or dotted in ("nn.Module", "Module"):
                return True
        return False

    @staticmethod
    def _tensor_params(fn: cst.FunctionDef) -> set[str]:
        out = set()
        for param in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params):
            annotation = param.annotation
            if annotation is not None and (get_full_name_for_node(annotation.annotation) or "").endswith("Tensor"):
                out.add(param.name.value)
        return out

    @staticmethod
    def _host_read(facts: ScriptFacts, call: CallSite) -> str | None:
        method = call.method
        if method in HOST_METHODS and not any(a.keyword is None for a in call.node.args):
            receiver = call.receiver
            if (call.receiver_name or "").startswith("self.") and method == "cpu":
                return None  # moving a submodule
            if method == "numpy" and isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) \
                    and receiver.func.attr.value == "cpu":
                return None  # the .cpu() before it is the reported read
            text = " ".join(facts.module.code_for_node(receiver).split()) if receiver is not None else ""
            short = text if len(text) <= 40 else text[:37] + "…"
            return f"`{short}.{method}()`"
        if call.name == "print" and not call.method and any(
            not isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString)) for a in call.node.args
        ):
            return "`print(...)` of a value"
        return None

    @staticmethod
    def _under_flag(call: CallSite, fn: cst.FunctionDef) -> bool:
        """Under ``if self.debug:`` or ``if not torch.compiler.is_compiling():``: Dynamo traces the
        branch only when the flag is on, so the default compiled path has no break."""
        for frame in call.ctx.chain():
            if frame.node is fn:
                return False
            if frame.kind in ("if", "else"):
                test = frame.node.test  # type: ignore[attr-defined]
                while isinstance(test, cst.UnaryOperation):
                    test = test.expression
                if isinstance(test, (cst.Name, cst.Attribute)) or "is_compiling" in cst.Module([]).code_for_node(test):
                    return True
        return False

    @staticmethod
    def _reads_tensor_value(facts: ScriptFacts, test: cst.BaseExpression, tensor_params: set[str]) -> bool:
        found = False

        class _Reads(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                nonlocal found
                func = node.func
                if isinstance(func, cst.Attribute) and func.attr.value in VALUE_METHODS:
                    receiver = get_full_name_for_node(func.value) or ""
                    if not receiver.startswith("self.") and not receiver.endswith("shape"):
                        found = True
                qual = facts.qualname(func) or ""
                if qual.startswith("torch.") and not qual.startswith(STATIC_TORCH):
                    found = True

            def visit_Comparison(self, node: cst.Comparison) -> None:
                nonlocal found
                sides = [node.left, *(c.comparator for c in node.comparisons)]
                operators_compare_values = not any(
                    isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons
                )
                if operators_compare_values and any(isinstance(s, cst.Name) and s.value in tensor_params for s in sides):
                    found = True

        test.visit(_Reads())
        return found


def _branches(fn: cst.FunctionDef) -> list[cst.If | cst.While]:
    """The ``if``/``while`` statements of ``fn`` itself (not of functions defined inside it)."""
    out: list[cst.If | cst.While] = []

    class _Branches(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            out.append(node)

        def visit_While(self, node: cst.While) -> None:
            out.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

    fn.visit(_Branches())
    return out
