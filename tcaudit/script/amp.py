"""Mixed-precision facts derived from :class:`ScriptFacts`, shared by the TC2 rules:
which autocast contexts exist and in which dtype, whether a training step runs under one, how the
model is cast, and which precision a fix should use."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.script.facts import AUTOCAST_QUALNAMES, CallSite, ScriptFacts, TrainingStep

HALF = "float16"
BF16 = "bfloat16"
UNKNOWN = "unknown"

_DTYPE_NAMES = {
    "torch.float16": HALF,
    "torch.half": HALF,
    "torch.bfloat16": BF16,
    "torch.float32": "float32",
    "torch.float": "float32",
    "torch.float64": "float64",
    "torch.double": "float64",
}
_DTYPE_STRINGS = {"float16": HALF, "fp16": HALF, "half": HALF, "bfloat16": BF16, "bf16": BF16}


def dtypes_of(facts: ScriptFacts, expr: cst.BaseExpression | None) -> frozenset[str]:
    """The dtypes an expression may denote (following names and conditionals); UNKNOWN if unsure."""
    if expr is None:
        return frozenset({UNKNOWN})
    out: set[str] = set()
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue  # its branches are among the values
        if isinstance(value, (cst.Name, cst.Attribute)):
            qual = facts.qualname(value)
            if qual in _DTYPE_NAMES:
                out.add(_DTYPE_NAMES[qual])
            elif not facts.bindings_of(get_full_name_for_node(value) or ""):
                out.add(UNKNOWN)
        elif isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            out.add(_DTYPE_STRINGS.get(str(text), UNKNOWN))
        else:
            out.add(UNKNOWN)
    return frozenset(out or {UNKNOWN})


@dataclass(frozen=True)
class AutocastSite:
    call: CallSite
    device: str | None  # "cuda", "cpu", or None when not a literal
    dtypes: frozenset[str]
    enabled_literal_false: bool


def _device_of(facts: ScriptFacts, call: CallSite) -> str | None:
    qual = call.qualname or ""
    if qual.startswith("torch.cuda."):
        return "cuda"
    if qual.startswith("torch.cpu."):
        return "cpu"
    expr = call.arg("device_type", 0)
    if isinstance(expr, cst.SimpleString):
        return str(expr.evaluated_value).split(":")[0]
    return None


def _autocast_site(facts: ScriptFacts, call: CallSite, args_from: cst.Call | None = None) -> AutocastSite:
    node = args_from or call.node
    proxy = CallSite(node, call.name, call.qualname, call.ctx, call.statement)
    device = _device_of(facts, call if args_from is None else proxy)
    dtype_expr = None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "dtype":
            dtype_expr = arg.value
    if dtype_expr is None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        skip = 0 if (call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) else 1
        if args_from is not None:
            skip += 1  # partial(torch.autocast, "cuda", torch.float16): first arg is the callable
        if len(positional) > skip and (call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) is False:
            candidate = positional[skip].value
            if not (isinstance(candidate, cst.Name) and candidate.value in ("True", "False")):
                dtype_expr = candidate
    if dtype_expr is not None:
        dtypes = dtypes_of(facts, dtype_expr)
    elif any(arg.star for arg in node.args):
        dtypes = frozenset({UNKNOWN})
    elif device == "cuda":
        dtypes = frozenset({HALF})
    elif device == "cpu":
        dtypes = frozenset({BF16})
    else:
        dtypes = frozenset({UNKNOWN})
    enabled = None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "enabled":
            enabled = arg.value
    disabled = isinstance(enabled, cst.Name) and enabled.value == "False"
    return AutocastSite(call, device, dtypes, disabled)


class AmpFacts:
    """Per-file AMP analysis; build once per file with :func:`amp_facts`."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts

    @functools.cached_property
    def autocast_sites(self) -> list[AutocastSite]:
        facts = self.facts
        sites = []
        for call in facts.calls:
            qual = call.qualname or ""
            if qual in AUTOCAST_QUALNAMES:
                sites.append(_autocast_site(facts, call))
            elif (qual == "functools.partial" or call.name == "partial") and call.node.args:
                target = facts.qualname(call.node.args[0].value)
                if target in AUTOCAST_QUALNAMES:
                    proxy = CallSite(call.node, call.name, target, call.ctx, call.statement)
                    sites.append(_autocast_site(facts, proxy, args_from=call.node))
        return sites

    @functools.cached_property
    def training_autocast_sites(self) -> list[AutocastSite]:
        return [s for s in self.autocast_sites if not self.facts.in_eval(s.call.ctx) and not s.enabled_literal_false]

    @functools.cached_property
    def autocast_dtypes(self) -> frozenset[str]:
        out: set[str] = set()
        for site in self.training_autocast_sites:
            out |= site.dtypes
        return frozenset(out)

    @functools.cached_property
    def has_indirect_autocast(self) -> bool:
        """Autocast used in a way this analysis cannot place (``ctx.__enter__()``, an ExitStack,
        passed to a helper): treat every step as possibly covered rather than guess."""
        facts = self.facts
        with_items: set[int] = set()
        for node, _ in facts.withs:
            for item in node.items:
                with_items.add(id(item.item))
                if isinstance(item.item, cst.Call):
                    with_items.add(id(item.item.func))
        for fn, _ in facts.functions:
            for dec in fn.decorators:
                with_items.add(id(dec.decorator))
        binding_values = {id(b.value) for b in facts.bindings}
        for site in self.autocast_sites:
            node = site.call.node
            if id(node) in with_items or facts.in_eval(site.call.ctx):
                continue
            if id(node) in binding_values:
                continue  # ``ctx = autocast(...)``: its ``with ctx`` use is resolved through the binding
            if self._is_partial_or_returned(site.call):
                continue
            return True
        return False

    def _is_partial_or_returned(self, call: CallSite) -> bool:
        """``return torch.autocast(...)`` in a helper, or an assignment: resolved through the
        helper's callers or the binding, so not an unplaceable use."""
        statement = call.statement.node if call.statement else None
        if isinstance(statement, cst.SimpleStatementLine):
            return any(isinstance(small, (cst.Return, cst.Assign, cst.AnnAssign)) for small in statement.body)
        return isinstance(statement, cst.Return)

    def step_is_covered(self, step: TrainingStep) -> bool:
        facts = self.facts
        if self.has_indirect_autocast:
            return True
        if facts.in_autocast(step.ctx):
            return True
        function = step.function
        related = {function} | facts.reachable_functions(function)
        if function is not None:
            # Callers that run this step under autocast (``with autocast(): self.train_step(b)``).
            frontier = [function]
            seen = {function}
            for _ in range(3):
                nxt = []
                for fn in frontier:
                    for caller in facts.callers(fn):
                        if facts.in_autocast(caller.ctx):
                            return True
                        outer = caller.ctx.function
                        if outer is not None and outer not in seen:
                            seen.add(outer)
                            nxt.append(outer)
                frontier = nxt
        if any(fn in self._functions_around_autocast for fn in related):
            return True
        for fn in related:
            if fn is not None and facts.function_has_autocast_decorator(fn):
                return True
        return self._forward_runs_under_autocast

    @functools.cached_property
    def _functions_around_autocast(self) -> set[cst.FunctionDef | None]:
        """Every function that holds an autocast ``with`` (outside eval paths), at any depth; None
        when one is at module level. Computed once: checking each step against each ``with`` made
        files of many steps quadratic."""
        out: set[cst.FunctionDef | None] = set()
        for _node, ctx in self.facts.autocast_withs:
            if self.facts.in_eval(ctx):
                continue
            out.add(ctx.function)
            out.update(frame.node for frame in ctx.chain() if frame.kind == "def")  # type: ignore[misc]
        return out

    @functools.cached_property
    def _forward_runs_under_autocast(self) -> bool:
        """A model whose own forward runs under autocast covers every step that calls it."""
        for _node, ctx in self.facts.autocast_withs:
            outer = ctx.function
            if outer is not None and outer.name.value == "forward":
                return True
        return False

    @functools.cached_property
    def half_model_casts(self) -> list[CallSite]:
        """Calls that cast the whole trained model to fp16/bf16 (``model.half()``, ``.to(torch.float16)``)."""
        facts = self.facts
        out = []
        for call in facts.calls:
            dtype = cast_dtype(facts, call)
            if dtype not in (HALF, BF16):
                continue
            if facts.in_eval(call.ctx):
                continue
            if is_model_expr(facts, call) and not self._cast_back_to_fp32(call):
                out.append(call)
        return out

    def _cast_back_to_fp32(self, call: CallSite) -> bool:
        """``model.half().float()``, ``model.bfloat16().to(torch.float32)``, or ``model.half()`` then
        ``model.float()`` later in the same block: the weights are rounded to 16 bits once and then
        trained in fp32, which is not half-precision training."""
        facts = self.facts
        outer = self._fp32_casts_by_receiver.get(id(call.node))
        if outer is not None:
            return True
        name = _cast_model_name(call)
        statement = call.statement
        if name is None or statement is None:
            return False
        # Not when training happens in between: ``model.half()``, the loop, then ``model.float()`` to
        # save the weights trained in fp16.
        backward_lines = [facts.line_of(step.backward.node) for step in facts.training_steps]
        for later in self._fp32_casts_by_receiver.values():
            if later.statement is None or later.statement.block is not statement.block:
                continue
            if later.statement.index <= statement.index or _cast_model_name(later) != name:
                continue
            first, last = facts.line_of(call.node), facts.line_of(later.node)
            if not any(first < line < last for line in backward_lines):
                return True
        return False

    @functools.cached_property
    def _fp32_casts_by_receiver(self) -> dict[int, CallSite]:
        """Casts to fp32 (``.float()``, ``.to(torch.float32)``), by the id of the expression they cast,
        seen through device moves (``x.half().cuda().float()``)."""
        out: dict[int, CallSite] = {}
        for call in self.facts.calls:
            if not _casts_to_fp32(self.facts, call):
                continue
            receiver = call.receiver
            while True:
                if receiver is not None:
                    out[id(receiver)] = call
                if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) \
                        and receiver.func.attr.value in ("to", "cuda", "cpu", "train") \
                        and not any(a.keyword is not None and a.keyword.value == "dtype" for a in receiver.args):
                    receiver = receiver.func.value
                    continue
                break
        return out

    @functools.cached_property
    def double_model(self) -> bool:
        return any(
            cast_dtype(self.facts, call) == "float64" and is_model_expr(self.facts, call) for call in self.facts.calls
        ) or any(
            (c.qualname or "") == "torch.set_default_dtype" and c.node.args
            and dtypes_of(self.facts, c.node.args[0].value) == frozenset({"float64"})
            for c in self.facts.calls
        )

    @functools.cached_property
    def uses_lbfgs(self) -> bool:
        return any((c.qualname or "").endswith("optim.LBFGS") for c in self.facts.calls)

    @functools.cached_property
    def has_optimizer(self) -> bool:
        return bool(self.facts.optimizer_steps) or bool(self.facts.optimizers)

    @functools.cached_property
    def is_conv_model(self) -> bool:
        facts = self.facts
        for call in facts.calls:
            qual = call.qualname or ""
            if qual.startswith("torch.nn.Conv") or qual.startswith("torchvision.models") and any(
                key in qual for key in ("resnet", "resnext", "vgg", "efficientnet", "mobilenet", "regnet",
                                        "convnext", "densenet", "inception", "googlenet", "squeezenet",
                                        "shufflenet", "mnasnet", "alexnet", "wide_resnet")
            ):
                return True
        return any("torchvision.models" in (r.qualname or "") for r in facts.references) and not any(
            "vit" in (r.qualname or "") or "swin" in (r.qualname or "") for r in facts.references
        )

    def recommended_precision(self, setting: str, convnet: bool | None = None) -> tuple[str, bool, str]:
        """(dtype, needs GradScaler, why) for a TC201 fix under ``precision = setting``; ``convnet`` is the
        model audit's verdict on the trained model (None: judge from the script's text)."""
        if setting == "bf16":
            return BF16, False, "precision = bf16 in the configuration"
        if setting == "fp16":
            if self.uses_lbfgs or not self.has_optimizer:
                return BF16, False, "fp16 needs a GradScaler, which cannot drive an LBFGS closure or manual updates"
            return HALF, True, "precision = fp16 in the configuration"
        if self.uses_lbfgs or not self.has_optimizer:
            return BF16, False, "bf16 needs no GradScaler (LBFGS closures and manual updates cannot use one)"
        if self.is_conv_model if convnet is None else convnet:
            return HALF, True, (
                "convnet: eager fp16 + channels_last trained ResNet50 faster than bf16"
            )
        return BF16, False, "bf16 keeps fp32's range: no GradScaler, no overflow in large activations"


def cast_dtype(facts: ScriptFacts, call: CallSite) -> str | None:
    method = call.method
    if method == "half" and not call.node.args:
        return HALF
    if method == "bfloat16" and not call.node.args:
        return BF16
    if method == "double" and not call.node.args:
        return "float64"
    if method in ("to", "type"):
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value not in ("dtype",):
                continue
            found = dtypes_of(facts, arg.value)
            for dtype in (HALF, BF16, "float64"):
                if found == frozenset({dtype}):
                    return dtype
            text = get_full_name_for_node(arg.value) or ""
            if text.endswith("HalfTensor"):
                return HALF
    return None


def _casts_to_fp32(facts: ScriptFacts, call: CallSite) -> bool:
    if call.method == "float" and not call.node.args:
        return True
    if call.method in ("to", "type"):
        return any(
            (arg.keyword is None or arg.keyword.value == "dtype") and dtypes_of(facts, arg.value) == frozenset({"float32"})
            for arg in call.node.args
        )
    return False


def _cast_model_name(call: CallSite) -> str | None:
    """The name a model cast works on: its receiver (``model`` of ``model.cuda().half()``) or, for
    ``model = Net().half()``, the name it binds."""
    receiver = call.receiver
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    if isinstance(receiver, (cst.Name, cst.Attribute)):
        return get_full_name_for_node(receiver)
    statement = call.statement.node if call.statement else None
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return get_full_name_for_node(small.targets[0].target)
    return None


def is_model_expr(facts: ScriptFacts, call: CallSite) -> bool:
    """Whether the cast call's receiver is the trained model (not an input tensor)."""
    receiver = call.receiver
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        inner = receiver.func.attr.value
        if inner in ("to", "cuda", "cpu", "half", "float", "train"):
            receiver = receiver.func.value
            continue
        break
    name = get_full_name_for_node(receiver) if receiver is not None else None
    if name and name in facts.model_names:
        return True
    if isinstance(receiver, cst.Call):
        statement = call.statement.node if call.statement else None
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    for target in small.targets:
                        if get_full_name_for_node(target.target) in facts.model_names:
                            return True
    return False


def amp_facts(facts: ScriptFacts) -> AmpFacts:
    cached = getattr(facts, "_amp_facts", None)
    if cached is None:
        cached = AmpFacts(facts)
        facts._amp_facts = cached  # type: ignore[attr-defined]
    return cached
