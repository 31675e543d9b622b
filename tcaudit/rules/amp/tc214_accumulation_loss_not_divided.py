"""TC214 accumulation-loss-not-divided: gradients summed over N micro-steps with the loss never divided by N.

Under gradient accumulation (``backward()`` every iteration, ``optimizer.step()`` only under ``if (i +
1) % N == 0:``) ``.grad`` holds the sum of N micro-batch gradients. Without ``loss = loss / N`` that is
N times the mean: the effective learning rate is N times the configured one, and gradient clipping
clips N-times-larger norms. Reported only on clear evidence (tcaudit/script/accumulation.py finds the
loop): the path from the backward's tensor back to the criterion or the model call holds no division
at all, no multiplication by or mention of N, no ``reduction="sum"``, and no call this file cannot see
(a helper of another module, a custom loss class, a lambda). Second case (info): the loss is divided
by the constant N while the guard also steps on the last, shorter cycle of an epoch (``or (i + 1) ==
len(loader)``), so that update is scaled down by (remaining micro-steps) / N. No automatic fix: where
the division goes is the author's call.
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Severity
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.accumulation import ACCUMULATION_NAME, AccumulationLoop, accumulation_loops
from tcaudit.script.distributed import in_test_code
from tcaudit.script.evidence import BACKWARD_CALL
from tcaudit.script.expressions import attribute_chain, literal
from tcaudit.script.facts import ScriptFacts, TrainingStep
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import full_name, names_in, nodes_of, target_names
from tcaudit.source.triggers import all_of, text_matches

# Tensor methods a loss passes through unscaled (``loss.mean()``, ``loss.float()``).
_PASS_THROUGH = frozenset({
    "mean", "sum", "float", "double", "half", "bfloat16", "squeeze", "view", "reshape", "to", "cuda",
    "contiguous", "clone", "type_as", "nanmean", "flatten",
})
_REDUCTIONS = frozenset({"torch.mean", "torch.sum", "torch.nanmean"})
_LR_NAME = re.compile(r"^(lr|learning_rate|\w*_lr)$", re.IGNORECASE)
_LR_KEY = re.compile(r"\[\s*[\"']lr[\"']\s*\]")
# Gradients scaled after the backward (``p.grad /= N``, ``p.grad.div_(N)``, ``p.grad = p.grad / N``).
_GRAD_SCALED = re.compile(r"\.grad\b[\w.]*\s*(?:/=|\*=)|\.grad\b[\w.]*\.(?:div_|mul_)\(|\.grad\s*=[^=\n]*[/*]")
_MAX_DEPTH = 24
_MAX_HELPERS = 2
_UNKNOWN = object()  # a binding this rule cannot follow: a loop target, a ``with ... as`` name


class _Scope:
    """Assignments of one function (or the module level), nested defs and classes aside: target → the
    values and augmented operators it is assigned."""

    def __init__(self, node: cst.CSTNode) -> None:
        self.assigned: dict[str, list[tuple[object, cst.BaseAugOp | None, cst.CSTNode]]] = {}
        owner = self

        class _V(cst.CSTVisitor):
            def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
                return n is node

            def visit_ClassDef(self, n: cst.ClassDef) -> bool:
                return False

            def visit_Lambda(self, n: cst.Lambda) -> bool:
                return False

            def visit_Assign(self, n: cst.Assign) -> None:
                for target in n.targets:
                    owner._bind(target.target, n.value, n)

            def visit_AnnAssign(self, n: cst.AnnAssign) -> None:
                if n.value is not None:
                    owner._bind(n.target, n.value, n)

            def visit_AugAssign(self, n: cst.AugAssign) -> None:
                dotted = attribute_chain(n.target)
                if dotted:
                    owner.assigned.setdefault(dotted, []).append((n.value, n.operator, n))

            def visit_NamedExpr(self, n: cst.NamedExpr) -> None:
                owner._bind(n.target, n.value, n)

            def visit_For(self, n: cst.For) -> None:
                for name in target_names(n.target):
                    owner.assigned.setdefault(name, []).append((_UNKNOWN, None, n))

            def visit_AsName(self, n: cst.AsName) -> None:
                for name in target_names(n.name):  # type: ignore[arg-type]
                    owner.assigned.setdefault(name, []).append((_UNKNOWN, None, n))

        node.visit(_V())

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression, statement: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            elements = [e.value for e in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements):
                for t, v in zip(elements, value.elements):
                    self._bind(t, v.value, statement)
                return
            for t in elements:  # ``logits, loss = model(x, y)``: each name comes from the whole call
                for name in target_names(t):
                    self.assigned.setdefault(name, []).append((value, None, statement))
            return
        dotted = attribute_chain(target)
        if dotted:
            self.assigned.setdefault(dotted, []).append((value, None, statement))


class _LossPath:
    """Follows the tensor a backward runs on back to where the loss is made, noting what scales it."""

    def __init__(self, facts: ScriptFacts, accumulation: AccumulationLoop) -> None:
        self.facts = facts
        self.divisor_code = accumulation.divisor_code
        last = full_name(accumulation.divisor) or ""
        self.divisor_last = last.split(".")[-1] if last else ""
        self.unknown = False  # something this rule cannot see: no finding
        self.scaled = False  # a division, N, a ``reduction="sum"``: deliberate, no finding
        self.by_divisor: list[cst.CSTNode] = []  # divisions by exactly N
        self._seen: set[tuple[int, str]] = set()
        pipeline = pipeline_facts(facts)
        self.models = set(facts.model_names) | set(pipeline.trained_model_names)

    # -- what a name or a call says -------------------------------------------------------------------
    def mentions_divisor(self, node: cst.CSTNode) -> bool:
        for name in names_in(node):
            last = name.split(".")[-1]
            if ACCUMULATION_NAME.search(last) or (self.divisor_last and last == self.divisor_last):
                return True
        return isinstance(node, cst.Integer) and self.facts.code(node) == self.divisor_code

    def _check_arguments(self, call: cst.Call) -> None:
        for arg in call.args:
            if self.mentions_divisor(arg.value):
                self.scaled = True
            if arg.keyword is not None and arg.keyword.value == "reduction" and literal(arg.value) == "sum":
                self.scaled = True

    def _is_torch_loss(self, value: cst.BaseExpression) -> bool:
        """``nn.CrossEntropyLoss(...)``, ``nn.MSELoss().cuda()``, ``torch.nn.BCEWithLogitsLoss().to(dev)``."""
        while (
            isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("to", "cuda")
        ):
            value = value.func.value
        if not isinstance(value, cst.Call):
            return False
        qual = self.facts.qualname(value.func) or ""
        if qual.startswith("torch.nn.") and qual.endswith("Loss"):
            self._check_arguments(value)
            return True
        return False

    # -- the walk ---------------------------------------------------------------------------------------
    def follow(self, node: cst.BaseExpression, scope: _Scope, depth: int = 0, helpers: int = 0) -> None:
        if self.unknown or depth > _MAX_DEPTH:
            self.unknown = True
            return
        if isinstance(node, (cst.Integer, cst.Float)):
            return
        if isinstance(node, (cst.Name, cst.Attribute)):
            self._name(node, scope, depth, helpers)
        elif isinstance(node, cst.Subscript):
            self.follow(node.value, scope, depth + 1, helpers)
        elif isinstance(node, cst.UnaryOperation):
            self.follow(node.expression, scope, depth + 1, helpers)
        elif isinstance(node, cst.IfExp):
            self.follow(node.body, scope, depth + 1, helpers)
            self.follow(node.orelse, scope, depth + 1, helpers)
        elif isinstance(node, cst.BinaryOperation):
            self._binary(node, scope, depth, helpers)
        elif isinstance(node, cst.Call):
            self._call(node, scope, depth, helpers)
        else:
            self.unknown = True

    def _name(self, node: cst.BaseExpression, scope: _Scope, depth: int, helpers: int) -> None:
        if self.mentions_divisor(node):
            self.scaled = True
            return
        dotted = attribute_chain(node)
        key = (id(scope), dotted or "")
        if dotted and key in self._seen:
            return
        if dotted:
            self._seen.add(key)
        assigned = scope.assigned.get(dotted or "", [])
        if not assigned:
            if isinstance(node, cst.Attribute):  # ``outputs.loss``: where ``outputs`` comes from
                self.follow(node.value, scope, depth + 1, helpers)
            else:
                self.unknown = True  # a parameter or a global: made where this rule does not look
            return
        for value, operator, statement in assigned:
            if value is _UNKNOWN:
                self.unknown = True
                return
            assert isinstance(value, cst.BaseExpression)
            if isinstance(operator, (cst.DivideAssign, cst.FloorDivideAssign)):
                self.scaled = True
                if self.facts.code(value) == self.divisor_code:
                    self.by_divisor.append(statement)
                continue
            if isinstance(operator, cst.MultiplyAssign):
                self.scaled = True  # ``loss *= w``: a scale this rule does not judge
                continue
            if operator is not None and not isinstance(operator, (cst.AddAssign, cst.SubtractAssign)):
                self.unknown = True
                return
            self.follow(value, scope, depth + 1, helpers)

    def _binary(self, node: cst.BinaryOperation, scope: _Scope, depth: int, helpers: int) -> None:
        operator = node.operator
        if isinstance(operator, (cst.Divide, cst.FloorDivide)):
            self.scaled = True
            if self.facts.code(node.right) == self.divisor_code:
                self.by_divisor.append(node)
            self.follow(node.left, scope, depth + 1, helpers)
            return
        if isinstance(operator, cst.Multiply):
            if any(isinstance(side, cst.Float) or self.mentions_divisor(side) for side in (node.left, node.right)):
                self.scaled = True
                return
        elif not isinstance(operator, (cst.Add, cst.Subtract)):
            self.unknown = True
            return
        self.follow(node.left, scope, depth + 1, helpers)
        self.follow(node.right, scope, depth + 1, helpers)

    def _call(self, node: cst.Call, scope: _Scope, depth: int, helpers: int) -> None:
        facts = self.facts
        self._check_arguments(node)
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            receiver = full_name(func.value) or ""
            if method == "scale" and (receiver in facts.scalers or receiver.lower().endswith("scaler")) and node.args:
                self.follow(node.args[0].value, scope, depth + 1, helpers)
                return
            if method in _PASS_THROUGH and facts.qualname(func.value) is None:
                self.follow(func.value, scope, depth + 1, helpers)  # ``loss.mean()``
                return
        dotted = attribute_chain(func)
        qual = facts.qualname(func) or ""
        if qual.startswith("torch.nn.functional."):
            return  # a mean-reduced loss unless ``reduction=`` says otherwise (checked above)
        if qual in _REDUCTIONS and node.args:
            self.follow(node.args[0].value, scope, depth + 1, helpers)
            return
        if dotted is None:
            self.unknown = True
            return
        if dotted in self.models or dotted.removesuffix(".module") in self.models:
            return  # the model's forward returns the loss (``logits, loss = model(x, y)``)
        bindings = facts.bindings_of(dotted)
        if bindings and all(self._is_torch_loss(b.value) for b in bindings):
            return
        short = dotted.removeprefix("self.")
        helpers_named = facts.functions_by_name.get(short, []) if "." not in short else []
        if bindings or len(helpers_named) != 1 or helpers >= _MAX_HELPERS:
            self.unknown = True
            return
        self._helper(helpers_named[0], depth, helpers)

    def _helper(self, fn: cst.FunctionDef, depth: int, helpers: int) -> None:
        """A loss function of this file: no division or N in its body, then where its returns come from."""
        body = fn.body
        divides = any(
            isinstance(b.operator, (cst.Divide, cst.FloorDivide)) for b in nodes_of(body, cst.BinaryOperation)
        )
        divides_in_place = any(
            isinstance(a.operator, (cst.DivideAssign, cst.FloorDivideAssign)) for a in nodes_of(body, cst.AugAssign)
        )
        if divides or divides_in_place or self.mentions_divisor(body):
            self.scaled = True
            return
        returns = [r.value for r in nodes_of(body, cst.Return) if r.value is not None]
        if not returns:
            self.unknown = True
            return
        scope = _Scope(fn)
        for value in returns:
            self.follow(value, scope, depth + 1, helpers + 1)


class AccumulationLossNotDivided(ScriptRule):
    id = "TC214"
    triggers = (all_of(BACKWARD_CALL, r"\.\s*step\s*\(", r"%", r"zero_grad"),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if facts.frameworks or text_matches(_GRAD_SCALED, facts.source.text):
            return
        for accumulation in accumulation_loops(facts):
            if in_test_code(accumulation.loop):
                continue
            paths = [self._path(facts, accumulation, step) for step in accumulation.backwards]
            if any(path is None for path in paths):
                continue
            n = accumulation.divisor_code if len(accumulation.divisor_code) <= 40 else "N"
            guard = facts.code(accumulation.guard.node.test)  # type: ignore[attr-defined]
            plain = not any(path.scaled or path.unknown for path in paths)
            if plain and not self._n_elsewhere(facts, accumulation, paths[0]):
                first = accumulation.backwards[0].backward
                yield self.finding(
                    facts,
                    first.node,
                    f"the loss is not divided by `{n}`, the number of micro-steps whose gradients accumulate",
                    explanation=(
                        f"The optimizer steps only under `if {guard}`, so `.grad` holds the sum of `{n}` "
                        f"micro-batch gradients, `{n}` times their mean: with SGD the effective learning "
                        f"rate is `{n}` times the configured one, and gradient clipping (and Adam's eps) "
                        f"see `{n}`-times-larger gradients. Divide the loss by the number of micro-steps "
                        f"before the backward: `loss = loss / {n}`."
                    ),
                )
                continue
            if accumulation.last_batch is None or self._divisor_changes(facts, accumulation):
                continue
            divisions = [node for path in paths for node in path.by_divisor]
            if divisions:
                yield self.finding(
                    facts,
                    divisions[0],
                    f"the last, shorter accumulation cycle of an epoch is also divided by `{n}`",
                    severity=Severity.INFO,
                    explanation=(
                        f"The optimizer also steps on the last micro-batches of an epoch "
                        f"(`{facts.code(accumulation.last_batch)}`); when the number of "
                        f"batches is not a multiple of `{n}`, that update sums fewer than `{n}` gradients "
                        f"each divided by `{n}`, so it is scaled down. Divide by the number of micro-steps "
                        f"of the current cycle there, or drop the partial cycle."
                    ),
                )

    @staticmethod
    def _path(facts: ScriptFacts, accumulation: AccumulationLoop, step: TrainingStep) -> _LossPath | None:
        backward = step.backward.node
        if any(a.keyword is None or a.keyword.value in ("gradient", "inputs") for a in backward.args):
            return None  # ``t.backward(grad)``: the scale is in the gradient passed
        fn = step.function
        scope = _Scope(fn if fn is not None else facts.module)
        path = _LossPath(facts, accumulation)
        path.follow(step.loss, scope)
        return path

    @staticmethod
    def _n_elsewhere(facts: ScriptFacts, accumulation: AccumulationLoop, path: _LossPath) -> bool:
        """N handed to a call in the loop (``average_gradients(model, accum)``, ``print(loss * accum)``),
        to an optimizer's construction or an ``lr`` assignment: the scale may be applied there."""
        loop = accumulation.loop.node
        for call in facts.calls:
            if call.ctx.inside(loop) and any(path.mentions_divisor(arg.value) for arg in call.node.args):
                return True
            if (call.qualname or "").startswith("torch.optim.") and any(
                path.mentions_divisor(arg.value) for arg in call.node.args
            ):
                return True
        for binding in facts.bindings:
            if _LR_NAME.match(binding.target.split(".")[-1]) and path.mentions_divisor(binding.value):
                return True
            if not binding.is_item_write or binding.statement is None:
                continue
            code = facts.code(binding.statement.node)
            if _LR_KEY.search(code) and path.mentions_divisor(binding.value):
                return True
        return False

    @staticmethod
    def _divisor_changes(facts: ScriptFacts, accumulation: AccumulationLoop) -> bool:
        """N reassigned inside the loop: the division may already follow the cycle's length."""
        dotted = attribute_chain(accumulation.divisor)
        return bool(dotted) and any(b.ctx.inside(accumulation.loop.node) for b in facts.bindings_of(dotted))
