"""Attention's masks and modules, as the attention rules read them (TC308, TC314).

:func:`causal_construction` recognises the T x T top-left causal mask built from a shape's T, in the
forms training scripts write it; :func:`mha_bindings` finds the names bound to
``nn.MultiheadAttention`` modules.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.script.expressions import is_integer, unparen
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import keyword

MHA = {"torch.nn.MultiheadAttention", "torch.nn.modules.activation.MultiheadAttention"}
SUBSEQUENT_MASK = {"torch.nn.Transformer.generate_square_subsequent_mask",
                   "torch.nn.modules.transformer.Transformer.generate_square_subsequent_mask",
                   "torch.nn.modules.transformer._generate_square_subsequent_mask"}


def negative_infinity(node: cst.BaseExpression) -> bool:
    text = cst.Module([]).code_for_node(node).replace(" ", "").replace('"', "'")
    return text in {"float('-inf')", "-float('inf')", "-math.inf", "-torch.inf", "float('-Infinity')", "-np.inf"}


_MASK_KEYWORDS = {"device", "dtype"}


def _strip_conversions(node: cst.BaseExpression) -> cst.BaseExpression:
    """``x.bool()``, ``x.to(device)``, ``x.float()``, ``x.type_as(y)`` → ``x`` (values and shape kept)."""
    node = unparen(node)
    while (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
           and node.func.attr.value in {"bool", "to", "float", "half", "bfloat16", "type_as", "cuda"}
           and (node.func.attr.value in {"to", "type_as", "cuda"} or not node.args)):
        node = unparen(node.func.value)
    return node


def _square(facts: ScriptFacts, function: cst.FunctionDef, dims: Sequence[cst.BaseExpression]) -> bool:
    """Two identical sizes, each the sequence length read from a tensor's shape: a name unpacked or
    assigned from ``x.size()``/``x.shape`` in the function, or ``x.size(i)``/``x.shape[i]`` itself."""
    if len(dims) != 2:
        return False
    code = facts.module.code_for_node
    first, second = (unparen(d) for d in dims)
    if code(first) != code(second):
        return False
    if isinstance(first, cst.Name):
        return first.value in _shape_names(facts, function)
    return _reads_shape(first)


def _reads_shape(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        return len(node.args) == 1
    return isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape"


def _shape_names(facts: ScriptFacts, function: cst.FunctionDef) -> set[str]:
    """The names the function assigns from a tensor's shape: ``B, T, C = x.size()``, ``T = x.shape[1]``."""
    names: set[str] = set()

    class Visitor(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            value = unparen(node.value)
            whole = (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                     and value.func.attr.value == "size" and not value.args) or (
                isinstance(value, cst.Attribute) and value.attr.value == "shape")
            for target in node.targets:
                if whole and isinstance(target.target, (cst.Tuple, cst.List)):
                    names.update(e.value.value for e in target.target.elements if isinstance(e.value, cst.Name))
                elif _reads_shape(value) and isinstance(target.target, cst.Name):
                    names.add(target.target.value)

    function.body.visit(Visitor())
    return names


def causal_construction(facts: ScriptFacts, function: cst.FunctionDef, value: cst.BaseExpression) -> str | None:
    """``kept`` for ``torch.tril(torch.ones(T, T))`` (ones where attention is allowed), ``filled`` for
    ``torch.triu(torch.ones(T, T), diagonal=1)`` (ones where it is not), ``additive`` for
    ``torch.triu(torch.full((T, T), -inf), diagonal=1)`` and
    ``nn.Transformer.generate_square_subsequent_mask(T)``; None for anything else."""
    node = _strip_conversions(value)
    if not isinstance(node, cst.Call) or not node.args:
        return None
    function_name = facts.qualname(node.func)
    if function_name in SUBSEQUENT_MASK:  # -inf above the diagonal, 0 elsewhere (float)
        size = [a.value for a in node.args if a.keyword is None and not a.star]
        keywords = {a.keyword.value for a in node.args if a.keyword is not None}
        return "additive" if len(size) == 1 and keywords <= _MASK_KEYWORDS and _square(
            facts, function, [size[0], size[0]]) else None
    given = keyword(node, "diagonal", 1)
    diagonal = given.value if given is not None else None
    inner = _strip_conversions(node.args[0].value)
    if not isinstance(inner, cst.Call) or any(a.keyword is not None and a.keyword.value != "diagonal"
                                               for a in node.args):
        return None
    factory = facts.qualname(inner.func)
    positional = [a.value for a in inner.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in inner.args if a.keyword is not None}
    if factory == "torch.ones" and keywords <= _MASK_KEYWORDS and _square(facts, function, positional):
        if function_name == "torch.tril" and (diagonal is None or is_integer(diagonal, "0")):
            return "kept"
        if function_name == "torch.triu" and is_integer(diagonal, "1"):
            return "filled"
    if (factory == "torch.full" and len(positional) == 2 and keywords <= _MASK_KEYWORDS
            and isinstance(shape := unparen(positional[0]), (cst.Tuple, cst.List))
            and negative_infinity(positional[1]) and function_name == "torch.triu" and is_integer(diagonal, "1")
            and _square(facts, function, [e.value for e in shape.elements])):
        return "additive"
    return None






def mha_bindings(facts: ScriptFacts) -> dict[cst.ClassDef | None, set[str]]:
    """Per class (None: module level and plain functions), the names bound to an MHA module."""
    bound: dict[cst.ClassDef | None, set[str]] = {}
    for call in facts.calls:
        if call.qualname not in MHA or call.statement is None:
            continue
        statement = call.statement.node
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else statement
        if not isinstance(small, (cst.Assign, cst.AnnAssign)) or small.value is not call.node:
            continue
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for target in targets:
            if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
                bound.setdefault(call.ctx.class_def, set()).add(f"self.{target.attr.value}")
            elif isinstance(target, cst.Name):
                bound.setdefault(None, set()).add(target.value)
    return bound
