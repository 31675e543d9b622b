"""TC411 images-normalized-on-host: a torchvision pipeline ends in ``ToTensor()`` (+ ``Normalize``), so the
loader's workers turn every uint8 image into float32 and the training loop pins and copies four times
the bytes (info).

Detects a ``transforms.Compose([...])`` with ``ToTensor()`` (torchvision's v1 transforms) used as the
``transform`` of an image dataset (a torchvision dataset of PIL images: ImageFolder, FakeData, CIFAR,
MNIST...; or a Dataset class of this file whose ``__getitem__`` hands ``self.transform`` a PIL image)
that a training DataLoader reads, in a script that trains on CUDA.

Fix (numerics): the workers return uint8 (``ToTensor()`` becomes ``PILToTensor()`` and a final
``Normalize(mean, std)`` leaves the Compose), and every loop over the loaders of those datasets converts
and normalizes the batch right after it is copied to the device, with ``tcaudit_normalize(images, mean,
std)`` (a helper inserted after the imports that does what ToTensor and Normalize did: the same
operations in the same order, so the values are equal on the same device). Declined, with the reason,
where the pipeline does more after ``ToTensor`` (``RandomErasing``, ``Lambda``), where the samples may
not be PIL images (a custom ``loader=``, a Dataset that does not build them), where the dataset is used
beyond its DataLoaders or the loader has a ``collate_fn``, where a loop over the loader has no copy of
the images to the device, or reads them before it, where ``Normalize``'s statistics are not constants,
and under ``fix --dali`` (DALI decodes and normalizes on the GPU instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, ensure_import, parse_expression, parse_statement, torch_import_name
from tcaudit.rewrite.edits import CallEditor, index_after_imports, insert_block
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.evidence import CUDA_EVIDENCE, TRAINS
from tcaudit.script.expressions import literal, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, keyword, method_of, nodes_of, parent_map
from tcaudit.source.triggers import all_of

HELPER = "tcaudit_normalize"
_STATS = "_TCAUDIT_NORMALIZE_STATS"
HELPER_CODE = f'''\
{_STATS} = {{}}


def {HELPER}(images, mean=None, std=None):
    """What ToTensor() and Normalize(mean, std) did in the DataLoader's workers, done on the batch where it
    is (the GPU): the workers hand over uint8 images, a quarter of the bytes to pin and copy. The same
    operations in the same order (tcaudit fix, TC411)."""
    if images.dtype != torch.uint8:
        return images  # a batch from another source of the loop (synthetic data), as it was
    floats = images.to(torch.get_default_dtype()).div_(255)
    if mean is None:
        return floats
    key = (floats.device, floats.dtype, tuple(mean), tuple(std))
    if key not in {_STATS}:  # once per device: a copy from the host each step waits for the GPU
        {_STATS}[key] = tuple(
            torch.as_tensor(values, dtype=floats.dtype, device=floats.device).view(-1, 1, 1) for values in (mean, std)
        )
    mean, std = {_STATS}[key]
    return floats.sub_(mean).div_(std)
'''

_TRANSFORMS = "torchvision.transforms."
# torchvision datasets whose samples are (PIL image, target) pairs of 8-bit RGB or L images, and where
# their ``transform`` goes when it is passed by position.
IMAGE_DATASETS = {
    "ImageFolder": 1, "FakeData": 3, "CIFAR10": 2, "CIFAR100": 2, "MNIST": 2, "FashionMNIST": 2, "KMNIST": 2,
    "QMNIST": 2, "SVHN": 2, "STL10": 3, "ImageNet": None, "Food101": None, "Flowers102": None,
    "OxfordIIITPet": None, "StanfordCars": None, "DTD": None, "GTSRB": None, "FGVCAircraft": None,
    "EuroSAT": None, "Country211": None, "SUN397": None, "Places365": None, "Caltech101": None,
    "Caltech256": None, "CelebA": None, "LSUN": None,
}
# Datasets of images under 64 pixels a side (28x28, 32x32), not reported unless the pipeline makes them larger.
_SMALL_IMAGE_DATASETS = frozenset({"MNIST", "FashionMNIST", "KMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN"})
_SMALL_SIDE = 64
_RESIZES = frozenset({"Resize", "RandomResizedCrop", "CenterCrop", "RandomCrop"})
# What a Dataset of this file may hand its transform: a PIL image in one of these modes.
_PIL_MODES = frozenset({"RGB", "L", "RGBA", "LA", "P", "CMYK", "YCbCr", "LAB", "HSV"})
_SHAPE_READS = frozenset({"size", "shape", "dim", "ndim", "numel", "device", "dtype"})
# Copies and layout changes that keep the values (and uint8), in a statement rebinding the images.
_LAYOUT_MOVES = frozenset({"to", "cuda", "contiguous"})
_ITERATION_WRAPPERS = ("enumerate", "tqdm", "trange", "iter")


class ImagesNormalizedOnHost(ScriptRule):
    id = "TC411"
    after = ("TC405",)  # under ``fix --dali`` the DALI conversion normalizes on the GPU instead
    triggers = (all_of(r"ToTensor", CUDA_EVIDENCE, TRAINS),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.uses_cuda or not pipeline.trains:
            return
        cost = context.cost(self.spec, "bytes")
        parents = parent_map(facts.module)
        for call in facts.calls:
            if call.qualname != _TRANSFORMS + "ToTensor":
                continue
            transform, steps = _pipeline_of(facts, call, parents)
            datasets = _datasets_using(facts, transform)
            loaders = [site for dataset in datasets for site in pipeline.loaders_over(dataset.node)]
            if not any(site.training for site in loaders) or _small_images(facts, datasets, steps):
                continue
            if any(pipeline.dali_wrapped(site) for site in loaders):
                continue
            yield self.finding(
                facts,
                call.node,
                "`ToTensor()` makes float32 images in the loader's workers: 4x the bytes to pin and copy",
                explanation=(
                    "The workers convert each uint8 image to float32 (and normalize it) on the CPU, and the "
                    "loop then pins and copies four times the bytes of the decoded image; return uint8 "
                    f"(`PILToTensor()`) and convert and normalize the batch on the GPU{cost}."
                ),
                fix=self.planned_fix(
                    FixClass.NUMERICS,
                    "return uint8 images from the workers; convert and normalize each batch on the device",
                    lambda call=call, transform=transform, steps=steps, datasets=datasets, loaders=loaders: _plan(
                        facts, pipeline, context, call.node, transform, steps, datasets, loaders
                    ),
                ),
            )


def _pipeline_of(
    facts: ScriptFacts, to_tensor: CallSite, parents: dict[int, cst.CSTNode]
) -> tuple[cst.Call, list[tuple[str, cst.BaseExpression]] | None]:
    """The transform ``ToTensor()`` belongs to: the torchvision (v1) ``Compose([...])`` listing it, with
    its steps as (class name, expression; "" for a step that is not a torchvision transform), or the
    ``ToTensor()`` alone (no steps: it is the whole transform, or part of something else)."""
    element = parents.get(id(to_tensor.node))
    listed = parents.get(id(element)) if isinstance(element, cst.Element) else None
    argument = parents.get(id(listed)) if isinstance(listed, (cst.List, cst.Tuple)) else None
    compose = parents.get(id(argument)) if isinstance(argument, cst.Arg) else None
    qual = facts.qualname(compose.func) if isinstance(compose, cst.Call) else None
    if not (qual == _TRANSFORMS + "Compose" and compose.args[0] is argument):  # type: ignore[union-attr]
        # The whole transform: passed as it is, or bound to a name first (``tf = transforms.ToTensor()``).
        alone = element is None or isinstance(element, (cst.Arg, cst.Assign))
        return to_tensor.node, [("ToTensor", to_tensor.node)] if alone else None
    steps: list[tuple[str, cst.BaseExpression]] = []
    for item in listed.elements:  # type: ignore[union-attr]
        if isinstance(item, cst.StarredElement):
            return compose, None  # type: ignore[return-value]
        step = _step_call(facts, item.value)
        name = facts.qualname(step.func) if step is not None else None
        steps.append((name[len(_TRANSFORMS):] if name and name.startswith(_TRANSFORMS) else "", item.value))
    return compose, steps  # type: ignore[return-value]


@dataclass(frozen=True)
class _Dataset:
    node: cst.Call
    name: str  # the class, as written


def _small_images(facts: ScriptFacts, datasets: list[_Dataset], steps: list[tuple[str, cst.BaseExpression]] | None) -> bool:
    """Every dataset holds images of under 64 pixels a side (MNIST, CIFAR, SVHN; FakeData of a literal small
    size) and no step resizes or crops them larger: a float batch of such images is a few MB, and what
    the workers spend on it was not measured to matter. Those are not reported."""
    for _, step in steps or []:
        call = _step_call(facts, step)
        name = (facts.qualname(call.func) or "").split(".")[-1] if call is not None else ""
        if name in _RESIZES and call is not None and call.args:
            sizes = _numbers(call.args[0].value)
            if not all(isinstance(v, int) and v < _SMALL_SIDE for v in sizes):
                return False
    for dataset in datasets:
        if dataset.name == "FakeData":
            size = _fake_data_size(dataset.node)
            if not (len(size) == 3 and all(isinstance(v, int) for v in size) and max(size[1:]) < _SMALL_SIDE):  # type: ignore[type-var]
                return False
        elif dataset.name not in _SMALL_IMAGE_DATASETS:
            return False
    return bool(datasets)


def _fake_data_size(call: cst.Call) -> list[object]:
    """FakeData's ``image_size`` (its default is (3, 224, 224)), as written: numbers, or ``...`` for the rest."""
    argument = keyword(call, "image_size", 1)
    value = argument.value if argument is not None else None
    return [3, 224, 224] if value is None else _numbers(value)


def _numbers(value: cst.BaseExpression) -> list[object]:
    """``224`` or ``(3, 32, 32)`` as written: the values, ``...`` for what is not a literal."""
    if isinstance(value, (cst.Tuple, cst.List)):
        return [literal(e.value) for e in value.elements]
    return [literal(value)]


def _step_call(facts: ScriptFacts, expr: cst.BaseExpression) -> cst.Call | None:
    if isinstance(expr, cst.Call):
        return expr
    if isinstance(expr, cst.Name):
        values = [b.value for b in facts.bindings_of(expr.value)]
        if len(values) == 1 and isinstance(values[0], cst.Call):
            return values[0]
    return None


def _datasets_using(facts: ScriptFacts, compose: cst.Call) -> list[_Dataset]:
    """The dataset constructions whose ``transform`` may be this Compose (directly or through names)."""
    out = []
    for call in facts.calls:
        dataset = _dataset_class(facts, call)
        if dataset is None:
            continue
        transform = _transform_argument(facts, call, dataset)
        if transform is not None and any(value is compose for value in facts.binding_values(transform)):
            out.append(_Dataset(call.node, dataset))
    return out


def _dataset_class(facts: ScriptFacts, call: CallSite) -> str | None:
    qual = call.qualname or ""
    if qual.startswith("torchvision.datasets.") and qual.split(".")[-1] in IMAGE_DATASETS:
        return qual.split(".")[-1]
    if call.name and "." not in call.name and _own_dataset_class(facts, call.name) is not None:
        return call.name
    return None


def _own_dataset_class(facts: ScriptFacts, name: str) -> cst.ClassDef | None:
    """The Dataset class of this file called ``name`` (one with ``__init__`` and ``__getitem__``)."""
    cls = facts.classes_by_name.get(name)
    if cls is None or method_of(cls, "__getitem__") is None or method_of(cls, "__init__") is None:
        return None
    return cls


def _transform_argument(facts: ScriptFacts, call: CallSite, dataset: str) -> cst.BaseExpression | None:
    argument = keyword(call.node, "transform")
    if argument is not None:
        return argument.value
    position = IMAGE_DATASETS.get(dataset)
    if dataset not in IMAGE_DATASETS:
        init = method_of(_own_dataset_class(facts, dataset), "__init__")  # type: ignore[arg-type]
        params = [p.name.value for p in init.params.params] if init is not None else []  # type: ignore[union-attr]
        position = params.index("transform") - 1 if "transform" in params else None
    if position is None:
        return None
    positional = [a for a in call.node.args if a.keyword is None and not a.star]
    return positional[position].value if position < len(positional) else None


# -- the plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NormalizeOnDevice(FixPlan):
    """``ToTensor()`` becomes ``PILToTensor()``, the Compose's final ``Normalize`` goes, and each loop
    over the loaders normalizes its batch on the device: a statement after the copy, or the copy
    wrapped where it is made inside an expression (``model(images.cuda())``)."""

    kind = "normalize-on-device"
    to_tensor: cst.Call
    transform: cst.Call  # the Compose (or the ToTensor that is the whole transform)
    normalize_index: int | None  # the Normalize step's index in the Compose's list, removed
    after_statements: tuple[tuple[cst.CSTNode, str], ...]  # (statement, the name to normalize after it)
    wrapped_copies: tuple[cst.Call, ...]
    mean: str | None
    std: str | None
    lines: tuple[int, ...]  # the loops' lines, for the report


def _plan(
    facts: ScriptFacts, pipeline: PipelineFacts, context: RuleContext, to_tensor: cst.Call, transform: cst.Call,
    steps: list[tuple[str, cst.BaseExpression]] | None, datasets: list[_Dataset], loaders: list[LoaderSite],
) -> NormalizeOnDevice:
    if "dali" in context.settings.structural_fixes and context.fixable("TC405", facts):
        raise DeclineFix("`fix --dali` decodes and normalizes these images on the GPU instead")
    if torch_import_name(facts) != "torch":
        raise DeclineFix("the file does not import torch as `torch`, which the inserted helper uses")
    if steps is None:
        raise DeclineFix("`ToTensor()` is not the transform or a step of a `Compose([...])` listed here")
    names = [name for name, _ in steps]
    at = next(i for i, (_, step) in enumerate(steps) if _step_call(facts, step) is to_tensor)
    tail = names[at + 1:]
    if tail not in ([], ["Normalize"]) or "PILToTensor" in names:
        shown = ", ".join(name or "a step of this file" for name in tail)
        raise DeclineFix(f"the transform goes on after `ToTensor()` ({shown}), on float images; convert by hand")
    if to_tensor.args:
        raise DeclineFix("`ToTensor` gets arguments here; convert by hand")
    mean = std = None
    if tail:
        normalize = _step_call(facts, steps[-1][1])
        assert normalize is not None
        mean, std = _statistics(facts, normalize)
    parents = parent_map(facts.module)
    for dataset in datasets:
        _check_dataset(facts, dataset, parents)
    ours = {id(d.node) for d in datasets}
    after: list[tuple[cst.CSTNode, str]] = []
    wrapped: list[cst.Call] = []
    lines: list[int] = []
    for site in loaders:
        if site.has("collate_fn") or not site.complete:
            raise DeclineFix(
                f"the DataLoader at line {facts.line_of(site.call.node)} has a `collate_fn` or `**kwargs` that may "
                "expect float images"
            )
        loops = [b for b in pipeline.batch_loops if any(s.call.node is site.call.node for s in b.loaders)]
        if not loops:
            raise DeclineFix(f"no loop over the DataLoader at line {facts.line_of(site.call.node)} was found")
        for batch in loops:
            _check_other_sources(facts, batch.loaders, ours, facts.line_of(batch.loop))
            inserted, copies = _loop_edits(facts, pipeline, batch.loop)
            after += [edit for edit in inserted if all(edit[0] is not done[0] for done in after)]
            wrapped += [copy for copy in copies if all(copy is not done for done in wrapped)]
            lines.append(facts.line_of(batch.loop))
    return NormalizeOnDevice(
        to_tensor, transform, len(steps) - 1 if tail else None, tuple(after), tuple(wrapped), mean, std,
        tuple(sorted(set(lines))),
    )


def _check_other_sources(facts: ScriptFacts, loaders: list[LoaderSite], ours: set[int], line: int) -> None:
    """A loop may also take batches from elsewhere (a synthetic-data branch): ``tcaudit_normalize`` passes
    batches that are not uint8 through unchanged. But another dataset with a ``ToTensor`` pipeline of its
    own would be converted by its own finding, with other statistics: the loop cannot tell them apart."""
    for site in loaders:
        argument = site.call.arg("dataset", 0)
        for value in facts.binding_values(argument) if argument is not None else []:
            if not isinstance(value, cst.Call) or id(value) in ours:
                continue
            transform = keyword(value, "transform")
            text = facts.code(transform.value if transform is not None else value)
            if "ToTensor" in text:
                raise DeclineFix(
                    f"the loop at line {line} also takes batches from the dataset at line {facts.line_of(value)}, "
                    "whose transform differs; convert by hand"
                )


def _statistics(facts: ScriptFacts, normalize: cst.Call) -> tuple[str, str]:
    """``Normalize``'s mean and std as code valid anywhere in the file: number lists or module constants."""
    out = []
    for key, position in (("mean", 0), ("std", 1)):
        argument = keyword(normalize, key, position)
        value = argument.value if argument is not None else None
        if value is None or not _constant(facts, value):
            raise DeclineFix(f"`Normalize`'s {key} is not a list of numbers or a module-level constant here")
        out.append(facts.code(value))
    return out[0], out[1]


def _constant(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.List, cst.Tuple)):
        return bool(value.elements) and all(
            isinstance(literal(e.value), (int, float)) and not isinstance(literal(e.value), bool) for e in value.elements
        )
    if isinstance(value, cst.Name):
        bindings = facts.bindings_of(value.value)
        return (len(bindings) == 1 and bindings[0].ctx is facts.module_frame
                and isinstance(bindings[0].value, (cst.List, cst.Tuple)) and _constant(facts, bindings[0].value))
    return False


def _check_dataset(facts: ScriptFacts, dataset: _Dataset, parents: dict[int, cst.CSTNode]) -> None:
    call = dataset.node
    if any(a.star for a in call.args):
        raise DeclineFix(f"`{dataset.name}` gets `*args`/`**kwargs`: what it hands the transform cannot be read")
    if keyword(call, "loader") is not None:
        raise DeclineFix(f"`{dataset.name}` has its own `loader=`, which may not return PIL images")
    if dataset.name not in IMAGE_DATASETS:
        _check_own_dataset(facts, dataset.name)
    _check_dataset_uses(facts, dataset, parents)


def _check_own_dataset(facts: ScriptFacts, name: str) -> None:
    """The Dataset class of this file hands ``self.transform`` a PIL image (``Image.open(...).convert(mode)``
    or ``Image.fromarray(...)``) and returns the transformed image first."""
    getitem = method_of(_own_dataset_class(facts, name), "__getitem__")  # type: ignore[arg-type]
    assert getitem is not None
    why = f"could not tell that `{name}.__getitem__` hands its transform a PIL image and returns it first"
    calls = [c for c in nodes_of(getitem, cst.Call) if full_name(c.func) == "self.transform"]
    if len(calls) != 1 or not calls[0].args:
        raise DeclineFix(why)
    transformed = calls[0]
    # ``image = self.transform(image)`` binds the name again: that value is the result, not the input.
    handed = [v for v in _local_values(getitem, calls[0].args[0].value) if v is not transformed]
    if not handed or not all(_pil_image(facts, value) for value in handed):
        raise DeclineFix(why)
    returns = nodes_of(getitem, cst.Return)
    for ret in returns:
        value = ret.value
        first = value.elements[0].value if isinstance(value, (cst.Tuple, cst.List)) and value.elements else None
        # Where a transform is given (this dataset gets one) the value returned is the transformed one.
        if first is None or not any(v is transformed for v in _local_values(getitem, first)):
            raise DeclineFix(why)


def _local_values(function: cst.FunctionDef, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What ``expr`` may be inside ``function``: itself, or the values a name of it is assigned there."""
    if not isinstance(expr, cst.Name):
        return [expr]
    values = [
        assign.value for assign in nodes_of(function, cst.Assign)
        if any(isinstance(t.target, cst.Name) and t.target.value == expr.value for t in assign.targets)
    ]
    return values or [expr]


def _pil_image(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    qual = facts.qualname(value.func) or ""
    if qual == "PIL.Image.fromarray":
        return True
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value == "convert" and value.args:
        mode = literal(value.args[0].value)
        inner = func.value
        return mode in _PIL_MODES and isinstance(inner, cst.Call) and (facts.qualname(inner.func) or "") in (
            "PIL.Image.open", "PIL.Image.fromarray")
    return False


def _check_dataset_uses(facts: ScriptFacts, dataset: _Dataset, parents: dict[int, cst.CSTNode]) -> None:
    """The dataset reaches nothing but DataLoaders (and ``len``): an item read elsewhere would now be uint8."""
    names = {b.target for b in facts.bindings if b.value is dataset.node}
    for node in nodes_of(facts.module, cst.Name):
        if node.value not in names:
            continue
        parent = parents.get(id(node))
        if isinstance(parent, (cst.AssignTarget, cst.Attribute)) or parent is None:
            continue  # its binding, or an attribute read (``.classes``, ``.targets``)
        if isinstance(parent, cst.Arg):
            call = parents.get(id(parent))
            called = facts.qualname(call.func) if isinstance(call, cst.Call) else None  # type: ignore[union-attr]
            if called in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader", "len") or (
                (called or "").startswith("torch.utils.data.") and (called or "").endswith("Sampler")
            ):
                continue  # a sampler reads the dataset's length only
            if isinstance(call, cst.Call) and full_name(call.func) == "len":
                continue
        raise DeclineFix(
            f"`{node.value}` is used at line {facts.line_of(node)} beyond its DataLoader, where its items would now be uint8"
        )


# -- the loops ----------------------------------------------------------------------------------------


def _loop_edits(
    facts: ScriptFacts, pipeline: PipelineFacts, loop: cst.CSTNode
) -> tuple[list[tuple[cst.CSTNode, str]], list[cst.Call]]:
    """Where this loop normalizes its images: after the statement that copies them to the device (after
    the ``if`` holding it, where the copy is conditional: ``if torch.cuda.is_available():``), or around
    copies made inside expressions."""
    line = facts.line_of(loop)
    if not isinstance(loop, cst.For):
        raise DeclineFix(f"the batches at line {line} are not taken in a `for` loop over the DataLoader")
    found = _image_name(loop)
    if found is None:
        raise DeclineFix(f"could not tell which name holds the images in the loop at line {line}")
    images, whole_batch = found
    body = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
    copies = [
        c for c in facts.calls_within(loop)
        if c.method in ("to", "cuda") and moves_to_device(c)
        and _copies_images(c.receiver, images, whole_batch)
    ]
    shown = f"{images}[0]" if whole_batch else images
    if not copies:
        raise DeclineFix(f"the loop at line {line} does not copy `{shown}` to the device")
    rebound = [c for c in copies if _assigned_to(c) is not None]
    if rebound and len(rebound) != len(copies):
        raise DeclineFix(f"`{images}` is copied to the device in several ways in the loop at line {line}")
    parents = parent_map(loop)
    # The names the copies read: ``images`` in ``images.cuda()``, ``data`` in ``data[0].to(device)``.
    allowed = {id(n) for c in copies for n in nodes_of(c.node.func.value, cst.Name) if n.value == images}  # type: ignore[attr-defined]
    if whole_batch:
        allowed |= _other_items(loop, images, parents)
    if not rebound:
        _check_reads(facts, images, body, len(body), allowed, parents)
        return [], [c.node for c in copies]
    targets = {_assigned_to(c) for c in copies}
    holders = {id(_holder(body, c.statement.node)) for c in copies if c.statement is not None}
    if len(targets) != 1 or len(holders) != 1 or any(c.statement is None for c in copies):
        raise DeclineFix(f"`{images}` is copied to the device in several places in the loop at line {line}")
    holder = _holder(body, copies[0].statement.node)  # type: ignore[union-attr]
    if holder is None:
        raise DeclineFix(f"the copy of `{images}` at line {facts.line_of(copies[0].node)} is nested too deep to follow")
    if holder is not copies[0].statement.node and not isinstance(holder, cst.If):  # type: ignore[union-attr]
        raise DeclineFix(f"the copy of `{images}` at line {facts.line_of(copies[0].node)} sits in a block that uses it")
    target = targets.pop()
    _check_reads(facts, images, body, body.index(holder) + 1, allowed, parents)
    if target != images:
        _check_reads(facts, target, body, body.index(holder) + 1, allowed, parents)
        _check_later_reads(facts, images, body[body.index(holder) + 1:], parents, allowed)
    return [(holder, target)], []


def _copies_images(receiver: cst.BaseExpression | None, images: str, whole_batch: bool) -> bool:
    if not whole_batch:
        return isinstance(receiver, cst.Name) and receiver.value == images
    return _first_item(receiver, images)


def _first_item(node: cst.CSTNode | None, batch: str) -> bool:
    """``batch[0]``."""
    return (
        isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == batch
        and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(node.slice[0].slice.value, cst.Integer) and node.slice[0].slice.value.value == "0"
    )


def _other_items(loop: cst.For, batch: str, parents: dict[int, cst.CSTNode]) -> set[int]:
    """The reads of ``batch[k]`` for another element ``k`` (the labels): they stay as they were."""
    out = set()
    for node in nodes_of(loop.body, cst.Name):
        parent = parents.get(id(node))
        if node.value == batch and isinstance(parent, cst.Subscript) and parent.value is node and not _first_item(parent, batch):
            out.add(id(node))
    return out


def _image_name(loop: cst.For) -> tuple[str, bool] | None:
    """The first element of the batch: ``images`` for ``for images, target in loader`` or ``for i, (images,
    target) in enumerate(loader)``, (name, False); the batch itself where the loop takes it whole and
    indexes it (``for i, data in enumerate(loader, 0): inputs = data[0].to(device)``), (name, True)."""
    target, source = loop.target, loop.iter
    while isinstance(source, cst.Call) and (full_name(source.func) or "").split(".")[-1] in _ITERATION_WRAPPERS:
        if (full_name(source.func) or "").endswith("enumerate"):
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                return None
            target = target.elements[1].value
        source = source.args[0].value if source.args else source
        if not isinstance(source, cst.Call):
            break
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements and isinstance(target.elements[0].value, cst.Name):
        return target.elements[0].value.value, False
    if isinstance(target, cst.Name):
        return target.value, True
    return None


def _assigned_to(copy: CallSite) -> str | None:
    """``x = images.cuda()`` or ``images, target = images.cuda(), target.cuda()``: the name bound to the copy."""
    statement = copy.statement.node if copy.statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target, value = small.targets[0].target, small.value
    if value is copy.node and isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
        for t, v in zip(target.elements, value.elements):
            if v.value is copy.node and isinstance(t.value, cst.Name):
                return t.value.value
    return None


def _holder(body: list[cst.CSTNode], statement: cst.CSTNode) -> cst.CSTNode | None:
    """The statement of the loop's body that is or holds ``statement``, one ``if`` deep at most."""
    for item in body:
        if item is statement:
            return item
        if isinstance(item, cst.If) and any(statement is s for s in _if_statements(item)):
            return item
    return None


def _if_statements(node: cst.If) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else []
    orelse = node.orelse
    if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock):
        out += list(orelse.body.body)
    elif isinstance(orelse, cst.If):
        out += _if_statements(orelse)
    return out


def _check_reads(
    facts: ScriptFacts, name: str, body: list[cst.CSTNode], stop: int, allowed: set[int], parents: dict[int, cst.CSTNode]
) -> None:
    """Before the normalization (``body[:stop]``), ``name`` is only copied, bound, or asked for its shape."""
    for statement in body[:stop]:
        for node in nodes_of(statement, cst.Name):
            if node.value != name or id(node) in allowed:
                continue
            parent = parents.get(id(node))
            if isinstance(parent, (cst.AssignTarget, cst.Element)) and _is_target(statement, node):
                continue
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _SHAPE_READS:
                continue
            if isinstance(parent, cst.Attribute) and parent.attr.value in _LAYOUT_MOVES and _rebinds(
                _line_of(node, parents), name
            ):
                continue  # ``images = images.contiguous(memory_format=torch.channels_last)`` (TC303): uint8 too
            raise DeclineFix(f"`{name}` is read at line {facts.line_of(node)} before it reaches the device as floats")


def _check_later_reads(
    facts: ScriptFacts, name: str, body: list[cst.CSTNode], parents: dict[int, cst.CSTNode], allowed: set[int]
) -> None:
    """After ``x = images.cuda()`` the host batch itself is read no more (it stays uint8)."""
    for statement in body:
        for node in nodes_of(statement, cst.Name):
            parent = parents.get(id(node))
            if id(node) in allowed:
                continue
            if node.value == name and not (isinstance(parent, cst.Attribute) and parent.attr.value in _SHAPE_READS):
                raise DeclineFix(f"`{name}` is read at line {facts.line_of(node)}, where it would now be uint8")


def _line_of(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.CSTNode | None:
    """The simple statement (line) holding ``node``."""
    current: cst.CSTNode | None = node
    while current is not None and not isinstance(current, cst.SimpleStatementLine):
        current = parents.get(id(current))
    return current


def _rebinds(statement: cst.CSTNode | None, name: str) -> bool:
    """``name = ...`` (a statement of one assignment to the name alone)."""
    return (
        isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
        and isinstance(statement.body[0].targets[0].target, cst.Name) and statement.body[0].targets[0].target.value == name
    )


def _is_target(statement: cst.CSTNode, node: cst.Name) -> bool:
    for assign in nodes_of(statement, cst.Assign):
        for target in assign.targets:
            if any(n is node for n in nodes_of(target.target, cst.Name)):
                return True
    return False


# -- the fix ------------------------------------------------------------------------------------------


class NormalizeOnDeviceFix(Codemod):
    rule = "TC411"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        editor = CallEditor()
        bare = False
        for finding in findings:
            plan: NormalizeOnDevice = finding.fix.plan
            func = plan.to_tensor.func
            bare = bare or isinstance(func, cst.Name)
            editor.rewrite_call(plan.to_tensor, _pil_to_tensor)
            if plan.normalize_index is not None:
                editor.rewrite_call(plan.transform, lambda node, i=plan.normalize_index: _without_step(node, i))
            extra = f", {plan.mean}, {plan.std}" if plan.mean is not None else ""
            for statement, name in plan.after_statements:
                editor.insert_after(statement, [parse_statement(f"{name} = {HELPER}({name}{extra})", module)])
            for copy in plan.wrapped_copies:
                wrapper = parse_expression(f"{HELPER}(images{extra})", module)
                editor.rewrite_call(
                    copy, lambda node, w=wrapper: w.with_changes(args=[w.args[0].with_changes(value=node), *w.args[1:]])
                )
        updated = editor.apply(module)
        if bare:
            updated = ensure_import(updated, "from torchvision.transforms import PILToTensor")
        if any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER for s in module.body):
            return updated
        return insert_block(updated, HELPER_CODE, index_after_imports(facts))


def _pil_to_tensor(node: cst.Call) -> cst.Call:
    func = node.func
    if isinstance(func, cst.Attribute):
        return node.with_changes(func=func.with_changes(attr=cst.Name("PILToTensor")))
    return node.with_changes(func=cst.Name("PILToTensor"))


def _without_step(compose: cst.Call, index: int) -> cst.Call:
    """The Compose without its last step (``index``): the step before takes its comma, so a trailing
    comma and the closing bracket's line stay as written."""
    listed = compose.args[0].value
    elements = list(listed.elements)  # type: ignore[attr-defined]
    removed = elements.pop(index)
    elements[-1] = elements[-1].with_changes(comma=removed.comma)
    return compose.with_changes(args=[compose.args[0].with_changes(value=listed.with_changes(elements=elements)), *compose.args[1:]])
