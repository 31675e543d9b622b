"""Facts about the model classes a script defines: which class of the file a call builds or a method
belongs to, which classes a model is built from, which classes build a kind of layer (a convolution,
BatchNorm, an embedding), whether a model takes image batches, the recurrent layer it holds, and whose
``forward`` it runs.

Classes are read by name (``facts.classes_by_name``): a call ``Block(...)``, or ``blocks.Block(...)`` by
its last name, builds the file's ``Block``. This module knows nothing of which models a script trains
(:mod:`tcaudit.script.trained_models` builds on it), nor of findings or fixes.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

import libcst as cst

from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.source.syntax import call_nodes, evaluated_value, full_name, method_of, nodes_of

CONV2D_LAYERS = frozenset(
    f"torch.nn.{prefix}{name}"
    for prefix in ("", "modules.conv.", "modules.")
    for name in ("Conv2d", "ConvTranspose2d", "LazyConv2d", "LazyConvTranspose2d")
)
# Libraries whose model factories build image models (torchvision's and timm's convnets and ViTs).
KNOWN_FACTORIES = ("torchvision.models.", "timm.")
# torch.nn's recurrent layers, and the mode strings ``getattr(nn, rnn_type)`` picks them by.
RECURRENT = frozenset({"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"})
RECURRENT_TYPES = frozenset({"LSTM", "GRU", "RNN_TANH", "RNN_RELU", "RNN"})
RECURRENT_NAME = re.compile(r"rnn|lstm|gru", re.IGNORECASE)


# -- the file's classes -----------------------------------------------------------------------------------


def callee_class(call: cst.Call) -> str:
    """The name of the class of this file that ``call`` would build: its callee's last name
    (``blocks.Block(...)`` → ``Block``); look it up in ``facts.classes_by_name``."""
    return (full_name(call.func) or "").split(".")[-1]


def class_of(facts: ScriptFacts, fn: cst.FunctionDef | None) -> cst.ClassDef | None:
    """The class whose method ``fn`` is (None for a function outside any class, or no function)."""
    return next((ctx.class_def for other, ctx in facts.functions if other is fn), None) if fn is not None else None


def calls_by_class(facts: ScriptFacts) -> dict[int, list[CallSite]]:
    """The calls of each class's own code, by the class's ``id`` (a class nested in it has its own)."""
    out: dict[int, list[CallSite]] = {}
    for call in facts.calls:
        if call.ctx.class_def is not None:
            out.setdefault(id(call.ctx.class_def), []).append(call)
    return out


def init_value(facts: ScriptFacts, cls: cst.ClassDef, attribute: str) -> cst.BaseExpression | None:
    """What ``cls.__init__`` assigns to ``attribute`` (``self.conv1``), where it assigns it exactly once."""
    init = method_of(cls, "__init__")
    values = [b.value for b in facts.bindings_of(attribute) if init is not None and b.ctx.function is init]
    return values[0] if len(values) == 1 else None


def calls_within(node: cst.CSTNode) -> set[int]:
    """The ``id`` of every call under ``node`` (itself included)."""
    return {id(n) for n in call_nodes(node)}


def holds_config(facts: ScriptFacts, name: cst.Name, config_classes: set[str]) -> bool:
    """Whether every value the name may hold is an instance of one of ``config_classes`` built here."""
    values = [v for v in facts.binding_values(name) if v is not name]
    return bool(values) and all(isinstance(v, cst.Call) and callee_class(v) in config_classes for v in values)


# -- which classes a model is built from ------------------------------------------------------------------


def classes_reached(
    facts: ScriptFacts, roots: Iterable[cst.ClassDef], *, bases: bool = True, nested: bool = False
) -> Iterator[cst.ClassDef]:
    """``roots`` and the classes of this file they build, each once, depth first from the last root: the
    classes a class's calls name (``self.block = Block()``) and, with ``bases``, those it derives from.
    A class's calls are those of its own code; with ``nested``, every call in its body, those of the
    classes nested in it included. A class is given before the ones it reaches are looked up, so a
    caller that stops early reads no further."""
    by_name = facts.classes_by_name
    own = None if nested else calls_by_class(facts)
    pending = list(roots)
    seen: set[cst.ClassDef] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        names = [(full_name(base.value) or "").split(".")[-1] for base in cls.bases] if bases else []
        if own is None:
            names += [callee_class(call) for call in call_nodes(cls)]
        else:
            names += [call.name.split(".")[-1] for call in own.get(id(cls), []) if call.name]
        pending.extend(by_name[name] for name in names if name in by_name)


def model_classes(facts: ScriptFacts, construction: cst.Call) -> set[cst.ClassDef]:
    """The classes of this file the model is built from: those called in the construction, their base
    classes, and the classes they build in turn."""
    by_name = facts.classes_by_name
    roots = [by_name[name] for name in map(callee_class, call_nodes(construction)) if name in by_name]
    return set(classes_reached(facts, roots))


def forward_outputs(facts: ScriptFacts, model: str) -> set[str]:
    """Names bound to the model's output (``output = model(images)``)."""
    out: set[str] = set()
    for binding in facts.bindings:
        value = binding.value
        if isinstance(value, cst.Call) and full_name(value.func) == model:
            out.add(binding.target)
    return out


# -- which classes build a kind of layer ------------------------------------------------------------------


def classes_building(
    facts: ScriptFacts,
    builds: Callable[[CallSite], bool],
    *,
    bases: Callable[[str], bool] | None = None,
    defaults: Callable[[str], bool] | None = None,
    through_classes: bool = True,
    as_written: bool = False,
) -> set[str]:
    """The names of this file's classes whose own code makes a call ``builds`` accepts (``nn.BatchNorm2d(c)``)
    or, with ``through_classes``, builds another such class of the file (``self.layer1 = Block(...)``).

    ``bases``: a base class whose qualified name it accepts counts too (``class Net(models.ResNet)``), and
    a base class of this file passes on what it builds. ``defaults``: a method parameter's default whose
    qualified name it accepts counts too (``norm_layer=nn.BatchNorm2d``). ``as_written``: another class
    is followed by the callee's (or base's) dotted name as written (``Block``), not by its last name
    (``blocks.Block``, which then is not taken for this file's ``Block``)."""
    by_class = calls_by_class(facts)
    defaults_by_class: dict[int, list[cst.BaseExpression]] = {}
    if defaults is not None:
        for fn, frame in facts.functions:
            owner = frame.class_def
            if owner is None:
                continue
            for param in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params):
                if param.default is not None:
                    defaults_by_class.setdefault(id(owner), []).append(param.default)

    def followed(dotted: str) -> str:
        return dotted if as_written else dotted.split(".")[-1]

    direct: dict[str, set[str]] = {}
    found: set[str] = set()
    for node, _ in facts.classes:
        name = node.name.value
        uses: set[str] = set()
        for base in node.bases if bases is not None else ():
            if bases(facts.qualname(base.value) or ""):
                found.add(name)
            dotted = full_name(base.value)
            if dotted:
                uses.add(followed(dotted))
        for call in by_class.get(id(node), []):
            if builds(call):
                found.add(name)
            elif call.name:
                uses.add(followed(call.name))
        for default in defaults_by_class.get(id(node), []):
            if defaults is not None and defaults(facts.qualname(default) or ""):
                found.add(name)
        direct[name] = uses
    changed = through_classes
    while changed:
        changed = False
        for name, uses in direct.items():
            if name not in found and uses & found:
                found.add(name)
                changed = True
    return found


# -- image input ----------------------------------------------------------------------------------------------


def takes_images(facts: ScriptFacts, construction: cst.Call, picked_by_name: bool = False) -> bool:
    """Whether the model ``construction`` builds takes a rank-4 image batch: a torchvision/timm model (by its
    factory, or ``picked_by_name``: a classification model picked by name, ``models.__dict__[args.arch]()``,
    which :meth:`~tcaudit.script.trained_models.TrainedModelFacts.arch_by_name` finds), an ``nn.Sequential``
    that starts with a Conv2d, or a class of this file whose ``forward`` passes its input straight to a
    Conv2d (or to such a class)."""
    qual = facts.qualname(construction.func) or ""
    if qual.startswith(KNOWN_FACTORIES) or picked_by_name:
        return True
    if qual == "torch.nn.Sequential":
        return builds_image_layer(facts, construction)
    cls = facts.classes_by_name.get(callee_class(construction))
    return cls is not None and class_takes_images(facts, cls)


def class_takes_images(facts: ScriptFacts, cls: cst.ClassDef, depth: int = 0) -> bool:
    """Whether the first call in ``cls.forward`` that reads its input is a layer built in ``__init__`` that
    takes images (see :func:`builds_image_layer`)."""
    if depth > 3:
        return False
    forward = method_of(cls, "forward")
    if forward is None:
        return False
    params = [p.name.value for p in forward.params.params]
    if len(params) < 2:
        return False
    x = params[1]
    first = None
    for call in facts.calls:
        if call.ctx.function is not forward:
            continue
        if call.receiver_name == x or any(full_name(a.value) == x for a in call.node.args):
            pos = facts.position(call.node).start
            if first is None or (pos.line, pos.column) < first[0]:
                first = ((pos.line, pos.column), call)
    if first is None:
        return False
    call = first[1]
    if not (call.name or "").startswith("self.") or call.receiver_name == x:
        return False
    layer = init_value(facts, cls, call.name)
    return layer is not None and builds_image_layer(facts, layer, depth)


def builds_image_layer(facts: ScriptFacts, value: cst.BaseExpression, depth: int = 0) -> bool:
    """Whether ``value`` builds a layer that takes images: a Conv2d, an ``nn.Sequential`` that starts with
    one, or a class of this file that takes images (:func:`class_takes_images`)."""
    if not isinstance(value, cst.Call):
        return False
    qual = facts.qualname(value.func) or ""
    if qual in CONV2D_LAYERS:
        return True
    if qual == "torch.nn.Sequential":
        first = next((a.value for a in value.args if a.keyword is None), None)
        return first is not None and builds_image_layer(facts, first, depth)
    cls = facts.classes_by_name.get(callee_class(value))
    return cls is not None and not qual and class_takes_images(facts, cls, depth + 1)


# -- recurrent layers -----------------------------------------------------------------------------------------


def recurrent_layer(facts: ScriptFacts, constructions: Iterable[cst.Call]) -> str | None:
    """The recurrent torch.nn layer (``nn.LSTM``) a model built by ``constructions`` holds, following the
    classes of this file it constructs (``Seq2Seq`` holding an ``Encoder`` with an LSTM);
    ``getattr(nn, rnn_type)(...)`` (the word-language-model shape) counts where the class names a
    recurrent type in a string."""
    by_name = facts.classes_by_name
    # The parts passed to the constructor count too: ``Seq2Seq(Encoder(...), Decoder(...))``.
    roots = [
        by_name[name]
        for construction in constructions
        for name in map(callee_class, call_nodes(construction))
        if name in by_name
    ]
    # What the classes build, every call in their bodies, not what they derive from: a recurrent base
    # class of this file is not looked for (following bases would decline compiles TC305 makes today).
    for cls in classes_reached(facts, roots, bases=False, nested=True):
        strings = {
            evaluated_value(node) for node in nodes_of(cls, cst.SimpleString) if isinstance(evaluated_value(node), str)
        }
        for call in call_nodes(cls):
            qual = facts.qualname(call.func) or ""
            if qual.startswith("torch.nn.") and qual.rsplit(".", 1)[-1] in RECURRENT:
                return f"nn.{qual.rsplit('.', 1)[-1]}"
            picked = picked_from_torch_nn(facts, call)
            if picked is not None and (strings & RECURRENT_TYPES or RECURRENT_NAME.search(picked)):
                return f"getattr(nn, {picked})"
    return None


def picked_from_torch_nn(facts: ScriptFacts, call: cst.Call) -> str | None:
    """``getattr(nn, rnn_type)(...)``: the code of the name picked from torch.nn (``rnn_type``)."""
    picker = call.func
    if not (isinstance(picker, cst.Call) and full_name(picker.func) == "getattr" and len(picker.args) > 1):
        return None
    if facts.qualname(picker.args[0].value) != "torch.nn":
        return None
    return facts.code(picker.args[1].value)


# -- whose forward runs ---------------------------------------------------------------------------------------


def torch_forward(facts: ScriptFacts, call: cst.Call, depth: int = 0) -> str | None:
    """The torch.nn class whose ``forward`` a model built by ``call`` runs (``nn.Sequential(...)``, or a
    class of this file that derives from one without defining ``forward``); None for a forward of its
    own (a class of this file, torchvision, timm). Dynamo skips torch.nn's own frames, and
    ``nn.Module.compile()`` starts tracing at them: torch 2.11 captures nothing for such a model (torch
    2.14 wraps that frame and does)."""
    qual = facts.qualname(call.func) or ""
    if qual.startswith("torch.nn.") and qual.split(".")[-1] != "Module":
        return qual
    cls = facts.classes_by_name.get(callee_class(call)) if not qual else None
    return class_torch_forward(facts, cls, depth) if cls is not None else None


def class_torch_forward(facts: ScriptFacts, cls: cst.ClassDef, depth: int = 0) -> str | None:
    """The torch.nn class whose ``forward`` an instance of ``cls`` runs: the first torch.nn base (other than
    ``nn.Module``) reached through base classes of this file none of which defines ``forward``."""
    if depth > 4 or not isinstance(cls.body, cst.IndentedBlock):
        return None
    if any(isinstance(item, cst.FunctionDef) and item.name.value == "forward" for item in cls.body.body):
        return None
    classes = facts.classes_by_name
    for base in cls.bases:
        dotted = full_name(base.value) or ""
        qual = facts.qualname(base.value) or ""
        if qual.startswith("torch.nn.") and qual.split(".")[-1] != "Module":
            return qual
        parent = classes.get(dotted.split(".")[-1]) if not qual else None
        if parent is not None and parent is not cls:
            found = class_torch_forward(facts, parent, depth + 1)
            if found is not None:
                return found
    return None


def defines_no_forward(facts: ScriptFacts, cls: cst.ClassDef, depth: int = 0) -> bool:
    """A class of this file derived from ``nn.Module`` (through classes of this file) where no class
    defines ``forward``: an RL agent's ``get_action_and_value`` is called directly, never ``agent(x)``."""
    if depth > 4 or not isinstance(cls.body, cst.IndentedBlock):
        return False
    if any(isinstance(item, cst.FunctionDef) and item.name.value == "forward" for item in cls.body.body):
        return False
    classes = facts.classes_by_name
    for base in cls.bases:
        qual = facts.qualname(base.value) or ""
        if qual == "torch.nn.Module":
            continue
        parent = classes.get((full_name(base.value) or "").split(".")[-1]) if not qual else None
        if parent is None or parent is cls or not defines_no_forward(facts, parent, depth + 1):
            return False
    return bool(cls.bases)
