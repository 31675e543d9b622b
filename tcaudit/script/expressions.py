"""Values read out of syntax, shared by the facts modules: literals, the ``return`` values of a
function, the names a call's statement assigns, an argparse option's dest, and whether an expression
names a device (``.to(device)`` moves a tensor, ``.to(torch.float16)`` does not). A call's argument by
keyword or position is :func:`tcaudit.source.syntax.keyword` (``CallSite.arg`` for a call site)."""

from __future__ import annotations

import re

import libcst as cst

from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import evaluated_value, full_name, keyword
from tcaudit.source.memo import remembered
from tcaudit.source.walk import walk

# Calls that load weights into a model (a checkpoint, pretrained weights), by dotted name.
CHECKPOINT_LOAD = re.compile(r"(^|\.)(from_pretrained|load_state_dict|load_checkpoint)$")
# Calls that only report a value (print, logging, tensorboard, str.format), by dotted name.
REPORTING_CALL = re.compile(r"(^|\.)(print|info|debug|warning|log|add_scalar|write|format)$")
_DEVICE_NAME = re.compile(r"(device|^dev$|^gpu$|_gpu$|^gpu_|local_rank|^rank$|gpu_id|^cuda)", re.IGNORECASE)


def literal(expr: cst.BaseExpression | None) -> object:
    """The value of a literal expression (True/False/None, numbers, strings); ``...`` otherwise."""
    if expr is None:
        return ...
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, cst.Integer):
        return int(expr.value.replace("_", ""), 0)
    if isinstance(expr, cst.Float):
        return float(expr.value.replace("_", ""))
    if isinstance(expr, cst.SimpleString):
        return evaluated_value(expr)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        inner = literal(expr.expression)
        return -inner if isinstance(inner, (int, float)) else ...
    return ...


def numeric_constant(facts: ScriptFacts, expr: cst.BaseExpression | None, depth: int = 0) -> int | float | None:
    """The value of a numeric expression of literals and module constants (``4 * DIM``, ``-1e9``,
    ``NEG_INF``), if it has one."""
    if expr is None or depth > 5:
        return None
    value = literal(expr)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        inner = numeric_constant(facts, expr.expression, depth + 1)
        return -inner if inner is not None else None
    if isinstance(expr, cst.Name):
        bindings = facts.bindings_of(expr.value)
        if len(bindings) == 1 and bindings[0].ctx.function is None and bindings[0].ctx.class_def is None:
            return numeric_constant(facts, bindings[0].value, depth + 1)
        return None
    if isinstance(expr, cst.BinaryOperation):
        left = numeric_constant(facts, expr.left, depth + 1)
        right = numeric_constant(facts, expr.right, depth + 1)
        if left is None or right is None:
            return None
        operator = type(expr.operator)
        try:
            if operator is cst.Multiply:
                return left * right
            if operator is cst.Add:
                return left + right
            if operator is cst.Subtract:
                return left - right
            if operator is cst.FloorDivide and right:
                return left // right
            if operator is cst.Divide and right:
                return left / right
            if operator is cst.Power and abs(right) <= 64:
                return left ** right
        except (OverflowError, TypeError, ZeroDivisionError):
            return None
    return None


def attribute_chain(expr: cst.BaseExpression) -> str | None:
    """``model`` or ``self.model.fc``: the dotted name of a chain of names and attributes only, never of
    a call or subscript on one (``get_full_name_for_node`` gives ``model`` for ``model(x)[1]``)."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        inner = attribute_chain(expr.value)
        return f"{inner}.{expr.attr.value}" if inner is not None else None
    return None


def flag_dest(call: cst.Call) -> str | None:
    """The attribute an ``add_argument(...)`` call sets: ``dest=``, else the first long option
    (``"-a", "--arch"`` → ``arch``, ``--vocab-size`` → ``vocab_size``), else the positional name."""
    named = keyword(call, "dest")
    if named is not None:
        value = literal(named.value)
        return value if isinstance(value, str) else None
    options = [o for o in (literal(a.value) for a in call.args if a.keyword is None and not a.star) if isinstance(o, str)]
    longs = [o for o in options if o.startswith("--")]
    plain = [o for o in options if not o.startswith("-")]
    first = (longs or plain or options or [None])[0]
    return first.lstrip("-").replace("-", "_") if first else None


def function_returns(fn: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The values ``fn``'s own ``return`` statements give (not those of functions defined inside it)."""
    return list(remembered(fn, "returns", lambda: _returns(fn)))


def _returns(fn: cst.FunctionDef) -> list[cst.BaseExpression]:
    returns = _Returns(fn)
    walk(fn, returns)
    return returns.out


class _Returns(cst.CSTVisitor):
    def __init__(self, fn: cst.FunctionDef) -> None:
        super().__init__()
        self.fn = fn
        self.out: list[cst.BaseExpression] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.fn

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.out.append(node.value)


def _small_statements(call: CallSite) -> list[cst.CSTNode]:
    statement = call.statement.node if call.statement else None
    if isinstance(statement, cst.SimpleStatementLine):
        return list(statement.body)
    return [statement] if statement is not None else []


def assigned_name(call: CallSite) -> str | None:
    for small in _small_statements(call):
        if isinstance(small, cst.Assign) and small.value is call.node and len(small.targets) == 1:
            return full_name(small.targets[0].target)
        if isinstance(small, cst.AnnAssign) and small.value is call.node:
            return full_name(small.target)
    return None


def assigned_targets(call: CallSite) -> list[cst.BaseExpression]:
    for small in _small_statements(call):
        if isinstance(small, cst.Assign) and small.value is call.node:
            return [t.target for t in small.targets]
    return []


def is_device_expr(expr: cst.BaseExpression) -> bool:
    """Whether an argument of ``.to(...)`` names a device (not a dtype or another tensor)."""
    value = literal(expr)
    if isinstance(value, str):
        return value.split(":")[0] in ("cuda", "mps", "xpu")
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    if isinstance(expr, cst.Call):
        dotted = full_name(expr.func) or ""
        return dotted.endswith("device") or dotted.endswith("current_device")
    if isinstance(expr, cst.Subscript):
        return is_device_expr(expr.value)
    dotted = full_name(expr)
    return bool(dotted) and bool(_DEVICE_NAME.search(dotted.split(".")[-1]))


def moves_to_device(call: CallSite) -> bool:
    """``x.cuda(...)`` or ``x.to(<device>, ...)`` / ``x.to(device=...)``."""
    if call.method == "cuda":
        return True
    if call.method != "to":
        return False
    if call.arg("device") is not None:
        return True
    first = call.arg("", 0)
    return first is not None and is_device_expr(first)


# Factories that take ``device=``. ``torch.from_numpy`` does not; ``torch.Tensor(...)`` is legacy.
DEVICE_FACTORIES = frozenset(
    f"torch.{name}"
    for name in (
        "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
        "logspace", "eye", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like", "randint_like", "tril_indices", "triu_indices",
    )
)


def unparen(node: cst.BaseExpression) -> cst.BaseExpression:
    """The expression without its own parentheses (a tuple keeps them: ``()`` needs them)."""
    if not getattr(node, "lpar", None) or isinstance(node, cst.Tuple):
        return node
    return node.with_changes(lpar=[], rpar=[])


def is_integer(node: cst.CSTNode | None, value: str) -> bool:
    """Whether ``node`` is the integer literal ``value`` (as written: ``"0"``, ``"1"``)."""
    return isinstance(node, cst.Integer) and node.value == value

