"""Layer widths a training script sets as literals, for the script halves of TC101 and TC102.

The model audit measures the built model and reports every GEMM and convolution whose width misses
the 16-byte alignment, with no fix: the padded width belongs in the script. This module finds the
widths the script itself controls and where padding one cannot reach the data or the loss:

- the sources: a module constant (``hidden = 500``), an argparse default (``--hidden``, default 500,
  read as ``args.hidden``), a parameter default of a model class of this file (``def __init__(self,
  hidden=500)``) that no construction overrides, or the literal between two layers (``nn.Linear(784,
  500)`` then ``nn.Linear(500, 10)``);
- the layers: ``nn.Linear``, ``nn.Conv1d/2d/3d``, and the norms in between that take the same size
  (``BatchNorm1d/2d/3d``, ``LayerNorm``, ``GroupNorm``), in the order an ``nn.Sequential`` lists them
  or the order a model class's ``forward`` calls its ``self.<layer>`` (a call's end, so
  ``self.b(self.a(x))`` runs ``a`` first).

A width is INTERNAL when every layer that produces it is followed by a layer that consumes it (norms
pass it on) and every layer that consumes it follows one that produces it: then padding it adds
units the model's input and output never see. Everything else declines: the model's input or output
width, a checkpoint load (its tensors have the old shape), the name used anywhere but as a layer's
width (``x.view(-1, hidden)``, ``torch.zeros(hidden)``, ``nn.Embedding(v, hidden)``; reporting it
is fine), a width computed from others (``hidden = 4 * dim``), a GroupNorm whose group count does
not divide the padded size, a grouped convolution, a model class defined in another file, and a
layer whose neighbours tcaudit cannot tell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Iterator, Sequence

import libcst as cst

from tcaudit.config import PAD_DIMS
from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.model.cost import suggest
from tcaudit.rules.base import ScriptRule
from tcaudit.script.expressions import CHECKPOINT_LOAD, REPORTING_CALL, flag_dest, literal, numeric_constant
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.syntax import full_name, keyword, nodes_of, parent_map

if TYPE_CHECKING:
    from tcaudit.rules.base import RuleContext

ALIGNMENT = 8  # elements: 16 bytes of bf16/fp16, TC101's and TC102's alignment
# Narrower layers are too small for their GEMMs to be bound by the Tensor Cores: padding buys nothing.
MIN_WIDTH = 16

_LINEAR = {"Linear": ((0, "in_features"), (1, "out_features"))}
_CONV = {name: ((0, "in_channels"), (1, "out_channels")) for name in ("Conv1d", "Conv2d", "Conv3d")}
_NORM = {
    "BatchNorm1d": (0, "num_features"), "BatchNorm2d": (0, "num_features"), "BatchNorm3d": (0, "num_features"),
    "LayerNorm": (0, "normalized_shape"), "GroupNorm": (1, "num_channels"),
}
# Layers that keep the width they are given (elementwise, dropout, pooling, flattening a 1x1 map).
_NEUTRAL = frozenset({
    "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "LeakyReLU", "ELU", "SELU", "Hardswish",
    "Hardsigmoid", "PReLU", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Identity",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "Flatten", "Upsample",
})
_SHAPE_METHODS = frozenset({"view", "reshape", "expand", "new_zeros", "new_empty", "new_full", "unflatten",
                            "repeat", "narrow", "split", "chunk", "resize_"})
_VOCAB = re.compile(r"vocab|token|embed|head", re.IGNORECASE)


def padded_width(width: int) -> int:
    """What ``fix --pad-dims`` writes for a width: the model audit's own suggestion for a 16-bit layer
    (:func:`tcaudit.model.cost.suggest`), so the message and the fix name one size."""
    return suggest(width, "bfloat16")


def unaligned(width: int) -> bool:
    return width >= MIN_WIDTH and width % ALIGNMENT != 0


@dataclass(frozen=True, eq=False)
class PadWidth(FixPlan):
    kind = "replace-literal"
    literals: tuple[cst.Integer, ...]
    width: int
    padded: int
    lines: tuple[int, ...]


@dataclass(frozen=True)
class Layer:
    call: cst.Call
    kind: str  # "linear", "conv", "norm", "neutral", "opaque"
    name: str  # the layer's class name (``Linear``), or the code of an opaque one
    width_in: cst.BaseExpression | None = None
    width_out: cst.BaseExpression | None = None


@dataclass
class Use:
    """A width argument of a layer call that carries the width: ``role`` is in, out or through (a norm)."""

    expr: cst.BaseExpression
    layer: Layer


@dataclass
class Width:
    """A width the script sets, what it feeds, and why it cannot be padded (if it cannot)."""

    label: str  # how the messages name it: ``hidden``, ``args.hidden``, ``the literal 30``
    literal: cst.Integer  # where the finding points
    value: int
    edits: tuple[cst.Integer, ...]  # the literals the fix replaces
    uses: list[Use] = field(default_factory=list)
    problem: str | None = None
    inline: bool = False  # the literal written in the layers themselves, not a name the script sets

    @property
    def rule(self) -> str:
        return "TC102" if any(use.layer.kind == "conv" for use in self.uses) else "TC101"

    def internal_shaped(self) -> bool:
        """Produced by one layer and consumed by another somewhere (the model's own hidden size)."""
        roles = {_role(use) for use in self.uses if use.layer.kind in ("linear", "conv")}
        return {"in", "out"} <= roles


def _role(use: Use) -> str:
    if use.layer.kind == "norm":
        return "through"
    return "out" if use.expr is use.layer.width_out else "in"


# -- the model's layers --------------------------------------------------------------------------------


class _Model:
    """Every layer call of the file, its chain (the layers in the order they run), and its place in it."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts
        self.layers: dict[int, Layer] = {}
        self.place: dict[int, tuple[list[Layer], int]] = {}
        for site in facts.calls:
            layer = self._layer(site.node)
            if layer is not None and layer.kind != "opaque":
                self.layers[id(site.node)] = layer
        expanded: set[int] = set()
        for cls, _ in facts.classes:
            chain = self._class_chain(cls, expanded)
            self._place(chain)
        for site in facts.calls:
            if self._is(site.node, "Sequential") and id(site.node) not in expanded:
                self._place(self._expand(site.node, expanded))

    def _is(self, call: cst.Call, name: str) -> bool:
        qual = self.facts.qualname(call.func) or ""
        return qual.startswith("torch.nn.") and qual.split(".")[-1] == name

    def _layer(self, node: cst.BaseExpression) -> Layer | None:
        if not isinstance(node, cst.Call):
            return None
        qual = self.facts.qualname(node.func) or ""
        short = qual.split(".")[-1]
        code = self.facts.code(node.func)
        if not qual.startswith("torch.nn."):
            return Layer(node, "opaque", code)
        if short in _LINEAR or short in _CONV:
            (ip, ik), (op, ok) = (_LINEAR | _CONV)[short]
            kind = "linear" if short in _LINEAR else "conv"
            return Layer(node, kind, short, _argument(node, ip, ik), _argument(node, op, ok))
        if short in _NORM:
            through = _argument(node, *_NORM[short])
            return Layer(node, "norm", short, through, through)
        if short in _NEUTRAL:
            return Layer(node, "neutral", short)
        return Layer(node, "opaque", code)

    def _expand(self, node: cst.BaseExpression, expanded: set[int]) -> list[Layer]:
        if isinstance(node, cst.Call) and self._is(node, "Sequential"):
            expanded.add(id(node))
            out: list[Layer] = []
            for arg in node.args:
                if arg.keyword is not None or arg.star:
                    out.append(Layer(node, "opaque", "nn.Sequential(*...)"))
                else:
                    out.extend(self._expand(arg.value, expanded))
            return out
        layer = self._layer(node)
        if layer is None:
            return [Layer(node, "opaque", self.facts.code(node))]  # type: ignore[arg-type]
        return [self.layers.get(id(node), layer)]

    def _class_chain(self, cls: cst.ClassDef, expanded: set[int]) -> list[Layer]:
        """The layers ``forward`` calls, in the order its calls end; [] when it has none."""
        methods = {
            statement.name.value: statement for statement in cls.body.body
            if isinstance(statement, cst.FunctionDef)
        } if isinstance(cls.body, cst.IndentedBlock) else {}
        init, forward = methods.get("__init__"), methods.get("forward")
        if init is None or forward is None:
            return []
        built: dict[str, cst.Call] = {}
        for assign in nodes_of(init, cst.Assign):
            for target in assign.targets:
                dotted = full_name(target.target) or ""
                if dotted.startswith("self.") and dotted.count(".") == 1 and isinstance(assign.value, cst.Call):
                    built[dotted[5:]] = assign.value
        called = []
        for call in nodes_of(forward, cst.Call):
            dotted = full_name(call.func) or ""
            if dotted.startswith("self.") and dotted[5:] in built:
                called.append((self.facts.position(call).end, dotted[5:]))
        order = list(dict.fromkeys(attr for _, attr in sorted(called, key=lambda item: (item[0].line, item[0].column))))
        chain: list[Layer] = []
        for attr in order:
            chain.extend(self._expand(built[attr], expanded))
        return chain

    def _place(self, chain: list[Layer]) -> None:
        for index, layer in enumerate(chain):
            if layer.kind in ("linear", "conv", "norm") and id(layer.call) not in self.place:
                self.place[id(layer.call)] = (chain, index)


def _argument(call: cst.Call, position: int, key: str) -> cst.BaseExpression | None:
    """The value ``call`` passes as ``key=``, or else at ``position``."""
    given = keyword(call, key, position)
    return given.value if given is not None else None


# -- the widths -----------------------------------------------------------------------------------------


def script_widths(facts: ScriptFacts) -> list[Width]:
    """The unaligned widths this training script sets and feeds to a layer's output and another's input."""
    if not facts.training_steps:
        return []
    model = _Model(facts)
    if not model.layers:
        return []
    parents = parent_map(facts.module)
    found = [*_named_widths(facts, model, parents), *_literal_widths(facts, model)]
    return [w for w in found if unaligned(w.value) and w.internal_shaped()]


def _constant_value(facts: ScriptFacts, expr: cst.BaseExpression | None) -> int | None:
    """The value of an integer expression of literals and module constants (``4 * DIM``), if it has one."""
    value = numeric_constant(facts, expr)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _named_widths(facts: ScriptFacts, model: _Model, parents: dict[int, cst.CSTNode]) -> Iterator[Width]:
    module = facts.module
    # Module constants: ``hidden = 500`` (or computed: ``hidden = 4 * dim``), bound once.
    for binding in facts.bindings:
        if binding.ctx.function is not None or binding.ctx.class_def is not None or "." in binding.target:
            continue
        if len(facts.bindings_of(binding.target)) != 1 or _VOCAB.search(binding.target):
            continue
        value = _constant_value(facts, binding.value)
        if value is None:
            continue
        refs = [
            n for n in nodes_of(module, cst.Name)
            if n.value == binding.target and not _is_binding_name(n, parents)
        ]
        anchor = binding.value if isinstance(binding.value, cst.Integer) else None
        width = Width(binding.target, anchor or _first_integer(binding.value), value, (anchor,) if anchor else ())
        if anchor is None:
            if width.literal is None:
                continue
            width.problem = (
                f"`{binding.target}` is computed (`{module.code_for_node(binding.value).strip()}`); "
                "pad the widths it is computed from by hand"
            )
        _follow(facts, model, parents, width, refs, 0)
        yield width
    # argparse defaults: ``parser.add_argument("--hidden", type=int, default=500)``, read as ``args.hidden``.
    flags: dict[str, list] = {}
    for site in facts.calls:
        if site.method == "add_argument":
            dest = flag_dest(site.node)
            if dest:
                flags.setdefault(dest, []).append(site)
    for dest, sites in flags.items():
        default = keyword(sites[0].node, "default")
        if len(sites) != 1 or default is None or not isinstance(default.value, cst.Integer) or _VOCAB.search(dest):
            continue
        refs = [n for n in nodes_of(module, cst.Attribute) if n.attr.value == dest]
        width = Width(f"--{dest.replace('_', '-')}", default.value, literal(default.value), (default.value,))
        _follow(facts, model, parents, width, refs, 0)
        yield width
    # A model class's parameter default that no construction of the class overrides.
    for cls, _ in facts.classes:
        init = _init_of(cls)
        if init is None:
            continue
        params = [*init.params.posonly_params, *init.params.params][1:]
        for index, param in enumerate(params):
            if not isinstance(param.default, cst.Integer) or _VOCAB.search(param.name.value):
                continue
            if _overridden(facts, cls.name.value, param.name.value, index):
                continue
            refs = [n for n in nodes_of(init.body, cst.Name) if n.value == param.name.value
                    and not _is_binding_name(n, parents)]
            width = Width(param.name.value, param.default, literal(param.default), (param.default,))
            _follow(facts, model, parents, width, refs, 0)
            yield width


def _first_integer(expr: cst.BaseExpression) -> cst.Integer | None:
    found = nodes_of(expr, cst.Integer)
    return found[0] if found else None


def _is_binding_name(node: cst.Name, parents: dict[int, cst.CSTNode]) -> bool:
    """The name being bound or spelled as a keyword or attribute, not a read of it."""
    parent = parents.get(id(node))
    if isinstance(parent, cst.AssignTarget) and parent.target is node:
        return True
    if isinstance(parent, cst.Param) and parent.name is node:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    return isinstance(parent, cst.Attribute) and parent.attr is node


def _init_of(cls: cst.ClassDef) -> cst.FunctionDef | None:
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    inits = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"]
    return inits[0] if len(inits) == 1 else None


def _class_named(facts: ScriptFacts, name: str) -> cst.ClassDef | None:
    classes = [cls for cls, _ in facts.classes if cls.name.value == name]
    return classes[0] if len(classes) == 1 else None


def _overridden(facts: ScriptFacts, cls: str, param: str, index: int) -> bool:
    """Whether a construction of ``cls`` in this file passes ``param`` (by keyword, by position, or maybe
    through ``*args``/``**kwargs``)."""
    for site in facts.calls:
        if full_name(site.node.func) != cls:
            continue
        positional = [a for a in site.node.args if a.keyword is None and not a.star]
        if any(a.star for a in site.node.args) or len(positional) > index:
            return True
        if keyword(site.node, param) is not None:
            return True
    return False


def _follow(facts: ScriptFacts, model: _Model, parents: dict[int, cst.CSTNode], width: Width,
            refs: Sequence[cst.BaseExpression], depth: int) -> None:
    """Sort each read of the width into a layer's width argument (a use), a report (fine), a pass into a
    model class of this file (followed to its parameter), or anything else (the problem)."""
    for ref in refs:
        if _in_report(facts, ref, parents):
            continue
        parent = parents.get(id(ref))
        call = parents.get(id(parent)) if isinstance(parent, cst.Arg) else None
        if isinstance(call, cst.Call) and isinstance(parent, cst.Arg) and parent.value is ref:
            layer = model.layers.get(id(call))
            if layer is not None and layer.kind in ("linear", "conv", "norm") and any(ref is w for w in (layer.width_in, layer.width_out)):
                width.uses.append(Use(ref, layer))
                continue
            if _into_class(facts, model, parents, width, call, parent, depth):
                continue
        if width.problem is None:
            statement = _enclosing_call(ref, parents)
            width.problem = (
                f"`{width.label}` also feeds `{facts.code(statement).strip().splitlines()[0]}` "
                f"(line {facts.line_of(ref)}), not only layer widths; pad by hand"
            )


def _into_class(facts: ScriptFacts, model: _Model, parents: dict[int, cst.CSTNode], width: Width,
                call: cst.Call, arg: cst.Arg, depth: int) -> bool:
    """``MLP(784, args.hidden, 10)``: the width reaches the class's ``__init__`` parameter; its reads there
    are followed in turn. A class of another file cannot be followed: the problem says so."""
    callee = full_name(call.func) or ""
    cls = _class_named(facts, callee) if "." not in callee else None
    if cls is None:
        qual = facts.qualname(call.func) or ""
        if callee[:1].isupper() and not qual.startswith("torch."):
            width.problem = width.problem or (
                f"`{width.label}` reaches `{callee}`, a model class defined in another file (line "
                f"{facts.line_of(call)}): its layers are not in this file; pad by hand"
            )
            return True
        return False
    init = _init_of(cls)
    if init is None or depth > 2 or any(a.star for a in call.args):
        return False
    params = [*init.params.posonly_params, *init.params.params][1:]
    if arg.keyword is not None:
        names = [p.name.value for p in params if p.name.value == arg.keyword.value]
    else:
        index = [a for a in call.args if a.keyword is None].index(arg)
        names = [params[index].name.value] if index < len(params) else []
    if not names:
        return False
    if any(b.target == names[0] for b in facts.bindings if b.ctx.function is init):
        return False  # reassigned inside ``__init__``: not the value passed
    refs = [n for n in nodes_of(init.body, cst.Name) if n.value == names[0] and not _is_binding_name(n, parents)]
    _follow(facts, model, parents, width, refs, depth + 1)
    return True


def _in_report(facts: ScriptFacts, node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> bool:
    current = parents.get(id(node))
    while current is not None and not isinstance(current, cst.BaseStatement):
        if isinstance(current, cst.Call):
            name = full_name(current.func) or ""
            qual = facts.qualname(current.func) or ""
            if REPORTING_CALL.search(name) and not qual.startswith(("math.", "torch.", "numpy.")):
                return True
        current = parents.get(id(current))
    return False


def _enclosing_call(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """The innermost call around ``node``, else its statement: what the message quotes."""
    current = parents.get(id(node))
    while current is not None:
        if isinstance(current, (cst.Call, cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return current
        current = parents.get(id(current))
    return node


def _literal_widths(facts: ScriptFacts, model: _Model) -> Iterator[Width]:
    """``nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 10)``: the same literal out of one layer and into
    the next (norms in between taking it too) is one width, padded in all those places."""
    seen: set[int] = set()
    for chain, index in list(model.place.values()):
        layer = chain[index]
        if layer.kind not in ("linear", "conv") or not isinstance(layer.width_out, cst.Integer):
            continue
        if id(layer.width_out) in seen:
            continue
        value = literal(layer.width_out)
        edits: list[cst.Integer] = [layer.width_out]
        uses = [Use(layer.width_out, layer)]
        for after in chain[index + 1:]:
            if after.kind == "neutral":
                continue
            if after.kind == "norm" and isinstance(after.width_in, cst.Integer) and literal(after.width_in) == value:
                edits.append(after.width_in)
                uses.append(Use(after.width_in, after))
                continue
            if after.kind in ("linear", "conv") and isinstance(after.width_in, cst.Integer) and literal(after.width_in) == value:
                edits.append(after.width_in)
                uses.append(Use(after.width_in, after))
                seen.update(id(e) for e in edits)
                yield Width(str(value), layer.width_out, value, tuple(edits), uses, inline=True)
            break


# -- the plan -----------------------------------------------------------------------------------------


def plan_padding(facts: ScriptFacts, width: Width) -> PadWidth:
    """The literals to pad; raises :class:`DeclineFix` with the first reason it would not be safe."""
    for site in facts.calls:
        if CHECKPOINT_LOAD.search(site.name or "") or site.qualname == "torch.load":
            raise DeclineFix(
                f"the file loads weights (`{facts.code(site.node.func)}(...)` at line "
                f"{facts.line_of(site.node)}) whose tensors have the width {width.value}; pad by hand or not at all"
            )
    if width.problem:
        raise DeclineFix(width.problem)
    target = padded_width(width.value)
    model = _Model(facts)
    uses = {id(use.expr) for use in width.uses}
    for use in width.uses:
        _check_neighbours(facts, model, width, use, uses, target)
    if width.inline:
        _check_same_value_elsewhere(facts, width)
    return PadWidth(width.edits, width.value, target, tuple(sorted(facts.line_of(n) for n in width.edits)))


def _check_neighbours(facts: ScriptFacts, model: _Model, width: Width, use: Use, uses: set[int], target: int) -> None:
    layer = use.layer
    code = facts.code(layer.call).strip()
    line = facts.line_of(layer.call)
    place = model.place.get(id(layer.call))
    if place is None:
        raise DeclineFix(
            f"cannot tell which layers run before and after `{code}` (line {line}); pad `{width.label}` by hand"
        )
    if layer.kind == "conv":
        groups = _argument(layer.call, 6, "groups")
        if groups is not None and literal(groups) != 1:
            raise DeclineFix(f"`{code}` (line {line}) is a grouped convolution; pad `{width.label}` by hand")
    if layer.name == "GroupNorm":
        groups = literal(_argument(layer.call, 0, "num_groups"))
        if not isinstance(groups, int) or groups <= 0 or target % groups:
            raise DeclineFix(
                f"`{code}` (line {line}) splits the width into groups that would not divide {target}; "
                f"pad `{width.label}` by hand"
            )
    chain, index = place
    role = _role(use)
    if role in ("out", "through"):
        _walk(chain, range(index + 1, len(chain)), "width_in", width, uses, code, line, "output")
    if role in ("in", "through"):
        _walk(chain, range(index - 1, -1, -1), "width_out", width, uses, code, line, "input")


def _walk(chain: list[Layer], indices: range, side: str, width: Width, uses: set[int], code: str, line: int,
          end: str) -> None:
    """From a layer towards the model's input or output: the next layer must take (or have made) the same width."""
    for index in indices:
        other = chain[index]
        if other.kind == "neutral":
            continue
        if other.kind == "opaque":
            raise DeclineFix(
                f"`{other.name}` next to `{code}` (line {line}) is not a layer tcaudit follows; pad `{width.label}` by hand"
            )
        if id(getattr(other, side)) not in uses:
            raise DeclineFix(
                f"`{other.name}` next to `{code}` (line {line}) does not take `{width.label}` as its width; "
                "pad by hand"
            )
        if other.kind != "norm":
            return
    raise DeclineFix(
        f"`{width.label}` is the model's {end} width (`{code}`, line {line}): the "
        f"{'data has' if end == 'input' else 'loss sees'} that many features; it is not padded"
    )


def _check_same_value_elsewhere(facts: ScriptFacts, width: Width) -> None:
    """A literal width written again in a shape (``x.view(-1, 30)``, ``torch.zeros(8, 30)``) would not grow."""
    edits = {id(n) for n in width.edits}
    for site in facts.calls:
        qual = site.qualname or ""
        if not (qual.startswith("torch.") or site.method in _SHAPE_METHODS):
            continue
        if qual.startswith("torch.nn.") and not qual.startswith("torch.nn.functional"):
            continue
        for arg in site.node.args:
            for node in nodes_of(arg.value, cst.Integer):
                if id(node) not in edits and literal(node) == width.value:
                    raise DeclineFix(
                        f"the width {width.value} is also written in `{facts.code(site.node).strip()}` "
                        f"(line {facts.line_of(site.node)}), which would not grow with it; pad by hand"
                    )


# -- the finding ----------------------------------------------------------------------------------------


def width_layers(facts: ScriptFacts, width: Width) -> str:
    """The layers a width sizes, as a finding's message quotes them (each once, in order)."""
    return ", ".join(dict.fromkeys(
        f"`{facts.code(use.layer.call).strip()}`" for use in width.uses
    ))


def width_named(width: Width) -> str:
    """What the message adds after the value: the name the script gives the width, or nothing for a
    literal written in the layers themselves."""
    return "" if width.inline else f" (`{width.label}`)"


def width_finding(rule: ScriptRule, facts: ScriptFacts, width: Width, what: str, effect: str, unit: str) -> Finding:
    """The script half's finding for one width: at its literal, with the opt-in padding fix (or its decline).
    The rule says ``what`` the width is, the ``effect`` of leaving it (with its measured cost) and the
    ``unit`` the padding adds."""
    target = padded_width(width.value)
    description = f"pad `{width.label}` {width.value} → {target}"
    return rule.finding(
        facts,
        width.literal,
        f"{what} is not a multiple of {ALIGNMENT}: {effect}; pad it to {target}: the layers get "
        f"{target - width.value} more {unit} that the model's input and output never see",
        fix=rule.planned_fix(FixClass.NUMERICS, description, lambda: plan_padding(facts, width), option=PAD_DIMS),
        details={"width": width.value, "suggested": target},
    )


def one_width_finding(script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """One TC101/TC102 per layer width the script sets: a model audit finding of the same rule and file
    whose only unaligned size (its ``details["unaligned"]``) is that width is the script's. Where the
    script's padding is offered, its finding (at the literal) stands for those; where it is declined, they
    stay (at the layers, with their measured cost) and carry its reason. Returns (script, model) findings
    to keep (the rules' ``merge_model_findings``)."""
    widths = {(f.rule, f.location.path, f.details["width"]): f for f in script if "width" in f.details}
    if not widths:
        return script, model
    kept_model: list[Finding] = []
    given: set[int] = set()
    for finding in model:
        sizes = set(finding.details.get("unaligned", {}).values())
        twin = widths.get((finding.rule, finding.location.path, sizes.pop())) if len(sizes) == 1 else None
        if twin is None:
            kept_model.append(finding)
        elif twin.fix is not None and not twin.fix.available:
            finding.fix = twin.fix
            kept_model.append(finding)
            given.add(id(twin))
    return [f for f in script if id(f) not in given], kept_model


class WidthLiteral(ScriptRule):
    """The script half of TC101 and TC102: an unaligned width the script sets as a literal, reported with
    ``fix --pad-dims``'s padding (opt-in). A rule says what its widths are (:meth:`describe`) and the
    ``unit`` the padding adds; one finding per width stands for the model audit's findings of it."""

    unit: ClassVar[str]

    @classmethod
    def merge_model_findings(cls, script: list[Finding], model: list[Finding]) -> tuple[list[Finding], list[Finding]]:
        return one_width_finding(script, model)

    def describe(self, facts: ScriptFacts, width: Width, context: "RuleContext") -> tuple[str, str]:
        """(what the width is, the effect of leaving it, with its measured cost)."""
        raise NotImplementedError

    def check(self, facts: ScriptFacts, context: "RuleContext") -> Iterator[Finding]:
        if not context.settings.pad_dims:
            return  # an opt-in: without it the model audit's findings are the whole report, as before
        for width in script_widths(facts):
            if width.rule == self.id:
                what, effect = self.describe(facts, width, context)
                yield width_finding(self, facts, width, what, effect, self.unit)
