"""TC308 manual-attention: attention written out as ``softmax(q @ k^T * scale [+ mask]) @ v``.

The hand-written form materialises the T x T score matrix in memory and runs three or four kernels
where ``F.scaled_dot_product_attention`` runs one fused (flash or memory-efficient) kernel.

Fix (numerics): the chain of statements becomes one ``F.scaled_dot_product_attention`` call with the
same semantics: the scale kept as written (``scale=``), a ``masked_fill(cond, -inf)`` mask as the
boolean ``attn_mask`` of the positions kept, a causal ``tril`` buffer sliced ``[:T, :T]`` as
``is_causal=True`` (so is a T x T causal mask built in the function from a shape's T, whose statement
goes too: the flash kernel needs ``is_causal`` and no mask tensor), an additive mask as a float ``attn_mask``, and dropout only in training. Declined
where the attention weights are used for anything else (returned, stored, logged), where the mask
fills a finite value (fully masked rows would differ), or where dropout is not tied to ``training``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import libcst as cst  # plain isinstance tests, not libcst.matchers: importing those costs ~0.25 s per worker

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_expression, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.compile.attention import causal_construction, negative_infinity
from tcaudit.script.expressions import is_integer, unparen
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.model_classes import class_of
from tcaudit.source.syntax import evaluated_value, keyword
from tcaudit.source.triggers import all_of

SDPA = "torch.nn.functional.scaled_dot_product_attention"
SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
DROPOUT_MODULES = {"torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"}
LINEAR_MODULES = {"torch.nn.Linear", "torch.nn.modules.linear.Linear", "torch.nn.LazyLinear"}
# Methods that keep a tensor's rank (what the rank of the query, key and values is read through).
RANK_KEEPING = {"transpose", "contiguous", "float", "half", "bfloat16", "to", "type_as", "clone", "permute"}


@dataclass(frozen=True, eq=False)
class AttentionPlan(FixPlan):
    kind = "use-sdpa"
    removed: tuple[cst.BaseStatement, ...]  # the score, mask, softmax and dropout statements
    output: cst.BaseExpression  # ``att @ v`` inside the last statement
    call: str  # the scaled_dot_product_attention call that replaces it
    line: int


@dataclass
class _Chain:
    weights: str  # the variable holding the scores, then the weights (its current name)
    query: cst.BaseExpression
    key: cst.BaseExpression
    scale: str | None
    statements: list[cst.SimpleStatementLine]
    mask: str | None = None
    causal: bool = False
    dropout: str | None = None
    decline: str | None = None
    # Every name the scores and weights had: ``weights = scores.softmax(-1)`` renames them.
    names: list[str] = field(default_factory=list)
    # The statements before the scores in the same block (where a local mask is built).
    earlier: Sequence[cst.BaseStatement] = ()
    # A causal mask built in the function for this chain alone: removed with the chain.
    mask_statement: cst.BaseStatement | None = None


def _assigned(statement: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """``name = expr`` (or ``name += expr`` as ``name + expr``) as (name, expr)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value, small.value
    if (isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name)
            and isinstance(small.operator, cst.AddAssign)):
        return small.target.value, cst.BinaryOperation(small.target, cst.Add(), small.value)
    return None


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name




def _minus_one(node: cst.CSTNode | None) -> bool:
    return (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
            and isinstance(node.expression, cst.Integer) and node.expression.value == "1")


def _transposed_key(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """``k.transpose(-2, -1)`` / ``k.transpose(-1, -2)`` / ``k.mT`` → ``k``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return node.value
    if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "transpose"
            and len(node.args) == 2 and all(a.keyword is None for a in node.args)):
        dims = []
        for arg in node.args:
            value = arg.value
            if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus) \
                    and isinstance(value.expression, cst.Integer):
                dims.append(-int(value.expression.value))
            else:
                return None
        if sorted(dims) == [-2, -1]:
            return node.func.value
    return None


class ManualAttention(ScriptRule):
    id = "TC308"
    triggers = (all_of(r"softmax", r"transpose(?<!\wtranspose)\b|\.mT\b", r"@|matmul"),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        for function, _ in facts.functions:
            for block in _blocks(function.body):
                yield from self._check_block(facts, function, block)

    def _check_block(self, facts: ScriptFacts, function: cst.FunctionDef, block: Sequence[cst.BaseStatement]):
        index = 0
        while index < len(block):
            chain = self._scores(facts, block[index])
            if chain is None:
                index += 1
                continue
            chain.earlier = block[:index]
            end = self._follow(facts, function, chain, block, index + 1)
            if end is None:
                index += 1
                continue
            last, output = end
            if _fused_alternative(facts, function, block):
                index += 1
                continue
            if _used_elsewhere(function, chain, last):
                chain.decline = (
                    f"the attention weights `{chain.weights}` are used for more than the product with the "
                    "values (returned, stored or logged); scaled_dot_product_attention does not return them"
                )
            rank = _attention_rank(facts, function, chain, output)
            if isinstance(rank, str) and not chain.decline:
                chain.decline = rank
            call = self._call_text(facts, chain, output, per_head=rank == 3)
            statements = tuple(chain.statements)
            removed = statements + ((chain.mask_statement,) if chain.mask_statement is not None else ())

            def plan(chain=chain, removed=removed, output=output, call=call) -> AttentionPlan:
                if chain.decline:
                    raise DeclineFix(chain.decline)
                return AttentionPlan(removed, output, call, facts.line_of(removed[0]))

            yield self.finding(
                facts,
                statements[0],
                "attention written by hand (softmax of q @ k^T, then @ v); use `F.scaled_dot_product_attention`",
                explanation="It materialises the T x T score matrix and runs several kernels; "
                "`F.scaled_dot_product_attention` runs one fused flash kernel (bf16/fp16, head dim a multiple of 8).",
                end_node=last,
                fix=self.planned_fix(FixClass.NUMERICS, "replace it by F.scaled_dot_product_attention", plan),
            )
            index = block.index(last) + 1

    # -- recognising the chain -------------------------------------------------------------------
    def _scores(self, facts: ScriptFacts, statement: cst.BaseStatement) -> _Chain | None:
        assigned = _assigned(statement)
        if assigned is None:
            return None
        name, expr = assigned
        scale: str | None = None
        product = expr
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide)):
            left, right = unparen(expr.left), unparen(expr.right)
            code = facts.module.code_for_node
            if _matmul_parts(left) is not None:
                product = left
                scale = code(right) if isinstance(expr.operator, cst.Multiply) else f"1.0 / ({code(right)})"
            elif isinstance(expr.operator, cst.Multiply) and _matmul_parts(right) is not None:
                product, scale = right, code(left)
            else:
                return None
        parts = _matmul_parts(unparen(product))
        if parts is None:
            return None
        query, transposed = parts
        key = _transposed_key(unparen(transposed))
        if key is None:
            return None
        return _Chain(name, query, key, scale, [statement], names=[name])

    def _follow(self, facts, function, chain: _Chain, block, start: int):
        """Walk the mask, softmax and dropout statements to the product with the values; returns
        (the statement holding the product, the product expression) or None."""
        seen_softmax = False
        for statement in block[start:]:
            weights = chain.weights
            # Everything the chain reads (query, key, scale, mask) is read at the product instead.
            moved_names = set().union(*map(_names, chain.statements)) - set(chain.names)
            assigned = _assigned(statement)
            if (assigned is not None and assigned[0] != weights and not seen_softmax
                    and self._softmax(facts, assigned[1], weights)):
                # ``weights = scores.softmax(-1)``: the chain goes on under the new name.
                seen_softmax = True
                chain.weights = assigned[0]
                chain.names.append(assigned[0])
                chain.statements.append(statement)
                continue
            if assigned is not None and assigned[0] == weights:
                expr = assigned[1]
                if not seen_softmax and self._mask(facts, function, chain, expr):
                    chain.statements.append(statement)
                    continue
                if not seen_softmax and self._softmax(facts, expr, weights):
                    seen_softmax = True
                    chain.statements.append(statement)
                    continue
                if seen_softmax and chain.dropout is None and self._dropout(facts, function, chain, expr):
                    chain.statements.append(statement)
                    continue
                return None
            if not seen_softmax:
                if _mentions(statement, weights):
                    return None
                if _assigns_any(statement, moved_names):
                    return None
                continue
            product = _find_product(statement, weights)
            if product is not None:
                return statement, product
            if _assigns_any(statement, moved_names):
                return None
            # A read of the weights in between (logging, storing) is still attention, but the fix
            # would lose it: _used_elsewhere declines.
        return None

    def _mask(self, facts, function, chain: _Chain, expr: cst.BaseExpression) -> bool:
        code = facts.module.code_for_node
        weights = chain.weights
        func = expr.func if isinstance(expr, cst.Call) else None
        if isinstance(func, cst.Attribute) and _is_name(func.value, weights) and func.attr.value == "masked_fill":
            args = expr.args
            if len(args) != 2:
                return False
            cond, fill = args[0].value, args[1].value
            if not negative_infinity(fill):
                chain.decline = (
                    f"the mask fills `{code(fill)}`, not -inf: with a boolean attn_mask rows that are fully "
                    "masked would come out differently"
                )
            chain.causal = _causal_buffer(facts, function, cond) or self._local_causal(
                facts, function, chain, cond, "filled")
            if not chain.causal:
                chain.mask = _kept_positions(code, cond)
            return True
        if (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add)
                and _is_name(expr.left, weights) and not _mentions(expr.right, weights)):
            chain.causal = self._local_causal(facts, function, chain, expr.right, "additive")
            if not chain.causal:
                chain.mask = code(expr.right)
            return True
        return False

    def _local_causal(self, facts: ScriptFacts, function: cst.FunctionDef, chain: _Chain,
                      use: cst.BaseExpression, how: str) -> bool:
        """A mask built just before, in the same block, as the top-left causal mask of T x T, where T is
        the sequence length read from a tensor's shape: ``torch.tril(torch.ones(T, T))`` filled where
        ``== 0`` (or ``~mask``), ``torch.triu(torch.ones(T, T), diagonal=1)`` filled where set, or
        ``torch.triu(torch.full((T, T), -inf), diagonal=1)`` added. Exactly what ``is_causal=True``
        masks when the scores are T x T, which broadcasting them against a T x T mask requires (T is
        not a literal: a 1 x 1 mask would broadcast and mask nothing). The mask's statement goes with
        the chain when nothing else reads it."""
        use = unparen(use)
        wanted: tuple[str, ...]
        if how == "additive":
            name, wanted = use, ("additive",)
        elif (isinstance(use, cst.Comparison) and len(use.comparisons) == 1
              and isinstance(use.comparisons[0].operator, cst.Equal) and is_integer(use.comparisons[0].comparator, "0")):
            name, wanted = use.left, ("kept",)
        elif isinstance(use, cst.UnaryOperation) and isinstance(use.operator, cst.BitInvert):
            name, wanted = unparen(use.expression), ("kept",)
        else:
            name, wanted = use, ("filled",)
        if not isinstance(name, cst.Name):
            return False
        for statement in reversed(chain.earlier):
            assigned = _assigned(statement)
            if assigned is not None and assigned[0] == name.value:
                kind = causal_construction(facts, function, assigned[1])
                if kind not in wanted:
                    return False
                if _count_name(function.body, name.value) == 2:  # its assignment and this use
                    chain.mask_statement = statement
                return True
            if _assigns_any(statement, {name.value}):
                return False
        return False

    def _softmax(self, facts, expr: cst.BaseExpression, weights: str) -> bool:
        if not isinstance(expr, cst.Call):
            return False
        if (isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "softmax"
                and _is_name(expr.func.value, weights)):
            return _last_dim(expr, position=0)
        if facts.qualname(expr.func) in SOFTMAX and expr.args and _is_name(expr.args[0].value, weights):
            return _last_dim(expr, position=1)
        return False

    def _dropout(self, facts, function, chain: _Chain, expr: cst.BaseExpression) -> bool:
        code = facts.module.code_for_node
        if not isinstance(expr, cst.Call) or not expr.args or not _is_name(expr.args[0].value, chain.weights):
            return False
        if facts.qualname(expr.func) == "torch.nn.functional.dropout":
            p = keyword(expr, "p", 1)
            training = keyword(expr, "training", 2)
            p_text = code(p.value) if p is not None else "0.5"
            chain.dropout = p_text if training is None else f"({p_text} if {code(training.value)} else 0.0)"
            return True
        if (len(expr.args) == 1 and isinstance(expr.func, cst.Attribute) and _is_name(expr.func.value, "self")
                and _dropout_attribute(facts, function, expr.func.attr.value)):
            chain.dropout = f"({code(expr.func)}.p if self.training else 0.0)"
            return True
        return False

    @staticmethod
    def _call_text(facts: ScriptFacts, chain: _Chain, output: cst.BaseExpression, per_head: bool = False) -> str:
        """The SDPA call; ``per_head``: the tensors are one head's 3-D (B, T, hs), which SDPA would run
        on its math kernel (flash and memory-efficient attention take 4-D input only), so they go in as
        (B, 1, T, hs) and the result comes out 3-D again."""
        code = facts.module.code_for_node
        values = _matmul_parts(output)[1]
        arguments = [code(chain.query), code(chain.key), code(values)]
        if per_head:
            arguments = [f"{_atom(text)}.unsqueeze(1)" for text in arguments]
        if chain.mask is not None:
            arguments.append(f"attn_mask={_atom(chain.mask)}.unsqueeze(-3)" if per_head else f"attn_mask={chain.mask}")
        if chain.dropout is not None:
            arguments.append(f"dropout_p={chain.dropout}")
        if chain.causal:
            arguments.append("is_causal=True")
        arguments.append(f"scale={chain.scale if chain.scale is not None else '1.0'}")
        return f"{_sdpa_name(facts)}({', '.join(arguments)})" + (".squeeze(1)" if per_head else "")


def _atom(text: str) -> str:
    """``text`` as the receiver of a method call: parenthesised unless it is a name, attribute, call or
    subscript already."""
    try:
        expr = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return f"({text})"
    return text if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not expr.lpar \
        else f"({text})"


def _attention_rank(facts: ScriptFacts, function: cst.FunctionDef, chain: "_Chain",
                    output: cst.BaseExpression) -> int | str | None:
    """The rank of the query, key and values where the code says it: 4 (B, heads, T, hs: SDPA's fused
    kernels take them as they are), 3 (one head's (B, T, hs): they go in as (B, 1, T, hs)), None (not
    known: passed as they are, as attention functions are called with 4-D tensors), or the reason
    to decline: another rank, where SDPA would run its math kernel, correct and no faster."""
    values = _matmul_parts(output)[1]
    ranks = [_rank(facts, function, expr) for expr in (chain.query, chain.key, values)]
    known = {rank for rank in ranks if rank is not None}
    if not known or known == {4}:
        return None
    if known == {3} and None not in ranks:
        return 3
    shown = ", ".join("?" if rank is None else f"{rank}-D" for rank in ranks)
    return (f"the query, key and values are {shown} here: SDPA's flash and memory-efficient kernels take 4-D "
            "(batch, heads, T, head_dim) input only, so the call would run the math kernel, no faster than "
            "the code it replaces")


# -- helpers over the syntax tree ------------------------------------------------------------------
def _blocks(body: cst.BaseSuite) -> Iterator[Sequence[cst.BaseStatement]]:
    """The statement lists of a function body and of its nested compound statements (not of nested
    functions or classes, which facts.functions visits on their own)."""
    if not isinstance(body, cst.IndentedBlock):
        return
    yield body.body
    for statement in body.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        for suite in _suites(statement):
            yield from _blocks(suite)


def _suites(statement: cst.CSTNode) -> Iterator[cst.BaseSuite]:
    for name in ("body", "orelse", "finalbody"):
        child = getattr(statement, name, None)
        if isinstance(child, cst.BaseSuite):
            yield child
        elif isinstance(child, (cst.If, cst.Else, cst.Finally)):
            yield from _suites(child) if isinstance(child, cst.If) else (child.body,)
    for handler in getattr(statement, "handlers", ()):
        yield handler.body




def _matmul_parts(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    node = unparen(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    func = node.func if isinstance(node, cst.Call) else None
    if (isinstance(func, cst.Attribute) and _is_name(func.value, "torch") and func.attr.value == "matmul"
            and len(node.args) == 2 and all(a.keyword is None for a in node.args)):
        return node.args[0].value, node.args[1].value
    return None


def _find_product(statement: cst.BaseStatement, weights: str) -> cst.BaseExpression | None:
    """The one ``weights @ v`` (or ``torch.matmul(weights, v)``) in ``statement``; other reads of the
    weights there make _used_elsewhere decline the fix."""
    found: list[cst.BaseExpression] = []

    class Finder(cst.CSTVisitor):
        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> bool:
            parts = _matmul_parts(node)
            if parts is not None and _is_name(unparen(parts[0]), weights):
                found.append(node)
                return False
            return True

        def visit_Call(self, node: cst.Call) -> bool:
            parts = _matmul_parts(node)
            if parts is not None and _is_name(unparen(parts[0]), weights):
                found.append(node)
                return False
            return True

    statement.visit(Finder())
    if len(found) != 1:
        return None
    if _mentions(_matmul_parts(found[0])[1], weights):
        return None
    return found[0]


def _names(node: cst.CSTNode) -> set[str]:
    names: set[str] = set()

    class Collect(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            names.add(n.value)

    node.visit(Collect())
    return names


def _count_name(node: cst.CSTNode, name: str) -> int:
    count = 0

    class Count(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            nonlocal count
            count += n.value == name

    node.visit(Count())
    return count


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return _count_name(node, name) > 0


def _assigns_any(statement: cst.BaseStatement, names: set[str]) -> bool:
    assigned = _assigned(statement)
    if assigned is not None:
        return assigned[0] in names
    targets: set[str] = set()

    class Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            targets.update(_names(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets.update(_names(node.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            targets.update(_names(node.target))

    statement.visit(Targets())
    return bool(targets & names)


def _used_elsewhere(function: cst.FunctionDef, chain: _Chain, last: cst.BaseStatement) -> bool:
    """Whether the weights are read anywhere in the function outside the chain and the product."""
    return any(
        _count_name(function.body, name)
        > sum(_count_name(s, name) for s in chain.statements) + (name == chain.weights)
        for name in chain.names
    )


def _kept_positions(code, cond: cst.BaseExpression) -> str:
    """The boolean mask of positions kept, from the condition of the positions filled."""
    cond = unparen(cond)
    if (isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1
            and isinstance(cond.comparisons[0].operator, cst.Equal)
            and isinstance(cond.comparisons[0].comparator, cst.Integer)
            and cond.comparisons[0].comparator.value == "0"):
        return f"{code(cond.left)} != 0"
    if isinstance(cond, cst.UnaryOperation) and isinstance(cond.operator, cst.BitInvert):
        return code(cond.expression)
    return f"~({code(cond)})"


def _causal_buffer(facts: ScriptFacts, function: cst.FunctionDef, cond: cst.BaseExpression) -> bool:
    """``self.bias[:, :, :T, :T] == 0`` where ``bias`` is a ``torch.tril(torch.ones(...))`` buffer of
    the same class: exactly the top-left causal mask that ``is_causal=True`` applies."""
    cond = unparen(cond)
    if not (isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1
            and isinstance(cond.comparisons[0].operator, cst.Equal)
            and is_integer(cond.comparisons[0].comparator, "0")):
        return False
    subscript = cond.left
    if not (isinstance(subscript, cst.Subscript) and isinstance(subscript.value, cst.Attribute)
            and _is_name(subscript.value.value, "self")):
        return False
    slices = subscript.slice
    if len(slices) < 2:
        return False
    bounds = []
    for element in slices:
        s = element.slice
        if not isinstance(s, cst.Slice) or s.lower is not None or s.step is not None:
            return False
        bounds.append(s.upper)
    upper = [b for b in bounds if b is not None]
    if len(upper) != 2 or any(b is not None for b in bounds[:-2]) or not all(isinstance(b, cst.Name) for b in upper):
        return False
    if upper[0].value != upper[1].value:
        return False
    return _tril_buffer(facts, function, subscript.value.attr.value)


def _init_calls(facts: ScriptFacts, function: cst.FunctionDef):
    cls = class_of(facts, function)
    if cls is None:
        return []
    return [c for c in facts.calls if c.ctx.class_def is cls]


def _tril_buffer(facts: ScriptFacts, function: cst.FunctionDef, name: str) -> bool:
    for call in _init_calls(facts, function):
        if call.method != "register_buffer" or len(call.node.args) < 2:
            continue
        if not isinstance(call.node.args[0].value, cst.SimpleString) or \
                evaluated_value(call.node.args[0].value) != name:
            continue
        value = call.node.args[1].value
        text = facts.code(value).replace(" ", "")
        return "tril(" in text and "ones(" in text and "diagonal" not in text and ",-1" not in text
    return False


def _dropout_attribute(facts: ScriptFacts, function: cst.FunctionDef, attr: str) -> bool:
    return _module_attribute(facts, function, attr, DROPOUT_MODULES)


def _module_attribute(facts: ScriptFacts, function: cst.FunctionDef, attr: str, qualnames: set[str]) -> bool:
    """``self.<attr>`` is assigned one of the modules ``qualnames`` in the class's methods."""
    for call in _init_calls(facts, function):
        if call.qualname in qualnames and call.statement is not None:
            assigned = call.statement.node
            body = assigned.body if isinstance(assigned, cst.SimpleStatementLine) else ()
            if (len(body) == 1 and isinstance(body[0], cst.Assign) and len(body[0].targets) == 1
                    and isinstance(target := body[0].targets[0].target, cst.Attribute)
                    and _is_name(target.value, "self") and target.attr.value == attr):
                return True
    return False




def _rank(facts: ScriptFacts, function: cst.FunctionDef, expr: cst.BaseExpression, depth: int = 0) -> int | None:
    """The number of dimensions of the tensor ``expr`` holds in ``function``, where the code says it: a
    ``.view``/``.reshape`` with its sizes, a ``self.<Linear>(x)`` or ``F.linear(x, ...)`` of a tensor of
    known rank, a name assigned once in the function, a parameter unpacked ``B, T, C = x.shape``; through
    ``.transpose``, ``.contiguous``, ``.unsqueeze``... None: not known from the code."""
    expr = unparen(expr)
    if depth > 12:
        return None
    if isinstance(expr, cst.Name):
        value = _single_assignment(function, expr.value)
        if value is not None:
            return _rank(facts, function, value, depth + 1)
        return _unpacked_shape_rank(function, expr.value)
    if not isinstance(expr, cst.Call):
        return None
    func = expr.func
    args = [a for a in expr.args if a.keyword is None]
    if any(a.star for a in expr.args):
        return None
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method in ("view", "reshape") and args:
            if len(args) == 1 and isinstance(unparen(args[0].value), (cst.Tuple, cst.List)):
                return len(unparen(args[0].value).elements)
            if len(args) == 1 and not isinstance(unparen(args[0].value), (cst.Integer, cst.UnaryOperation, cst.Name,
                                                                           cst.BinaryOperation)):
                return None  # ``x.view(shape)``, ``x.view(other.size())``: not counted here
            return len(args)
        if method in RANK_KEEPING:
            return _rank(facts, function, func.value, depth + 1)
        if method == "unsqueeze":
            inner = _rank(facts, function, func.value, depth + 1)
            return None if inner is None else inner + 1
        if _is_name(func.value, "self") and len(expr.args) == 1 and _module_attribute(
                facts, function, method, LINEAR_MODULES):
            return _rank(facts, function, expr.args[0].value, depth + 1)
    if facts.qualname(func) == "torch.nn.functional.linear" and args:
        return _rank(facts, function, args[0].value, depth + 1)
    return None


def _single_assignment(function: cst.FunctionDef, name: str) -> cst.BaseExpression | None:
    """The value ``name`` is assigned, where the function assigns it exactly once (``q = self.query(x)``)."""
    values: list[cst.BaseExpression | None] = []

    class Assignments(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if _is_name(target.target, name):
                    values.append(node.value)
                elif _mentions(target.target, name):
                    values.append(None)  # unpacked (``q, k, v = ...``) or a subscript: rank not read

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if _mentions(node.target, name):
                values.append(None)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if _mentions(node.target, name):
                values.append(node.value)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

    function.visit(Assignments())
    return values[0] if len(values) == 1 else None


def _unpacked_shape_rank(function: cst.FunctionDef, name: str) -> int | None:
    """``B, T, C = x.shape`` (or ``x.size()``) for a parameter ``x`` of ``function``: 3."""
    if not any(param.name.value == name for param in function.params.params):
        return None
    found: list[int] = []

    class Unpacks(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            value = unparen(node.value)
            if isinstance(value, cst.Call) and not value.args:
                value = value.func
                if not (isinstance(value, cst.Attribute) and value.attr.value == "size"):
                    return
            elif not (isinstance(value, cst.Attribute) and value.attr.value == "shape"):
                return
            if not _is_name(value.value, name):
                return
            for target in node.targets:
                unpacked = unparen(target.target)
                if isinstance(unpacked, (cst.Tuple, cst.List)) and not any(
                        isinstance(e, cst.StarredElement) for e in unpacked.elements):
                    found.append(len(unpacked.elements))

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

    function.visit(Unpacks())
    return found[0] if len(set(found)) == 1 else None


def _last_dim(call: cst.Call, position: int) -> bool:
    given = keyword(call, "dim", position)
    dim = given.value if given is not None else None
    return _minus_one(dim) or is_integer(dim, "3")


def _fused_alternative(facts: ScriptFacts, function: cst.FunctionDef, block) -> bool:
    """The manual path is the fallback branch beside a scaled_dot_product_attention call (nanoGPT's
    ``if self.flash: ... else: ...``): deliberate, and never the path taken on a current torch."""
    return any(call.qualname == SDPA for call in facts.calls_in(function))


def _sdpa_name(facts: ScriptFacts) -> str:
    for site in facts.imports:
        if site.qualname == "torch.nn.functional" and site.ctx is facts.module_frame:
            return f"{site.local}.scaled_dot_product_attention"
        if site.qualname == SDPA and site.ctx is facts.module_frame:
            return site.local
    torch = torch_import_name(facts)
    return f"{torch or 'torch'}.nn.functional.scaled_dot_product_attention"


class ManualAttentionFix(Codemod):
    rule = "TC308"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _AttentionEditor()
        for finding in findings:
            plan: AttentionPlan = finding.fix.plan
            for statement in plan.removed:
                editor.remove(statement)
            editor.replacements[plan.output] = parse_expression(plan.call, module)
        return module.visit(editor)


class _AttentionEditor(StatementEditor):
    """Removes the chain's statements and puts the call in place of ``weights @ v``, in one pass (both
    are found by identity in the same tree)."""

    def __init__(self) -> None:
        super().__init__()
        self.replacements: dict[cst.CSTNode, cst.BaseExpression] = {}

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        replacement = self.replacements.get(original_node)
        if replacement is None:
            return updated_node
        if getattr(updated_node, "lpar", None):
            return replacement.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        return replacement
