"""Facts the backend (TC3) and input-pipeline (TC4) rules share, built from ScriptFacts.

* **Is this CUDA training the user owns?** A training step in the file, CUDA text, no framework
  that owns the loop; whether the steps run under autocast; which models are trained and which of
  them are convnets (channels_last, cudnn.benchmark).
* **DataLoaders, by type.** Only ``torch.utils.data.DataLoader`` (however imported or aliased) is a
  DataLoader: a custom loader class is not judged by its name. Keyword arguments are read from the
  call, from positional slots, and from ``**kwargs`` dicts followed through their literal,
  ``dict(...)``, ``update(...)``, ``setdefault`` and ``kw["key"] = value`` writes; a dict that cannot
  be followed makes the keyword set *incomplete* and the rules stay silent about missing keys.
* **Batches.** The names bound by iterating a DataLoader (``for x, y in loader``,
  ``enumerate(tqdm(loader))``, ``zip(a, b)``, ``batch = next(it)`` with ``it = iter(loader)``,
  and their unpacking), in loops that train.
* **Deliberate settings.** Code under an ``if``/``else`` (other than the main guard), or in a helper
  only called under one, is the user's choice behind a flag.

Everything is computed once per file and cached beside the facts (a weak reference, so a corpus
scan does not keep every file alive).
"""

from __future__ import annotations

import functools
import re
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import FixPlan
from tcaudit.model_profile import AuditedModels, ModelProfile
from tcaudit.script.facts import CUDA_EVIDENCE_TEXT, CallSite, Frame, ScriptFacts
from tcaudit.source.syntax import is_main_guard, param_names

DATALOADER_QUALNAMES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# DataLoader's positional parameters, in order (PyTorch 2.x); the rest are keyword-only.
DATALOADER_POSITIONAL = (
    "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
    "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
)

CONV2D_LAYERS = frozenset(
    f"torch.nn.{prefix}{name}"
    for prefix in ("", "modules.conv.", "modules.")
    for name in ("Conv2d", "ConvTranspose2d", "LazyConv2d", "LazyConvTranspose2d")
)
# torchvision/timm convnet families (classification and segmentation backbones with fixed input sizes).
_CONV_ARCH = re.compile(
    r"^(resnet|resnext|wide_resnet|vgg|efficientnet|mobilenet|densenet|regnet|convnext|mnasnet|shufflenet"
    r"|squeezenet|googlenet|inception|alexnet|fcn_|deeplabv3|lraspp|unet|cspnet|cspresnet|darknet|dla"
    r"|dpn|ghostnet|hrnet|res2net|resnest|rexnet|seresnet|senet|tresnet|xception|nfnet|dm_nfnet|ecaresnet)",
    re.IGNORECASE,
)
# Factories that build a model from its architecture's name, and the image data APIs of the same libraries.
_NAMED_FACTORIES = ("torchvision.models.get_model", "timm.create_model", "timm.models.create_model")
_IMAGE_DATA = ("torchvision.datasets.", "torchvision.transforms", "timm.data")
# torchvision model packages whose inputs change shape from batch to batch, or that are not 2-D.
_NOT_FIXED_2D = (".detection.", ".video.", ".optical_flow.", ".quantization.")

# Necessary for ScriptFacts.uses_cuda (rule triggers): CUDA named, or an integer/parameter device.
CUDA_TEXT = CUDA_EVIDENCE_TEXT
# facts.uses_accelerator's text, and the CUDA text: necessary for any advice about devices.
ACCELERATOR_TEXT = r"mps\b|\bxpu\b|FloatTensor|HalfTensor|" + CUDA_EVIDENCE_TEXT
_EVAL_WORDS = frozenset(
    {"val", "valid", "validation", "test", "testing", "eval", "evaluation", "evaluate", "inference", "infer",
     "predict", "prediction", "dev", "holdout"}
)
_NAME_SUFFIXES = ("dataloader", "loader", "dataset", "data", "set", "ds", "dl", "iter")
_DEVICE_NAME = re.compile(r"(device|^dev$|^gpu$|_gpu$|^gpu_|local_rank|^rank$|gpu_id|^cuda)", re.IGNORECASE)
# Calls that wrap a model and return the wrapper (the model is their first positional argument).
MODEL_WRAPPERS = (
    "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.compile", "torch.jit.script",
)
# Methods that return the model they are called on (``Net().cuda().train()``).
MODEL_CHAIN = frozenset({"cuda", "to", "train", "float", "half", "bfloat16", "requires_grad_", "apply", "to_empty"})
_BUILTINS = frozenset(
    {"range", "len", "min", "max", "int", "float", "bool", "list", "tuple", "dict", "zip", "enumerate", "iter",
     "next", "super", "isinstance", "sorted", "reversed", "sum", "abs", "round"}
)
# ``tcaudit fix --dali`` wraps the training DataLoader in this function of the script (its batches are
# the DataLoader's, decoded on the GPU): loops over it are loops over that DataLoader.
DALI_LOADER = "tcaudit_dali_loader"
_ITER_WRAPPERS = re.compile(r"(^|\.)(tqdm|trange|track|progress\w*|Progress\w*|enumerate|iter|islice)$")


def all_of(*patterns: str) -> str:
    """One trigger regex that needs every pattern somewhere in the file (rule triggers are OR-ed)."""
    return r"(?s)\A" + "".join(f"(?=.*?(?:{p}))" for p in patterns)


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
        return expr.evaluated_value
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        inner = literal(expr.expression)
        return -inner if isinstance(inner, (int, float)) else ...
    return ...


def name_tokens(name: str | None) -> list[str]:
    if not name:
        return []
    last = name.split(".")[-1]
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", last)
    return [t for t in spaced.lower().split("_") if t]


def is_eval_name(name: str | None) -> bool:
    """``val_loader``, ``testloader``, ``evalDataset``, ``val_dataloader`` — names of evaluation data."""
    for token in name_tokens(name):
        if token in _EVAL_WORDS:
            return True
        for suffix in _NAME_SUFFIXES:
            if token.endswith(suffix) and token[: -len(suffix)] in _EVAL_WORDS:
                return True
    return False


def flag_frames(ctx: Frame) -> list[Frame]:
    """The ``if``/``else``/``except`` frames around ``ctx``, the main guard excepted."""
    return [f for f in ctx.chain() if f.kind in ("if", "else", "except") and not is_main_guard(f.node)]


def is_device_expr(expr: cst.BaseExpression) -> bool:
    """Whether an argument of ``.to(...)`` names a device (not a dtype or another tensor)."""
    value = literal(expr)
    if isinstance(value, str):
        return value.split(":")[0] in ("cuda", "mps", "xpu")
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    if isinstance(expr, cst.Call):
        dotted = get_full_name_for_node(expr.func) or ""
        return dotted.endswith("device") or dotted.endswith("current_device")
    if isinstance(expr, cst.Subscript):
        return is_device_expr(expr.value)
    dotted = get_full_name_for_node(expr)
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


def keyword_arg(call: cst.Call, key: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == key:
            return arg
    return None


@dataclass
class KeyValue:
    """One place a DataLoader keyword gets its value: the call itself, a positional slot, or a dict."""

    value: cst.BaseExpression
    node: cst.CSTNode  # where it is written
    source: str  # "keyword", "positional" or the name of the kwargs dict
    conditional: bool  # written on some paths only (a branch the DataLoader call is not in)


@dataclass
class LoaderSite:
    """A ``torch.utils.data.DataLoader(...)`` call and the keywords it receives."""

    call: CallSite
    keys: dict[str, list[KeyValue]]
    complete: bool  # False when ``*args`` or an untraceable ``**kwargs`` may add keywords
    kwargs_dicts: list[str]
    target: str | None  # the name it is assigned to, if any
    training: bool

    def values(self, key: str) -> list[cst.BaseExpression]:
        return [kv.value for kv in self.keys.get(key, [])]

    def has(self, key: str) -> bool:
        return key in self.keys

    def in_dict(self, key: str) -> KeyValue | None:
        return next((kv for kv in self.keys.get(key, []) if kv.source not in ("keyword", "positional")), None)


@dataclass
class BatchLoop:
    """A loop (``for`` or ``while``) whose body receives batches from DataLoaders."""

    loop: cst.CSTNode
    ctx: Frame  # the context of the loop statement itself
    names: set[str] = field(default_factory=set)
    loaders: list[LoaderSite] = field(default_factory=list)
    repeat_ctx: Frame | None = None  # where a new pass over the loader starts (the ``for``, or ``iter(...)``)
    # Instances of this file's own iterable classes the same loop may iterate instead of a DataLoader
    # (``loader = SyntheticBatches(...) if args.synthetic else DataLoader(...)``).
    own_iterables: list[cst.Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.repeat_ctx is None:
            self.repeat_ctx = self.ctx


@dataclass
class ModelSite:
    name: str  # the dotted name that holds the trained model
    construction: cst.Call  # the call that builds it


class PipelineFacts:
    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts

    # -- the script --------------------------------------------------------------------------------
    @functools.cached_property
    def uses_cuda(self) -> bool:
        """CUDA-specific advice (TF32, cuDNN, pinned memory, fused optimizers) needs a script that may
        run on CUDA (``ScriptFacts.uses_cuda``: ``device = 0`` and a device parameter count): an MPS- or
        CPU-only script gets none."""
        return self.facts.uses_cuda

    @functools.cached_property
    def framework_owned(self) -> bool:
        return bool(self.facts.frameworks)

    @functools.cached_property
    def trains(self) -> bool:
        """A training loop in this file, or a framework that runs one for the code in it."""
        facts = self.facts
        return bool(facts.training_steps) or bool(facts.optimizer_steps) or self.framework_owned

    @functools.cached_property
    def owns_cuda_training(self) -> bool:
        """The TC3 precondition: the user's own loop trains on CUDA (no framework owning it)."""
        return bool(self.facts.training_steps) and self.uses_cuda and not self.framework_owned

    @functools.cached_property
    def main_guard(self) -> cst.If | None:
        for statement in self.facts.module.body:
            if is_main_guard(statement):
                return statement  # type: ignore[return-value]
        return None

    def direct_callers(self, fn: cst.FunctionDef) -> list[CallSite]:
        """Calls of ``fn`` by its plain name, or as ``self.name`` for a method."""
        name = fn.name.value
        return [c for c in self.facts.calls if c.name == name or c.name == f"self.{name}" or c.name == f"cls.{name}"]

    def is_flag_guarded(self, ctx: Frame, depth: int = 2) -> bool:
        """Whether code at ``ctx`` runs only behind a condition: an ``if`` around it, or every call of
        its function sits behind one. A function called nowhere in the file is an entry point."""
        if flag_frames(ctx):
            return True
        fn = ctx.function
        if fn is None or depth == 0:
            return False
        callers = [c for c in self.direct_callers(fn) if not c.ctx.inside(fn)]
        if not callers:
            return False
        return all(self.is_flag_guarded(c.ctx, depth - 1) for c in callers)

    # -- training code -----------------------------------------------------------------------------
    @functools.cached_property
    def step_functions(self) -> set[cst.FunctionDef | None]:
        facts = self.facts
        out: set[cst.FunctionDef | None] = {s.function for s in facts.training_steps}
        out |= {c.ctx.function for c in facts.optimizer_steps}
        return out

    @functools.cached_property
    def functions_reaching_step(self) -> set[cst.FunctionDef]:
        """Functions that hold a training step or call (by name, ``self.name``) one that does."""
        callers_of: dict[int, set[cst.FunctionDef]] = {}
        for call in self.facts.calls:
            caller = call.ctx.function
            if caller is None:
                continue
            name = call.name or ""
            short = name[5:] if name.startswith("self.") else name
            if not short or "." in short:
                continue
            for target in self.facts.functions_by_name.get(short, []):
                if target is not caller:
                    callers_of.setdefault(id(target), set()).add(caller)
        out: set[cst.FunctionDef] = {fn for fn in self.step_functions if fn is not None}
        frontier = list(out)
        while frontier:
            fn = frontier.pop()
            for caller in callers_of.get(id(fn), ()):
                if caller not in out:
                    out.add(caller)
                    frontier.append(caller)
        return out

    @functools.cached_property
    def methods_by_name(self) -> dict[str, list[cst.FunctionDef]]:
        table: dict[str, list[cst.FunctionDef]] = {}
        for fn, ctx in self.facts.functions:
            if ctx.kind == "class":
                table.setdefault(fn.name.value, []).append(fn)
        return table

    def called_functions(self, call: CallSite) -> list[cst.FunctionDef]:
        """The functions of this file a call may run: ``f(...)``, ``self.f(...)``, and
        ``obj.method(...)`` for a method defined in one of this file's classes."""
        name = call.name or ""
        short = name[5:] if name.startswith("self.") else name
        if not short:
            return []
        if "." in short:
            return self.methods_by_name.get(short.split(".")[-1], []) if call.method else []
        return self.facts.functions_by_name.get(short, [])

    def body_trains(self, node: cst.CSTNode) -> bool:
        """Whether a loop or ``with`` body holds a training step, directly or through a call."""
        facts = self.facts
        if any(step.ctx.inside(node) for step in facts.training_steps):
            return True
        if any(call.ctx.inside(node) for call in facts.optimizer_steps):
            return True
        for call in facts.calls:
            if call.ctx.inside(node) and any(fn in self.functions_reaching_step for fn in self.called_functions(call)):
                return True
        return False

    @functools.cached_property
    def trains_under_autocast(self) -> bool:
        """Whether the training forward runs under autocast somewhere (also behind an ``if args.amp``
        flag): an autocast block or decorator outside eval code that is not ``enabled=False`` or
        CPU-only, or a training step inside one."""
        facts = self.facts
        if any(facts.in_autocast(step.ctx) for step in facts.training_steps):
            return True
        for node, ctx in facts.autocast_withs:
            if facts.in_eval(ctx) or "eval" in facts.with_kinds(node):
                continue
            if all(self._disabled_autocast(item.item) for item in node.items if facts.is_autocast_expr(item.item)):
                continue
            return True
        for fn, ctx in facts.functions:
            if facts.function_has_autocast_decorator(fn) and not facts.in_eval(ctx) and not facts.function_is_eval(fn):
                return True
        return False

    def _disabled_autocast(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Call):
            return False
        enabled = keyword_arg(expr, "enabled")
        if enabled is not None and literal(enabled.value) is False:
            return True
        device = keyword_arg(expr, "device_type")
        first = device.value if device is not None else (expr.args[0].value if expr.args and expr.args[0].keyword is None else None)
        return literal(first) == "cpu" or (self.facts.qualname(expr.func) or "").startswith("torch.cpu.")

    # -- models ------------------------------------------------------------------------------------
    @functools.cached_property
    def trained_model_names(self) -> list[str]:
        """Names whose parameters an optimizer receives (``SGD(model.parameters())``,
        ``[{"params": model.fc.parameters()}]`` → ``model``); the file's model-like names otherwise."""
        facts = self.facts
        names: list[str] = []
        for call in facts.calls:
            qual = call.qualname or ""
            if not qual.startswith("torch.optim.") or "lr_scheduler" in qual or "swa_utils" in qual:
                continue
            inside = _call_ids_within(call.node)
            for inner in facts.calls:
                if inner.method in ("parameters", "named_parameters") and id(inner.node) in inside:
                    owner = inner.receiver_name
                    if owner:
                        names.append(owner)
        if not names:
            names = sorted(facts.model_names)
        out: list[str] = []
        for name in names:
            for candidate in _prefixes(name):
                if candidate not in out and self.facts.bindings_of(candidate):
                    out.append(candidate)
                    break
        return out

    def constructions(self, expr: cst.BaseExpression, depth: int = 0, seen: set[int] | None = None) -> Iterator[cst.Call]:
        """The calls that build what ``expr`` holds, through assignments, method chains
        (``.cuda()``, ``.to(...)``), wrappers (DataParallel, DDP, ``torch.compile``) and the
        ``return`` of factory functions of this file."""
        if depth > 6:
            return
        seen = set() if seen is None else seen
        facts = self.facts
        for value in facts.binding_values(expr):
            if not isinstance(value, cst.Call) or id(value) in seen:
                continue
            seen.add(id(value))
            func = value.func
            if isinstance(func, cst.Attribute) and func.attr.value in MODEL_CHAIN:
                yield from self.constructions(func.value, depth + 1, seen)
                continue
            qual = facts.qualname(func) or ""
            if qual in MODEL_WRAPPERS or qual.endswith(("DistributedDataParallel", "DataParallel")):
                if value.args:
                    yield from self.constructions(value.args[0].value, depth + 1, seen)
                continue
            dotted = get_full_name_for_node(func)
            if not qual and dotted and "." not in dotted and dotted in facts.functions_by_name and dotted not in self.class_names:
                for fn in facts.functions_by_name[dotted]:
                    for returned in _returns(fn):
                        yield from self.constructions(returned, depth + 1, seen)
                continue
            yield value

    @functools.cached_property
    def trained_models(self) -> list[ModelSite]:
        out: list[ModelSite] = []
        seen: set[int] = set()
        for name in self.trained_model_names:
            for binding in self.facts.bindings_of(name):
                for call in self.constructions(binding.value):
                    if id(call) not in seen:
                        seen.add(id(call))
                        out.append(ModelSite(name, call))
        return out

    @functools.cached_property
    def class_names(self) -> set[str]:
        return {node.name.value for node, _ in self.facts.classes}

    @functools.cached_property
    def conv_classes(self) -> set[str]:
        """Classes of this file that build a 2-D convolution (directly, through another such class,
        a torchvision convnet backbone, or a convnet base class)."""
        facts = self.facts
        direct: dict[str, set[str]] = {}
        conv: set[str] = set()
        by_class: dict[int, list[CallSite]] = {}
        for call in facts.calls:
            owner = call.ctx.class_def
            if owner is not None:
                by_class.setdefault(id(owner), []).append(call)
        for node, _ in facts.classes:
            name = node.name.value
            uses: set[str] = set()
            for base in node.bases:
                qual = facts.qualname(base.value) or ""
                if self._is_conv_factory(qual) or qual.startswith("torchvision.models.") and _CONV_ARCH.match(qual.split(".")[-1]):
                    conv.add(name)
                dotted = get_full_name_for_node(base.value)
                if dotted:
                    uses.add(dotted)
            for call in by_class.get(id(node), []):
                qual = call.qualname or ""
                if qual in CONV2D_LAYERS or self._is_conv_factory(qual):
                    conv.add(name)
                elif call.name:
                    uses.add(call.name)
            direct[name] = uses
        changed = True
        while changed:
            changed = False
            for name, uses in direct.items():
                if name not in conv and uses & conv:
                    conv.add(name)
                    changed = True
        return conv

    def _is_conv_factory(self, qual: str) -> bool:
        if not qual.startswith("torchvision.models.") or any(part in qual + "." for part in _NOT_FIXED_2D):
            return False
        return bool(_CONV_ARCH.match(qual.split(".")[-1]))

    def is_conv_construction(self, call: cst.Call) -> bool:
        facts = self.facts
        qual = facts.qualname(call.func) or ""
        if self._is_conv_factory(qual):
            return True
        picked = self.arch_by_name(call)
        if picked is not None:
            return self._picked_arch_is_conv(picked)
        if qual in ("torch.nn.Sequential", "torch.nn.ModuleList"):
            return any(self._expr_builds_conv(arg.value) for arg in call.args)
        dotted = get_full_name_for_node(call.func)
        return bool(dotted) and dotted.split(".")[-1] in self.conv_classes and not qual

    def arch_by_name(self, call: cst.Call) -> cst.BaseExpression | None:
        """The name expression of a torchvision/timm classification model picked by name:
        ``models.__dict__[args.arch]()``, ``getattr(models, name)()``, ``torchvision.models.get_model(name)``,
        ``timm.create_model(name)``; None for any other call."""
        facts = self.facts
        func = call.func
        if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "__dict__":
            index = func.slice[0].slice if len(func.slice) == 1 else None
            if isinstance(index, cst.Index) and _model_namespace(facts.qualname(func.value.value)):
                return index.value
            return None
        if isinstance(func, cst.Call) and get_full_name_for_node(func.func) == "getattr" and not facts.bindings_of("getattr"):
            args = [a.value for a in func.args if a.keyword is None and not a.star]
            if len(args) == 2 and _model_namespace(facts.qualname(args[0])):
                return args[1]
            return None
        if (facts.qualname(func) or "") in _NAMED_FACTORIES:
            named = keyword_arg(call, "model_name") or keyword_arg(call, "name")
            if named is not None:
                return named.value
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            return positional[0] if positional else None
        return None

    def _picked_arch_is_conv(self, name: cst.BaseExpression) -> bool:
        """A model picked by name is a convnet when every literal the name may hold (a string, the
        argparse default of ``args.arch``) names a convnet family; with no literal to read, when the
        script feeds it images (torchvision datasets or transforms, timm data)."""
        archs = self.string_values(name)
        if archs:
            return all(_CONV_ARCH.match(arch) for arch in archs)
        return self.image_pipeline

    def string_values(self, expr: cst.BaseExpression) -> list[str]:
        """The string literals ``expr`` may hold: assigned values, and for ``args.name`` the default of
        the argparse flag whose destination is ``name``."""
        values = [literal(v) for v in self.facts.binding_values(expr)]
        if isinstance(expr, cst.Attribute):
            values.append(self.flag_default(expr.attr.value))
        return [v for v in values if isinstance(v, str)]

    def flag_default(self, dest: str) -> object:
        """The literal ``default=`` of the ``add_argument`` call whose destination is ``dest``
        (``"--arch"``, ``"-a", "--arch"``, ``dest="arch"``); ``...`` when there is none or several."""
        found = []
        for call in self.facts.calls:
            if call.method == "add_argument" and flag_dest(call.node) == dest:
                default = keyword_arg(call.node, "default")
                found.append(literal(default.value) if default is not None else ...)
        return found[0] if len(found) == 1 else ...

    @functools.cached_property
    def image_pipeline(self) -> bool:
        """Whether the script loads images the torchvision or timm way (4-D batches)."""
        return bool(self.facts.references_to(*_IMAGE_DATA))

    def _expr_builds_conv(self, expr: cst.BaseExpression) -> bool:
        found = False
        facts = self.facts

        class _V(cst.CSTVisitor):
            def visit_Call(inner, node: cst.Call) -> None:  # noqa: N805
                nonlocal found
                qual = facts.qualname(node.func) or ""
                if qual in CONV2D_LAYERS or self.is_conv_construction(node):
                    found = True

        expr.visit(_V())
        return found

    @functools.cached_property
    def conv_models(self) -> list[ModelSite]:
        """The trained convnets, as the script's text shows them (see :meth:`convnets`)."""
        return [site for site in self.trained_models if self.is_conv_construction(site.construction)]

    def profile_of(self, site: ModelSite, models: "AuditedModels | None") -> "ModelProfile | None":
        """What the model audit measured about this trained model, if it audited it."""
        if models is None:
            return None
        return models.for_site(site.name, self.facts.module.code_for_node(site.construction))

    def is_convnet(self, site: ModelSite, models: "AuditedModels | None") -> bool:
        """The audit's FLOP shares where it built the model (a factory, a registry, a name picked at run
        time); the script's text otherwise."""
        profile = self.profile_of(site, models)
        return profile.is_convnet if profile is not None else self.is_conv_construction(site.construction)

    def convnets(self, models: "AuditedModels | None") -> list[ModelSite]:
        """The trained models that are convnets (channels_last, cudnn.benchmark, fp16)."""
        if models is None:
            return self.conv_models
        return [site for site in self.trained_models if self.is_convnet(site, models)]

    def audited_convnet(self, models: "AuditedModels | None") -> bool | None:
        """Whether the audited trained models include a convnet; None when the audit measured none of them."""
        profiles = [p for p in (self.profile_of(site, models) for site in self.trained_models) if p is not None]
        return any(p.is_convnet for p in profiles) if profiles else None

    # -- DataLoaders -------------------------------------------------------------------------------
    @functools.cached_property
    def loaders(self) -> list[LoaderSite]:
        facts = self.facts
        out = []
        for call in facts.calls:
            if call.qualname not in DATALOADER_QUALNAMES:
                continue
            keys, complete, dicts = self._loader_keys(call)
            target = assigned_name(call)
            out.append(LoaderSite(call, keys, complete, dicts, target, self._is_training_loader(call, target)))
        return out

    @functools.cached_property
    def training_loaders(self) -> list[LoaderSite]:
        if not self.trains:
            return []
        return [site for site in self.loaders if site.training]

    def loader_for(self, node: cst.Call) -> LoaderSite | None:
        return next((site for site in self.loaders if site.call.node is node), None)

    def _is_training_loader(self, call: CallSite, target: str | None) -> bool:
        facts = self.facts
        if facts.in_eval(call.ctx) or is_eval_name(target):
            return False
        for frame in call.ctx.chain():
            if frame.kind == "def" and is_eval_name(frame.node.name.value):  # type: ignore[attr-defined]
                return False
        dataset = call.arg("dataset", 0)
        if dataset is not None and is_eval_name(get_full_name_for_node(dataset)):
            return False
        return not self._dict_key_is_eval(call)

    def _dict_key_is_eval(self, call: CallSite) -> bool:
        """``{"train": DataLoader(...), "val": DataLoader(...)}``: the value under an eval key."""
        statement = call.statement.node if call.statement else None
        if statement is None:
            return False
        verdict = False

        class _V(cst.CSTVisitor):
            def visit_DictElement(inner, node: cst.DictElement) -> None:  # noqa: N805
                nonlocal verdict
                if node.value is call.node:
                    key = literal(node.key)
                    verdict = isinstance(key, str) and is_eval_name(key)

        statement.visit(_V())
        return verdict

    def _loader_keys(self, call: CallSite) -> tuple[dict[str, list[KeyValue]], bool, list[str]]:
        keys: dict[str, list[KeyValue]] = {}
        complete = True
        dicts: list[str] = []
        positional = 0
        for arg in call.node.args:
            if arg.star == "*":
                complete = False
            elif arg.star == "**":
                name = get_full_name_for_node(arg.value)
                if name:
                    dicts.append(name)
                if not self._collect_dict(arg.value, call.ctx, keys, name or "**", 0):
                    complete = False
            elif arg.keyword is not None:
                keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, "keyword", False))
            else:
                if positional < len(DATALOADER_POSITIONAL):
                    key = DATALOADER_POSITIONAL[positional]
                    keys.setdefault(key, []).append(KeyValue(arg.value, arg, "positional", False))
                positional += 1
        return keys, complete, dicts

    def _collect_dict(
        self, expr: cst.BaseExpression, ctx: Frame, keys: dict[str, list[KeyValue]], label: str, depth: int
    ) -> bool:
        """Add the keys a ``**expr`` may hold; False when some of them cannot be known."""
        if depth > 5:
            return False
        facts = self.facts
        if isinstance(expr, cst.Dict):
            ok = True
            for element in expr.elements:
                if isinstance(element, cst.StarredDictElement):
                    ok &= self._collect_dict(element.value, ctx, keys, label, depth + 1)
                    continue
                key = literal(element.key)
                if not isinstance(key, str):
                    ok = False
                    continue
                keys.setdefault(key, []).append(KeyValue(element.value, element, label, False))
            return ok
        if isinstance(expr, cst.Call):
            dotted = get_full_name_for_node(expr.func)
            if dotted == "dict":
                ok = True
                for arg in expr.args:
                    if arg.keyword is not None:
                        keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, label, False))
                    else:
                        ok &= self._collect_dict(arg.value, ctx, keys, label, depth + 1)
                return ok
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "copy" and not expr.args:
                return self._collect_dict(expr.func.value, ctx, keys, label, depth + 1)
            return False
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.BitOr):
            left = self._collect_dict(expr.left, ctx, keys, label, depth + 1)
            right = self._collect_dict(expr.right, ctx, keys, label, depth + 1)
            return left and right
        if isinstance(expr, cst.IfExp):
            before = {k: len(v) for k, v in keys.items()}
            ok = self._collect_dict(expr.body, ctx, keys, label, depth + 1)
            ok &= self._collect_dict(expr.orelse, ctx, keys, label, depth + 1)
            for key, values in keys.items():
                for kv in values[before.get(key, 0):]:
                    kv.conditional = True
            return ok
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        name = get_full_name_for_node(expr)
        if not name:
            return False
        fn = ctx.function
        if fn is not None and name in param_names(fn):
            return False  # filled by the caller
        bindings = [b for b in facts.bindings_of(name) if b.ctx.function is fn]
        if not bindings and fn is not None:
            bindings = [b for b in facts.bindings_of(name) if b.ctx.function is None]
        if not bindings:
            return False
        ok = True
        creations = 0
        for binding in bindings:
            key_write = _subscript_key(binding)
            if key_write is not None:
                keys.setdefault(key_write, []).append(
                    KeyValue(binding.value, binding.statement.node if binding.statement else binding.value, name,
                             self._conditional(ctx, binding.ctx))
                )
                continue
            if key_write is None and _is_subscript_write(binding):
                ok = False  # kw[some_variable] = value
                continue
            creations += 1
            before = {k: len(v) for k, v in keys.items()}
            ok &= self._collect_dict(binding.value, binding.ctx, keys, label if label != "**" else name, depth + 1)
            if self._conditional(ctx, binding.ctx):
                for key, values in keys.items():
                    for kv in values[before.get(key, 0):]:
                        kv.conditional = True
        if creations > 1:
            # Several creations (``if a: kw = {...} else: kw = {...}``): a key is certain only if each has it.
            for values in keys.values():
                for kv in values:
                    if kv.source == name:
                        kv.conditional = True
        for call in facts.calls:
            if call.receiver_name != name or (call.ctx.function is not fn and call.ctx.function is not None):
                continue
            if call.method == "update":
                conditional = self._conditional(ctx, call.ctx)
                for arg in call.node.args:
                    before = {k: len(v) for k, v in keys.items()}
                    if arg.keyword is not None:
                        keys.setdefault(arg.keyword.value, []).append(KeyValue(arg.value, arg, name, conditional))
                    else:
                        ok &= self._collect_dict(arg.value, call.ctx, keys, name, depth + 1)
                    if conditional:
                        for key, values in keys.items():
                            for kv in values[before.get(key, 0):]:
                                kv.conditional = True
            elif call.method == "setdefault" and call.node.args:
                key = literal(call.node.args[0].value)
                if isinstance(key, str) and len(call.node.args) > 1:
                    keys.setdefault(key, []).append(
                        KeyValue(call.node.args[1].value, call.node, name, self._conditional(ctx, call.ctx))
                    )
                else:
                    ok = False
        for call in facts.calls:
            # Passed to a helper that may fill it in (``add_cuda_options(kwargs)``).
            if call.ctx.function is fn and any(
                arg.keyword is None and not arg.star and get_full_name_for_node(arg.value) == name for arg in call.node.args
            ) and call.method != "update" and call.name not in ("print", "len", "dict", "logging.info", "logger.info", "log"):
                ok = False
        return ok

    def _conditional(self, use: Frame, write: Frame) -> bool:
        """A write is conditional when it sits under a flag frame the use is not under."""
        use_frames = {id(f.node) for f in use.chain()}
        return any(id(f.node) not in use_frames for f in flag_frames(write))

    @functools.cached_property
    def iterable_dataset_classes(self) -> dict[str, bool]:
        """Classes deriving from IterableDataset → whether they shard by ``get_worker_info``."""
        facts = self.facts
        out: dict[str, bool] = {}
        for node, _ in facts.classes:
            for base in node.bases:
                qual = facts.qualname(base.value) or get_full_name_for_node(base.value) or ""
                if qual.endswith("IterableDataset"):
                    shards = any(
                        (c.name or "").endswith("get_worker_info") for c in facts.calls if c.ctx.class_def is node
                    )
                    out[node.name.value] = shards
        return out

    def dataset_kind(self, site: LoaderSite) -> str:
        """``"device"`` (tensors already on the GPU), ``"memory"`` (a TensorDataset of host tensors),
        ``"iterable-unsharded"`` (an IterableDataset that does not split work across workers) or
        ``"other"``."""
        facts = self.facts
        dataset = site.call.arg("dataset", 0)
        if dataset is None:
            return "other"
        for value in facts.binding_values(dataset):
            if not isinstance(value, cst.Call):
                continue
            qual = facts.qualname(value.func) or ""
            dotted = get_full_name_for_node(value.func) or ""
            if qual.endswith("TensorDataset"):
                if any(self._on_device(arg.value) for arg in value.args):
                    return "device"
                return "memory"
            short = dotted.split(".")[-1]
            if self.iterable_dataset_classes.get(short) is False:
                return "iterable-unsharded"
        return "other"

    def _on_device(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        if depth > 4:
            return False
        facts = self.facts
        for value in facts.binding_values(expr):
            if isinstance(value, cst.Call):
                if isinstance(value.func, cst.Attribute) and value.func.attr.value in ("cuda", "to"):
                    site = CallSite(value, None, None, self.facts.module_frame, None)
                    if moves_to_device(site):
                        return True
                if keyword_arg(value, "device") is not None and literal(keyword_arg(value, "device").value) != "cpu":
                    return True
        return False

    def loader_sites_for(
        self, expr: cst.BaseExpression, fn: cst.FunctionDef | None, depth: int = 0,
        own_iterables: list[cst.Call] | None = None,
    ) -> list[LoaderSite] | None:
        """The DataLoader calls ``expr`` may hold, or None when any of its values is something else
        (a custom loader, a framework-prepared loader, a parameter whose callers are not all known).
        With ``own_iterables``, an instance of an iterable class of this file is collected there instead."""
        if depth > 3:
            return None
        facts = self.facts
        name = get_full_name_for_node(expr)
        if name and fn is not None and name in param_names(fn):
            return self._param_loaders(name, fn, depth)
        sites: list[LoaderSite] = []
        leaves = 0
        values = facts.binding_values(expr)
        for value in values:
            if isinstance(value, cst.Call) and get_full_name_for_node(value.func) == DALI_LOADER and value.args:
                # ``loader = tcaudit_dali_loader(loader)`` (``fix --dali``) yields the wrapped DataLoader's batches.
                value = value.args[0].value
                if isinstance(value, (cst.Name, cst.Attribute)) and any(
                    v is not value and isinstance(v, type(value)) and get_full_name_for_node(v) == get_full_name_for_node(value)
                    for v in values
                ):
                    continue  # the same name: its other values are followed already
            if isinstance(value, (cst.Name, cst.Attribute)):
                dotted = get_full_name_for_node(value)
                if dotted and facts.bindings_of(dotted):
                    continue  # followed by binding_values
                if dotted and fn is not None and dotted in param_names(fn):
                    more = self._param_loaders(dotted, fn, depth)
                    if more is None:
                        return None
                    sites += more
                    leaves += 1
                    continue
                return None
            if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                continue
            leaves += 1
            site = self.loader_for(value) if isinstance(value, cst.Call) else None
            if site is not None:
                sites.append(site)
                continue
            built = self._factory_loaders(value, depth)
            if built is None:
                if own_iterables is not None and self._own_iterable_class(value) is not None:
                    own_iterables.append(value)  # type: ignore[arg-type]
                    continue
                return None
            sites += built
        return sites if leaves else None

    def _own_iterable_class(self, value: cst.BaseExpression) -> cst.ClassDef | None:
        """The class of this file (with ``__iter__`` or ``__getitem__``) that ``value`` constructs."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        for node, _ in self.facts.classes:
            if node.name.value == value.func.value and isinstance(node.body, cst.IndentedBlock):
                methods = {s.name.value for s in node.body.body if isinstance(s, cst.FunctionDef)}
                if methods & {"__iter__", "__getitem__"}:
                    return node
        return None

    def yields_plain_tensors(self, value: cst.Call) -> bool:
        """Whether an own iterable visibly builds nothing but torch tensors (every call in its class is
        ``torch.*``, a builtin, or a method of its own), and no class of this file defines a tensor-like
        ``.to``/``.cuda`` of its own."""
        cls = self._own_iterable_class(value)
        if cls is None:
            return False
        for node, _ in self.facts.classes:
            if isinstance(node.body, cst.IndentedBlock) and any(
                isinstance(s, cst.FunctionDef) and s.name.value in ("to", "cuda", "pin_memory") for s in node.body.body
            ):
                return False
        for call in self.facts.calls:
            if call.ctx.class_def is not cls or call.name is None:
                continue
            if call.qualname is not None:
                if not call.qualname.startswith("torch."):
                    return False
            elif call.name not in _BUILTINS and not call.name.startswith("self."):
                return False
        return True

    def _factory_loaders(self, value: cst.BaseExpression, depth: int) -> list[LoaderSite] | None:
        """``build_loader(ds, 64)`` → the DataLoaders that helper of this file returns."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        name = value.func.value
        functions = self.facts.functions_by_name.get(name, [])
        if not functions or name in self.class_names or self.facts.resolve(name):
            return None
        sites: list[LoaderSite] = []
        for fn in functions:
            returned = _returns(fn)
            if not returned:
                return None
            for expr in returned:
                more = self.loader_sites_for(expr, fn, depth + 1)
                if more is None:
                    return None
                sites += more
        return sites or None

    def _param_loaders(self, name: str, fn: cst.FunctionDef, depth: int) -> list[LoaderSite] | None:
        params = _positional_params(fn)
        index = params.index(name) if name in params else None
        callers = [c for c in self.direct_callers(fn) if not c.ctx.inside(fn)]
        sites: list[LoaderSite] = []
        for caller in callers:
            offset = 1 if params and params[0] in ("self", "cls") and (caller.name or "").startswith(("self.", "cls.")) else 0
            arg = caller.arg(name, None if index is None else index - offset)
            if arg is None:
                continue
            more = self.loader_sites_for(arg, caller.ctx.function, depth + 1)
            if more is None:
                return None
            sites += more
        if sites:
            return sites
        if callers:
            return None
        # Called from elsewhere (a framework, another module): a parameter named like a loader is
        # taken to be one of this file's DataLoaders when every one of them is plain.
        if "loader" in name.lower() and self.loaders:
            return list(self.loaders)
        return None

    @functools.cached_property
    def batch_loops(self) -> list[BatchLoop]:
        """Loops whose body receives batches from DataLoaders, with the names that hold them."""
        facts = self.facts
        loops: dict[int, BatchLoop] = {}
        seen_for: set[int] = set()
        for call in facts.calls:
            for frame in call.ctx.chain():
                if frame.kind != "loop" or not isinstance(frame.node, cst.For) or id(frame.node) in seen_for:
                    continue
                seen_for.add(id(frame.node))
                loop = frame.node
                outer = frame.parent
                assert outer is not None
                pairs = self._iteration_pairs(loop.target, loop.iter)
                batch = BatchLoop(loop, outer)
                for target, source in pairs:
                    own: list[cst.Call] = []
                    sites = self.loader_sites_for(source, outer.function, own_iterables=own)
                    if sites:
                        batch.names |= _target_names(target)
                        batch.loaders += sites
                        batch.own_iterables += own
                if batch.names:
                    loops[id(loop)] = batch
        for call in facts.calls:
            if call.name != "next" or not call.node.args:
                continue
            iter_call = self._next_source(call.node.args[0].value)
            if iter_call is None:
                continue
            source = iter_call.node.args[0].value
            own: list[cst.Call] = []
            sites = self.loader_sites_for(source, call.ctx.function, own_iterables=own)
            targets = _assigned_targets(call)
            if not sites or not targets:
                continue
            loop_frame = call.ctx.nearest("loop")
            loop = loop_frame.node if loop_frame is not None else (call.ctx.function or facts.module)
            outer = loop_frame.parent if loop_frame is not None and loop_frame.parent is not None else call.ctx
            batch = loops.setdefault(id(loop), BatchLoop(loop, outer, repeat_ctx=iter_call.ctx))
            for target in targets:
                batch.names |= _target_names(target)
            batch.loaders += sites
            batch.own_iterables += own
        for batch in loops.values():
            _add_unpacked(batch)
        return list(loops.values())

    def _iteration_pairs(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
        """(loop target part, iterated expression) pairs: ``enumerate``, ``tqdm`` and ``zip`` unwrapped."""
        if isinstance(iterable, cst.Call):
            dotted = get_full_name_for_node(iterable.func) or ""
            args = [a.value for a in iterable.args if a.keyword is None and not a.star]
            if dotted == "enumerate" and args:
                if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
                    return self._iteration_pairs(target.elements[1].value, args[0])
                return []
            if dotted == "zip" and args:
                if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(args):
                    out = []
                    for element, arg in zip(target.elements, args):
                        out += self._iteration_pairs(element.value, arg)
                    return out
                return []
            if _ITER_WRAPPERS.search(dotted) and args:
                return self._iteration_pairs(target, args[0])
            return []
        return [(target, iterable)]

    def _next_source(self, expr: cst.BaseExpression) -> CallSite | None:
        """``next(it)`` with ``it = iter(loader)`` (or ``next(iter(loader))``) → the ``iter`` call."""
        for value in self.facts.binding_values(expr):
            if isinstance(value, cst.Call) and get_full_name_for_node(value.func) == "iter" and value.args:
                return self.call_site(value)
        return None

    @functools.cached_property
    def _call_sites(self) -> dict[int, CallSite]:
        return {id(c.node): c for c in self.facts.calls}

    def call_site(self, node: cst.Call) -> CallSite | None:
        return self._call_sites.get(id(node))

    def reiterated(self, site: LoaderSite) -> bool:
        """Whether the loader is iterated again and again (one pass per epoch): its ``for`` loop, or
        the ``iter(loader)`` that feeds ``next``, repeats."""
        for batch in self.batch_loops:
            if any(s is site for s in batch.loaders) and self.repeats(batch.repeat_ctx):
                return True
        return False

    def is_training_loop(self, batch: BatchLoop) -> bool:
        facts = self.facts
        if facts.in_eval(batch.ctx):
            return False
        if isinstance(batch.loop, (cst.For, cst.While)):
            return self.body_trains(batch.loop)
        return batch.loop in self.step_functions or batch.loop in self.functions_reaching_step

    def repeats(self, ctx: Frame, depth: int = 2) -> bool:
        """Whether code at ``ctx`` runs more than once: inside a loop, or in a function called from one."""
        if ctx.nearest("loop") is not None:
            return True
        fn = ctx.function
        if fn is None or depth == 0:
            return False
        return any(self.repeats(c.ctx, depth - 1) for c in self.direct_callers(fn) if not c.ctx.inside(fn))


def pipeline_facts(facts: ScriptFacts) -> PipelineFacts:
    cached = _CACHE.get(facts)
    if cached is None:
        cached = PipelineFacts(facts)
        _CACHE[facts] = cached
    return cached


_CACHE: "weakref.WeakKeyDictionary[ScriptFacts, PipelineFacts]" = weakref.WeakKeyDictionary()


# -- small CST helpers ------------------------------------------------------------------------------


def _call_ids_within(container: cst.CSTNode) -> set[int]:
    found: set[int] = set()

    class _V(cst.CSTVisitor):
        def visit_Call(inner, n: cst.Call) -> None:  # noqa: N805
            found.add(id(n))

    container.visit(_V())
    return found


def flag_dest(call: cst.Call) -> str | None:
    """The attribute an ``add_argument(...)`` call sets: ``dest=``, else the first long option
    (``"-a", "--arch"`` → ``arch``, ``--vocab-size`` → ``vocab_size``), else the positional name."""
    named = keyword_arg(call, "dest")
    if named is not None:
        value = literal(named.value)
        return value if isinstance(value, str) else None
    options = [o for o in (literal(a.value) for a in call.args if a.keyword is None and not a.star) if isinstance(o, str)]
    longs = [o for o in options if o.startswith("--")]
    plain = [o for o in options if not o.startswith("-")]
    first = (longs or plain or options or [None])[0]
    return first.lstrip("-").replace("-", "_") if first else None


def _model_namespace(qualname: str | None) -> bool:
    """torchvision's classification models (not detection, video, ...) or timm's."""
    return qualname in ("torchvision.models", "timm", "timm.models")


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _returns(fn: cst.FunctionDef) -> list[cst.BaseExpression]:
    out: list[cst.BaseExpression] = []

    class _V(cst.CSTVisitor):
        def visit_FunctionDef(inner, node: cst.FunctionDef) -> bool:  # noqa: N805
            return node is fn

        def visit_Return(inner, node: cst.Return) -> None:  # noqa: N805
            if node.value is not None:
                out.append(node.value)

    fn.visit(_V())
    return out


function_returns = _returns  # public: the expressions a function's own ``return`` statements give


def _positional_params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]


def _small_statements(call: CallSite) -> list[cst.CSTNode]:
    statement = call.statement.node if call.statement else None
    if isinstance(statement, cst.SimpleStatementLine):
        return list(statement.body)
    return [statement] if statement is not None else []


def assigned_name(call: CallSite) -> str | None:
    for small in _small_statements(call):
        if isinstance(small, cst.Assign) and small.value is call.node and len(small.targets) == 1:
            return get_full_name_for_node(small.targets[0].target)
        if isinstance(small, cst.AnnAssign) and small.value is call.node:
            return get_full_name_for_node(small.target)
    return None


def _assigned_targets(call: CallSite) -> list[cst.BaseExpression]:
    for small in _small_statements(call):
        if isinstance(small, cst.Assign) and small.value is call.node:
            return [t.target for t in small.targets]
    return []


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        out: set[str] = set()
        for element in target.elements:
            out |= _target_names(element.value)
        return out
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    name = get_full_name_for_node(target)
    return {name} if name and isinstance(target, (cst.Name, cst.Attribute)) else set()


def _subscript_key(binding) -> str | None:
    """``kw["pin_memory"] = True`` → ``"pin_memory"`` (facts records it as a binding of ``kw``)."""
    statement = binding.statement.node if binding.statement else None
    smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
    for small in smalls:
        if isinstance(small, cst.Assign) and small.value is binding.value:
            for target in small.targets:
                node = target.target
                if isinstance(node, cst.Subscript) and len(node.slice) == 1:
                    index = node.slice[0].slice
                    if isinstance(index, cst.Index):
                        key = literal(index.value)
                        if isinstance(key, str):
                            return key
    return None


def _is_subscript_write(binding) -> bool:
    statement = binding.statement.node if binding.statement else None
    smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
    for small in smalls:
        if isinstance(small, cst.Assign) and small.value is binding.value:
            return any(isinstance(t.target, cst.Subscript) for t in small.targets)
    return False


def _add_unpacked(batch: BatchLoop) -> None:
    """``inputs, labels = data`` / ``images = batch["image"]`` inside the loop: more batch names."""
    names = batch.names

    def source_name(value: cst.BaseExpression) -> str | None:
        if isinstance(value, cst.Subscript):
            value = value.value
        return get_full_name_for_node(value) if isinstance(value, (cst.Name, cst.Attribute)) else None

    assigns: list[cst.Assign] = []

    class _V(cst.CSTVisitor):
        def visit_FunctionDef(inner, node: cst.FunctionDef) -> bool:  # noqa: N805
            return node is batch.loop

        def visit_Assign(inner, node: cst.Assign) -> None:  # noqa: N805
            assigns.append(node)

    body = batch.loop.body if isinstance(batch.loop, (cst.For, cst.While)) else batch.loop
    body.visit(_V())
    for _ in range(2):
        for node in assigns:
            values = node.value.elements if isinstance(node.value, (cst.Tuple, cst.List)) else None
            for target in node.targets:
                if values is not None and isinstance(target.target, (cst.Tuple, cst.List)):
                    for t, v in zip(target.target.elements, values):
                        if source_name(v.value) in names:
                            names |= _target_names(t.value)
                elif source_name(node.value) in names:
                    names |= _target_names(target.target)


def import_block_end(facts: ScriptFacts) -> cst.CSTNode | None:
    """The last statement of the file's leading import block (docstring, ``__future__``, imports and
    ``try: import`` shims): where a global backend setting is inserted."""
    last: cst.CSTNode | None = None
    for index, statement in enumerate(facts.module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            smalls = statement.body
            if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in smalls):
                last = statement
                continue
            if index == 0 and len(smalls) == 1 and isinstance(smalls[0], cst.Expr) and isinstance(smalls[0].value, cst.SimpleString):
                continue  # the module docstring
        if isinstance(statement, cst.Try) and all(
            isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
            for s in statement.body.body
        ):
            last = statement
            continue
        break
    return last


@dataclass(frozen=True, eq=False)
class InsertSetting(FixPlan):
    """A global setting inserted after the leading imports (``insert_setting`` in rewrite/edits.py picks
    the exact statement: after a later ``import torch`` too, beside settings already inserted)."""

    kind = "insert-statement"
    after_line: int  # the last line of the leading import block (0: none)
    code: str
    imports: tuple[str, ...] = ("torch",)


def setting_plan(facts: ScriptFacts, code: str) -> InsertSetting:
    """The plan for inserting ``code`` as a module-level statement after the leading imports."""
    last = import_block_end(facts)
    return InsertSetting(facts.position(last).end.line if last is not None else 0, code)
