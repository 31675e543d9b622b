"""Facts about the models a script trains: which names hold them, the calls that build them (through
method chains, wrappers and factory functions of the file), the statements that prepare a built model
(``model = model.cuda()``), whether one is built in a loop, and which of them are convnets with fixed
2-D inputs (channels_last, cudnn.benchmark). What the file's model classes build is read from
:mod:`tcaudit.script.model_classes`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from tcaudit.model_profile import SMALL_STEP_MS, AuditedModels, ModelProfile
from tcaudit.script.distributed import innermost_loop
from tcaudit.script.expressions import assigned_name, flag_dest, function_returns, literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.model_classes import CONV2D_LAYERS, calls_within, classes_building
from tcaudit.script.optimizers import MODEL_OPTIMIZER_FACTORIES, is_optimizer
from tcaudit.script.training_code import TrainingCodeFacts
from tcaudit.source.syntax import full_name, keyword, nodes_of

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
# Calls that wrap a model and return the wrapper (the model is their first positional argument).
MODEL_WRAPPERS = (
    "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel", "torch.compile", "torch.jit.script",
)
# Methods that return the model they are called on (``Net().cuda().train()``).
MODEL_CHAIN = frozenset({"cuda", "to", "train", "float", "half", "bfloat16", "requires_grad_", "apply", "to_empty"})
# Methods that prepare a built model without changing what it is (a compile goes after them): those a
# model's chain is followed through (MODEL_CHAIN), plus the ones a script also prepares the model with.
PREP = MODEL_CHAIN | {"cpu", "double", "load_state_dict", "share_memory"}
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


@dataclass
class ModelSite:
    name: str  # the dotted name that holds the trained model
    construction: cst.Call  # the call that builds it


class TrainedModelFacts(TrainingCodeFacts):
    """The trained models, on top of the training code (which names an optimizer receives)."""

    # -- models ------------------------------------------------------------------------------------
    @functools.cached_property
    def trained_model_names(self) -> list[str]:
        """Names whose parameters an optimizer receives (``SGD(model.parameters())``,
        ``[{"params": model.fc.parameters()}]`` → ``model``); the file's model-like names otherwise."""
        owners = self._optimizer_owners
        return self._bound_roots(owners or sorted(self.facts.model_names))

    @functools.cached_property
    def optimized_model_names(self) -> list[str]:
        """Names whose parameters an optimizer receives, in the order the optimizers are built (a GAN's
        two nets, an encoder and a decoder in one optimizer); empty where no optimizer names any."""
        return self._bound_roots(self._optimizer_owners)

    @functools.cached_property
    def _optimizer_owners(self) -> list[str]:
        facts = self.facts
        names: list[str] = []
        for call in facts.calls:
            qual = call.qualname or ""
            if qual.startswith(MODEL_OPTIMIZER_FACTORIES):  # timm's create_optimizer_v2(model, "adamw")
                model = call.arg("model_or_params", 0) if "create_optimizer_v2" in qual else call.arg("model", 1)
                if isinstance(model, (cst.Name, cst.Attribute)):
                    names.append(full_name(model) or "")
                continue
            if not is_optimizer(qual):
                continue
            inside = calls_within(call.node)
            # ``params = list(enc.parameters()) + list(dec.parameters()); SGD(params)``: the list built
            # before the optimizer names its models too.
            for arg in call.node.args:
                if isinstance(arg.value, (cst.Name, cst.Attribute)):
                    for value in facts.binding_values(arg.value):
                        if value is not arg.value:
                            inside |= calls_within(value)
            for inner in facts.calls:
                if inner.method in ("parameters", "named_parameters") and id(inner.node) in inside:
                    owner = inner.receiver_name
                    if owner:
                        names.append(owner)
        return names

    @functools.cached_property
    def frozen_model_names(self) -> set[str]:
        """Names whose parameters the script freezes (``teacher.requires_grad_(False)``, ``for p in
        ema.parameters(): p.requires_grad = False``) or holds as an average of another model
        (``AveragedModel(model)``, ``ModelEMA(model)``): updated, if at all, by something other than
        gradients. A name an optimizer also receives is not frozen."""
        facts = self.facts
        names: set[str] = set()
        for call in facts.method_calls("requires_grad_"):
            args = call.node.args
            if call.receiver_name and args and literal(args[0].value) is False:
                names.add(call.receiver_name)
        for loop in _parameter_loops(facts.module):
            if _clears_requires_grad(loop):
                names.add(full_name(loop.iter.func.value))  # type: ignore[attr-defined]
        for call in facts.calls:
            qual = call.qualname or call.name or ""
            if qual.endswith(("swa_utils.AveragedModel", "ModelEMA", "ModelEmaV2", "ModelEmaV3", "EMA")):
                target = assigned_name(call)
                if target:
                    names.add(target)
        return names - set(self.optimized_model_names)

    def _bound_roots(self, names: list[str]) -> list[str]:
        """Each name's shortest prefix that the file binds (``model.fc`` → ``model``), once each."""
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
        for call, _ in self.construction_paths(expr, depth, seen):
            yield call

    def construction_paths(self, expr: cst.BaseExpression, depth: int = 0, seen: set[int] | None = None,
                           through: tuple[cst.Call, ...] = ()) -> Iterator[tuple[cst.Call, tuple[cst.Call, ...]]]:
        """:meth:`constructions`, each with the calls of this file's functions whose ``return`` it came
        out of, outermost first (``model = get_model(args)`` → ``(Net(args.width), (get_model(args),))``):
        the model audit calls such a function only where the trained model is its return value."""
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
                yield from self.construction_paths(func.value, depth + 1, seen, through)
                continue
            qual = facts.qualname(func) or ""
            if qual in MODEL_WRAPPERS or qual.endswith(("DistributedDataParallel", "DataParallel")):
                if value.args:
                    yield from self.construction_paths(value.args[0].value, depth + 1, seen, through)
                continue
            dotted = full_name(func)
            if not qual and dotted and "." not in dotted and dotted in facts.functions_by_name and dotted not in self.class_names:
                for fn in facts.functions_by_name[dotted]:
                    for returned in function_returns(fn):
                        yield from self.construction_paths(returned, depth + 1, seen, (*through, value))
                continue
            yield value, through

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
        # Other classes are followed by the callee's or base's name as written (``Block``): a dotted
        # ``blocks.Block`` is taken for another module's class here, as it always has been (by its last name
        # it would make more classes convnets, and so more models, for TC302 and TC303).
        return classes_building(
            self.facts,
            lambda call: ((call.qualname or "") in CONV2D_LAYERS and not self._patchifies(call.node))
            or self._is_conv_factory(call.qualname or ""),
            bases=lambda qual: self._is_conv_factory(qual)
            or (qual.startswith("torchvision.models.") and bool(_CONV_ARCH.match(qual.split(".")[-1]))),
            as_written=True,
        )

    def _patchifies(self, call: cst.Call) -> bool:
        """``nn.Conv2d(3, width, kernel_size=patch, stride=patch)``: a vision transformer's patch embedding
        (one conv, a sliver of the FLOPs; the model audit says the same where it traces the model)."""
        qual = self.facts.qualname(call.func) or ""
        if not qual.endswith("Conv2d") or "Transpose" in qual:
            return False
        kernel_arg, stride_arg = keyword(call, "kernel_size", 2), keyword(call, "stride", 3)
        kernel = kernel_arg.value if kernel_arg is not None else None
        stride = stride_arg.value if stride_arg is not None else None
        if kernel is None or stride is None:
            return False
        code = self.facts.module.code_for_node
        return code(kernel).strip() == code(stride).strip() and not _is_one(kernel)

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
        dotted = full_name(call.func)
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
        if isinstance(func, cst.Call) and full_name(func.func) == "getattr" and not facts.bindings_of("getattr"):
            args = [a.value for a in func.args if a.keyword is None and not a.star]
            if len(args) == 2 and _model_namespace(facts.qualname(args[0])):
                return args[1]
            return None
        if (facts.qualname(func) or "") in _NAMED_FACTORIES:
            named = keyword(call, "model_name") or keyword(call, "name", 0)
            return named.value if named is not None else None
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
                default = keyword(call.node, "default")
                found.append(literal(default.value) if default is not None else ...)
        return found[0] if len(found) == 1 else ...

    @functools.cached_property
    def image_pipeline(self) -> bool:
        """Whether the script loads images the torchvision or timm way (4-D batches)."""
        return bool(self.facts.references_to(*_IMAGE_DATA))

    def _expr_builds_conv(self, expr: cst.BaseExpression) -> bool:
        facts = self.facts
        found = False
        for node in nodes_of(expr, cst.Call):  # each call asked, as a visitor of every call would
            qual = facts.qualname(node.func) or ""
            if (qual in CONV2D_LAYERS and not self._patchifies(node)) or self.is_conv_construction(node):
                found = True
        return found

    @functools.cached_property
    def conv_models(self) -> list[ModelSite]:
        """The trained convnets, as the script's text shows them (see :meth:`convnets`)."""
        return [site for site in self.trained_models if self.is_conv_construction(site.construction)]

    def profile_of(self, site: ModelSite, models: "AuditedModels | None") -> "ModelProfile | None":
        """What the model audit measured about this trained model, if it audited it."""
        if models is None:
            return None
        return models.for_site(site.name, self.facts.code(site.construction))

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

    def audited_launch_bound(self, models: "AuditedModels | None") -> bool:
        """Every trained model the audit measured is launch-bound at the script's batch (and it measured
        at least one): precision, TF32 and memory-format advice cannot pay there."""
        if models is not None and models.handed_in and not any(
            isinstance(site.construction, cst.Call) for site in self.trained_models
        ):
            # A module that builds no model and trains what scripts hand it (a Trainer class): every
            # model those scripts build was measured launch-bound.
            return bool(models.profiles) and all(p.launch_bound for p in models.profiles)
        profiles = [self.profile_of(site, models) for site in self.trained_models]
        return bool(profiles) and all(p is not None and p.launch_bound for p in profiles)

    def audited_small_step(self, models: "AuditedModels | None") -> bool:
        """Every trained model was audited, and together their forwards model within
        :data:`~tcaudit.model_profile.SMALL_STEP_MS` (or each is launch-bound): a step whose launches
        cost about as much as its math, where CUDA graphs pay."""
        profiles = [self.profile_of(site, models) for site in self.trained_models]
        if not profiles or any(p is None for p in profiles):
            return False
        return all(p.launch_bound for p in profiles) or sum(p.forward_ms for p in profiles) <= SMALL_STEP_MS

    def audited_convnet(self, models: "AuditedModels | None") -> bool | None:
        """Whether the audited trained models include a convnet; None when the audit measured none of them."""
        profiles = [p for p in (self.profile_of(site, models) for site in self.trained_models) if p is not None]
        return any(p.is_convnet for p in profiles) if profiles else None


def _parameter_loops(module: cst.Module) -> list[cst.For]:
    """``for p in <name>.parameters():`` loops anywhere in the file."""
    out = []
    for node in nodes_of(module, cst.For):
        func = node.iter.func if isinstance(node.iter, cst.Call) else None
        if (isinstance(func, cst.Attribute) and isinstance(func.value, (cst.Name, cst.Attribute))
                and func.attr.value == "parameters"):
            out.append(node)
    return out


def _clears_requires_grad(loop: cst.For) -> bool:
    """``for p in m.parameters(): p.requires_grad = False`` (or ``p.requires_grad_(False)``)."""
    if not isinstance(loop.target, cst.Name):
        return False
    variable = loop.target.value
    for statement in loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []:
        for small in getattr(statement, "body", []):
            if isinstance(small, cst.Assign) and literal(small.value) is False:
                for target in small.targets:
                    node = target.target
                    if (isinstance(node, cst.Attribute) and node.attr.value == "requires_grad"
                            and isinstance(node.value, cst.Name) and node.value.value == variable):
                        return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                func = small.value.func
                if (isinstance(func, cst.Attribute) and func.attr.value == "requires_grad_"
                        and isinstance(func.value, cst.Name) and func.value.value == variable
                        and small.value.args and literal(small.value.args[0].value) is False):
                    return True
    return False


def _is_one(expr: cst.BaseExpression) -> bool:
    """A 1x1 convolution with stride 1 is a pointwise conv, not a patch embedding."""
    return isinstance(expr, cst.Integer) and expr.value == "1"


def _model_namespace(qualname: str | None) -> bool:
    """torchvision's classification models (not detection, video, ...) or timm's."""
    return qualname in ("torchvision.models", "timm", "timm.models")


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


# -- preparing a built model ---------------------------------------------------------------------------


def strip_chain(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``Net().cuda().to(device)`` → ``Net()``."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in PREP:
        expr = expr.func.value
    return expr


def is_prep(statement: cst.CSTNode, name: str) -> bool:
    """``model = model.cuda()``, ``model.to(device)``, or ``if device == "cuda":`` around such lines only."""
    if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
        return all(is_prep(item, name) for item in statement.body.body)
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Assign):
        if len(small.targets) != 1 or full_name(small.targets[0].target) != name:
            return False
        value = small.value
    elif isinstance(small, cst.Expr):
        value = small.value
    else:
        return False
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in PREP):
        return False
    root = strip_chain(value)
    return full_name(root) == name


def from_loop_or_comprehension(facts: ScriptFacts, value: cst.BaseExpression, depth: int = 0) -> bool:
    """``[Net() for _ in range(k)]``, or ``models[0]`` / ``ensemble`` whose value was built so."""
    if has_comprehension(value):
        return True
    expr = strip_chain(value)
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    dotted = full_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if dotted is None or depth > 3:
        return False
    for binding in facts.bindings_of(dotted):
        if binding.value is value:
            continue
        if expr is not value and innermost_loop(binding.ctx) is not None:
            return True
        if from_loop_or_comprehension(facts, binding.value, depth + 1):
            return True
    return False


def has_comprehension(node: cst.CSTNode) -> bool:
    """Whether ``node`` is or holds a list, set or dict comprehension or a generator expression."""
    return bool(nodes_of(node, COMPREHENSIONS))
