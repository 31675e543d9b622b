"""Whether a training script's compiled models can run as CUDA graphs (``mode="reduce-overhead"``).

A CUDA graph replays a recorded step with one launch: for a launch-bound step (DCGAN's three small
networks, a small MLP) that is most of what compiling can win. It is also the compile mode that can
break a script that runs fine eagerly or under the default mode, so TC305's fix asks this module, and
chooses it only where every check passes:

* **Forward**: the model's class is in this file and its ``forward`` (and that of the file's classes it
  builds) has no host read (``.item()``, ``.cpu()``, ``print(tensor)``), no ``if``/``while`` on a
  tensor's value and makes no tensor without a ``device=`` (a CPU tensor inside the graph).
* **Shapes**: no custom ``collate_fn``, ``batch_sampler`` or sequence packing or padding (batches of
  varying shape would record a graph per shape). A smaller last batch is one more recording an
  epoch, as the default mode's recompile there (TC318 drops it).
* **Gradients**: ``.grad`` buffers a replay writes live in the graphs' memory pool, so they must not
  outlive an iteration: no gradient accumulation across iterations, no ``zero_grad(set_to_none=False)``,
  a ``zero_grad`` somewhere.
* **Outputs**: with CUDA graph trees, the outputs of one iteration's replays are overwritten by the
  next iteration's ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
  run"). The fix calls ``torch.compiler.cudagraph_mark_step_begin()`` first in every loop that calls a
  compiled model, which makes each iteration one generation: a GAN's ``netD(real)``, ``netD(fake.detach())``
  and ``netD(fake)`` in one iteration, with their backwards in between, all stay valid (without the
  marker a backward ends the generation, and the next call overwrites the discriminator's ``.grad``
  that the second backward accumulates into). Every call of a compiled model must sit directly in a
  loop body (``with`` blocks allowed, not under an ``if``), the models must not be passed to other
  functions or wrapped (DDP, DataParallel), and no output (or a view of one, through names) may be read
  in a later iteration, kept in a list or an attribute, returned, or read after its loop once another
  call of a compiled model came between.

Each check that fails gives the reason the fix prints; one failing check keeps the default mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst

from tcaudit.rules.compile.forward_breaks import branches, host_read, reads_tensor_value, tensor_params, under_flag
from tcaudit.script.accumulation import accumulation_loops
from tcaudit.script.distributed import is_dataparallel, is_ddp, is_fsdp
from tcaudit.script.expressions import DEVICE_FACTORIES
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.model_classes import callee_class, classes_reached
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import contains, full_name, nodes_of

MARK_STEP = "compiler.cudagraph_mark_step_begin()"  # after the name torch is imported as

# Tensor methods that return a view of (or the same memory as) their receiver.
_VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "squeeze", "unsqueeze", "transpose", "permute", "t", "expand",
    "expand_as", "flatten", "unflatten", "chunk", "split", "unbind", "narrow", "select", "detach", "as_strided",
    "movedim", "swapaxes", "diagonal", "contiguous", "to", "cuda", "float", "half", "bfloat16", "type_as",
    "requires_grad_", "values", "indices", "real", "imag", "tensor_split", "hsplit", "vsplit", "unfold",
})
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
# Methods whose result is a Python value or new memory: reading through them is still a read.
_FRESH_METHODS = frozenset({
    "item", "tolist", "numpy", "size", "dim", "numel", "mean", "sum", "max", "min", "argmax", "argmin", "norm",
    "std", "var", "clone", "softmax", "log_softmax", "sigmoid", "exp", "log", "abs", "eq", "ne", "gt", "lt",
    "ge", "le", "cpu", "backward", "prod", "all", "any", "round", "sqrt", "pow", "mul", "add", "sub", "div",
})
_TORCH_VIEWS = frozenset(
    f"torch.{name}" for name in (
        "flatten", "squeeze", "unsqueeze", "reshape", "transpose", "permute", "chunk", "split", "unbind",
        "narrow", "select", "t", "movedim", "swapaxes", "diagonal", "view_as_real", "view_as_complex",
        "tensor_split", "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors",
    )
)
_STORE_METHODS = frozenset({"append", "extend", "insert", "add", "put", "update", "appendleft", "setdefault"})
_VARYING_SHAPES = frozenset({
    "torch.nn.utils.rnn.pack_padded_sequence", "torch.nn.utils.rnn.pad_sequence",
    "torch.nn.utils.rnn.pack_sequence", "torch.nested.nested_tensor", "torch.nested.as_nested_tensor",
})
_HARMLESS_CALLEES = frozenset({"print", "len", "isinstance", "str", "repr", "type", "id", "hasattr", "getattr"})


@dataclass(frozen=True)
class GraphSafety:
    """Whether the compiled models' step can run as CUDA graphs; ``reason`` says why not (short, for
    a fix's decline and a finding's explanation). ``mark_steps``: the first statement of each loop
    body that calls a compiled model, where ``torch.compiler.cudagraph_mark_step_begin()`` goes."""

    safe: bool
    reason: str = ""
    mark_steps: tuple[cst.CSTNode, ...] = field(default=())


def cuda_graph_safety(facts: ScriptFacts, models: Sequence[tuple[str, cst.Call | None]]) -> GraphSafety:
    """``models``: each compiled model's name (``netD``, ``self.model``) and the call that builds it."""
    for check in (_forward_reason, _shape_reason, _gradient_reason):
        reason = check(facts, models)
        if reason:
            return GraphSafety(False, reason)
    return _outputs(facts, [name for name, _ in models])


# -- forward ------------------------------------------------------------------------------------------


def _forward_reason(facts: ScriptFacts, models: Sequence[tuple[str, cst.Call | None]]) -> str:
    pipeline = pipeline_facts(facts)
    classes = facts.classes_by_name
    for name, construction in models:
        if construction is None:
            return f"`{name}`'s construction was not found"
        built = [classes.get(callee_class(call)) for call in pipeline.constructions(construction)]
        if not built or any(cls is None for cls in built):
            return f"`{name}`'s forward is not in this file"
        # The classes they build or derive from (a Generator's blocks). ``nested``: the calls of a class
        # nested in one count as its own, so this check reaches the classes those build too; CUDA graphs
        # are chosen only where no forward reached breaks, and reaching less would choose them more often.
        for cls in classes_reached(facts, built, nested=True):  # type: ignore[arg-type]
            reason = _forward_breaks(facts, cls)
            if reason:
                return reason
    return ""


def _forward_breaks(facts: ScriptFacts, cls: cst.ClassDef) -> str:
    if not isinstance(cls.body, cst.IndentedBlock):
        return ""
    for item in cls.body.body:
        if not (isinstance(item, cst.FunctionDef) and item.name.value == "forward"):
            continue
        where = f"`{cls.name.value}.forward`"
        for call in facts.calls_in(item):
            what = host_read(facts, call)
            if what is not None and not under_flag(call, item):
                return f"{what} in {where} syncs with the host"
            if call.qualname in DEVICE_FACTORIES and not call.qualname.endswith("_like") and call.arg("device") is None:
                return f"`{call.qualname}(...)` in {where} makes a CPU tensor"
        tensors = tensor_params(item)
        for node in branches(item):
            if reads_tensor_value(facts, node.test, tensors):
                return f"a branch on a tensor's value in {where}"
    return ""


# -- shapes and gradients ---------------------------------------------------------------------------------


def _shape_reason(facts: ScriptFacts, models: Sequence[tuple[str, cst.Call | None]]) -> str:
    for call in facts.calls:
        if call.qualname in _VARYING_SHAPES:
            return f"`{call.qualname.rsplit('.', 1)[-1]}` makes batches of varying shape"
    pipeline = pipeline_facts(facts)
    for batch in pipeline.batch_loops:
        for site in batch.loaders:
            if site.has("collate_fn") or site.has("batch_sampler"):
                key = "collate_fn" if site.has("collate_fn") else "batch_sampler"
                return f"the loader's `{key}` may make batches of varying shape"
    return ""


def _gradient_reason(facts: ScriptFacts, models: Sequence[tuple[str, cst.Call | None]]) -> str:
    if accumulation_loops(facts):
        return "gradients accumulate over iterations, in memory the next replay overwrites"
    zero_grads = [call for call in facts.calls if call.method == "zero_grad"]
    if not zero_grads:
        return "no `zero_grad()`: gradients would accumulate in memory the next replay overwrites"
    for call in zero_grads:
        value = call.arg("set_to_none", 0)
        if value is not None and not (isinstance(value, cst.Name) and value.value == "True"):
            return "`zero_grad(set_to_none=...)` may keep gradients the next replay overwrites"
    return ""


# -- calls and outputs ----------------------------------------------------------------------------------------


def _outputs(facts: ScriptFacts, names: list[str]) -> GraphSafety:
    wanted = set(names)
    for call in facts.calls:
        if is_ddp(call.qualname) or is_dataparallel(call.qualname) or is_fsdp(call.qualname):
            return GraphSafety(False, "a data-parallel wrapper runs the model")
        if call.name in _HARMLESS_CALLEES:
            continue
        for arg in call.node.args:
            if isinstance(arg.value, (cst.Name, cst.Attribute)) and full_name(arg.value) in wanted:
                callee = call.name or "a call"
                return GraphSafety(False, f"`{full_name(arg.value)}` is passed to `{callee}`")
    calls = [call for call in facts.calls if call.name in wanted]
    if not calls:
        return GraphSafety(False, "no call of the compiled model was found")
    loops: list[cst.For | cst.While] = []
    for call in calls:
        loop = None
        for frame in call.ctx.chain():
            if frame.kind == "loop":
                loop = frame.node
                break
            if frame.kind not in ("with",):
                break
        if not isinstance(loop, (cst.For, cst.While)) or not isinstance(loop.body, cst.IndentedBlock):
            line = facts.line_of(call.node)
            return GraphSafety(False, f"`{call.name}` is called outside a loop body's top level (line {line})")
        if not any(loop is seen for seen in loops):
            loops.append(loop)
    for loop in loops:
        reason = _LoopOutputs(facts, wanted, loop).hazard()
        if reason:
            return GraphSafety(False, reason)
    return GraphSafety(True, "", tuple(loop.body.body[0] for loop in loops))  # type: ignore[union-attr]


class _LoopOutputs:
    """Walks a loop body twice (two iterations, one generation each) in source order, following which
    names hold memory of a compiled model's output (the output, a view of it, a tuple holding it)."""

    def __init__(self, facts: ScriptFacts, models: set[str], loop: cst.For | cst.While) -> None:
        self.facts, self.models, self.loop = facts, models, loop
        self.alias: dict[str, int] = {}  # name → the iteration whose outputs it holds
        self.origin: dict[str, str] = {}  # name → the model call it came from
        self.generation = 0
        self.reason = ""

    def hazard(self) -> str:
        body = self.loop.body.body  # type: ignore[union-attr]
        for generation in (1, 2):
            self.generation = generation
            self._block(body)
            if self.reason:
                return self.reason
        return self._after_loop()

    # statements

    def _block(self, statements) -> None:
        for statement in statements:
            if self.reason:
                return
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    self._small(small)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    self._expr(item.item)
                    if item.asname is not None:
                        self._bind(item.asname.name, None)
                self._suite(statement.body)
            elif isinstance(statement, cst.If):
                self._expr(statement.test)
                self._suite(statement.body)
                if statement.orelse is not None:
                    orelse = statement.orelse
                    if isinstance(orelse, cst.If):
                        self._block([orelse])
                    else:
                        self._suite(orelse.body)
            elif isinstance(statement, cst.For):
                self._bind(statement.target, self._expr(statement.iter))
                self._suite(statement.body)
            elif isinstance(statement, cst.While):
                self._expr(statement.test)
                self._suite(statement.body)
            elif isinstance(statement, cst.Try):
                self._suite(statement.body)
                for handler in statement.handlers:
                    self._suite(handler.body)
                for extra in (statement.orelse, statement.finalbody):
                    if extra is not None:
                        self._suite(extra.body)
            elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            else:
                self._reads_in(statement)

    def _suite(self, suite) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self._block(suite.body)
        else:
            for small in suite.body:
                self._small(small)

    def _small(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, cst.Assign):
            value = self._expr(small.value)
            for target in small.targets:
                self._bind(target.target, value)
        elif isinstance(small, cst.AnnAssign):
            value = self._expr(small.value) if small.value is not None else None
            self._bind(small.target, value)
        elif isinstance(small, cst.AugAssign):
            self._expr(small.value)
            self._expr(small.target)
        elif isinstance(small, cst.Expr):
            self._expr(small.value)
        elif isinstance(small, cst.Return):
            if small.value is not None and self._expr(small.value) is not None:
                self._fail(small.value, "is returned from its loop")
        else:
            self._reads_in(small)

    def _bind(self, target: cst.BaseExpression, value: int | None) -> None:
        if isinstance(target, cst.Name):
            if value is None:
                self.alias.pop(target.value, None)
            else:
                self.alias[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                inner = element.value.value if isinstance(element.value, cst.StarredElement) else element.value
                self._bind(inner, value)
        else:  # ``self.last = out``, ``cache[k] = out``: kept past the iteration
            self._expr(target)
            if value is not None:
                self._fail(target, "is kept in")

    # expressions: the iteration whose output memory the value holds (None: new memory or no tensor)

    def _expr(self, expr: cst.BaseExpression | None) -> int | None:
        if expr is None or self.reason:
            return None
        if isinstance(expr, cst.Name):
            held = self.alias.get(expr.value)
            if held is not None and held < self.generation:
                self._fail(expr, "is read in a later iteration")
            return held
        if isinstance(expr, cst.Attribute):
            held = self._expr(expr.value)
            return held if expr.attr.value in _VIEW_ATTRIBUTES else None
        if isinstance(expr, cst.Subscript):
            held = self._expr(expr.value)
            for element in expr.slice:
                self._reads_in(element)
            return held
        if isinstance(expr, cst.Call):
            return self._call(expr)
        if isinstance(expr, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison)):
            self._reads_in(expr)
            return None
        if isinstance(expr, (cst.SimpleString, cst.Integer, cst.Float, cst.Imaginary, cst.FormattedString,
                             cst.ConcatenatedString, cst.Lambda)):
            self._reads_in(expr)
            return None
        # tuples, lists, dicts, ``a or b``, ``x if c else y``, comprehensions: what they hold
        return self._oldest(self._names_in(expr))

    def _call(self, call: cst.Call) -> int | None:
        dotted = full_name(call.func)
        args = [self._expr(arg.value) for arg in call.args]
        if dotted in self.models:
            return self.generation
        if isinstance(call.func, cst.Attribute):
            receiver = self._expr(call.func.value)
            method = call.func.attr.value
            if method in _STORE_METHODS and any(a is not None for a in args):
                self._fail(call, "is kept in a container by")
                return None
            if method in _VIEW_METHODS or (method.endswith("_") and not method.startswith("_")):
                return receiver
            if method in _FRESH_METHODS:
                return None
            return self._oldest([receiver, *args])
        qualname = self.facts.qualname(call.func) or ""
        if qualname in _TORCH_VIEWS:
            return self._oldest(args)
        if qualname.startswith("torch.") or self._builds_torch_module(call.func):
            return None
        return self._oldest(args)

    def _builds_torch_module(self, func: cst.BaseExpression) -> bool:
        """``criterion(out, y)`` where ``criterion = nn.BCELoss()``: a torch loss makes new memory."""
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return False
        values = [v for v in self.facts.binding_values(func) if not isinstance(v, (cst.Name, cst.Attribute))]
        return bool(values) and all(
            isinstance(v, cst.Call) and (self.facts.qualname(v.func) or "").startswith("torch.") for v in values
        )

    def _names_in(self, expr: cst.CSTNode) -> list[int | None]:
        held: list[int | None] = []
        walker = self

        class _V(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                held.append(walker._expr(node))

            def visit_Attribute(self, node: cst.Attribute) -> bool:
                held.append(walker._expr(node))
                return False

            def visit_Call(self, node: cst.Call) -> bool:
                held.append(walker._call(node))
                return False

        expr.visit(_V())
        return held

    def _reads_in(self, node: cst.CSTNode) -> None:
        self._names_in(node)

    @staticmethod
    def _oldest(held: list[int | None]) -> int | None:
        values = [h for h in held if h is not None]
        return min(values) if values else None

    def _fail(self, node: cst.CSTNode, what: str) -> None:
        if self.reason:
            return
        code = " ".join(self.facts.code(node).split())
        code = code if len(code) <= 30 else code[:27] + "…"
        line = self.facts.line_of(node)
        if what == "is kept in":
            self.reason = f"a compiled model's output is kept in `{code}` (line {line})"
        elif what == "is kept in a container by":
            self.reason = f"a compiled model's output is kept in a container (line {line})"
        else:
            self.reason = f"a compiled model's output `{code}` {what} (line {line})"

    # after the loop

    def _after_loop(self) -> str:
        """An output still held when the loop ends may be read after it, unless another call of a
        compiled model (a new generation) comes first."""
        held = set(self.alias)
        if not held:
            return ""
        end = self.facts.position(self.loop).end.line
        scope = self._scope()
        later_calls = [
            self.facts.line_of(c.node) for c in self.facts.calls
            if c.name in self.models and self.facts.line_of(c.node) > end and contains(scope, c.node)
        ]
        first_call = min(later_calls) if later_calls else None
        for returned in _returns(scope):
            line = self.facts.line_of(returned)
            if line > end and any(n.value in held for n in nodes_of(returned, cst.Name)):
                return f"a compiled model's output is returned after its loop (line {line})"
        for node in nodes_of(scope, cst.Name):
            if node.value not in held:
                continue
            line = self.facts.line_of(node)
            if line > end and first_call is not None and line > first_call:
                return f"a compiled model's output `{node.value}` is read after other calls of it (line {line})"
        return ""

    def _scope(self) -> cst.CSTNode:
        for call in self.facts.calls:
            if call.name in self.models and contains(self.loop, call.node):
                return call.ctx.function or self.facts.module
        return self.facts.module


def _returns(node: cst.CSTNode) -> list[cst.Return]:
    """The ``return`` statements of ``node``'s own body (not of functions defined in it)."""
    out: list[cst.Return] = []

    class _V(cst.CSTVisitor):
        def visit_Return(self, n: cst.Return) -> None:
            out.append(n)

        def visit_FunctionDef(self, n: cst.FunctionDef) -> bool:
            return n is node

    node.visit(_V())
    return out
