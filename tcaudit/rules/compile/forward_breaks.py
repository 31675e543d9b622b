"""What in a module's ``forward`` stops a compiled graph: host reads (``.item()``, ``.cpu()``,
``print(tensor)``) and Python branches on a tensor's value. TC310 reports them where the script
compiles; TC305's fix reads them before it chooses CUDA graphs (a host read inside a graph cannot be
captured)."""

from __future__ import annotations

import libcst as cst

from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import full_name

HOST_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
# Methods whose result is a tensor of the values: branching on it reads the value on the host.
VALUE_METHODS = frozenset({"any", "all", "item", "sum", "mean", "max", "min", "norm", "nonzero", "count_nonzero", "equal"})
# torch functions that answer about the program, not a tensor's values.
STATIC_TORCH = ("torch.is_tensor", "torch.is_grad_enabled", "torch.is_autocast_enabled", "torch.jit.",
                "torch.compiler.", "torch._dynamo.", "torch.cuda.", "torch.distributed.", "torch.backends.",
                "torch.is_floating_point", "torch.get_default_dtype", "torch.is_inference_mode_enabled")


def is_module_class(facts: ScriptFacts, cls: cst.ClassDef) -> bool:
    for base in cls.bases:
        dotted = full_name(base.value) or ""
        qual = facts.qualname(base.value) or dotted
        if qual.endswith(("nn.Module", "nn.modules.module.Module")) or dotted in ("nn.Module", "Module"):
            return True
    return False


def tensor_params(fn: cst.FunctionDef) -> set[str]:
    out = set()
    for param in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params):
        annotation = param.annotation
        if annotation is not None and (full_name(annotation.annotation) or "").endswith("Tensor"):
            out.add(param.name.value)
    return out


def host_read(facts: ScriptFacts, call: CallSite) -> str | None:
    method = call.method
    if method in HOST_METHODS and not any(a.keyword is None for a in call.node.args):
        receiver = call.receiver
        if (call.receiver_name or "").startswith("self.") and method == "cpu":
            return None  # moving a submodule
        if method == "numpy" and isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) \
                and receiver.func.attr.value == "cpu":
            return None  # the .cpu() before it is the reported read
        text = " ".join(facts.code(receiver).split()) if receiver is not None else ""
        short = text if len(text) <= 40 else text[:37] + "…"
        return f"`{short}.{method}()`"
    if call.name == "print" and not call.method and any(
        not isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString)) for a in call.node.args
    ):
        return "`print(...)` of a value"
    return None


def under_flag(call: CallSite, fn: cst.FunctionDef) -> bool:
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


def reads_tensor_value(facts: ScriptFacts, test: cst.BaseExpression, tensor_params: set[str]) -> bool:
    found = False

    class _Reads(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in VALUE_METHODS:
                receiver = full_name(func.value) or ""
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


def branches(fn: cst.FunctionDef) -> list[cst.If | cst.While]:
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
