"""TC405 cpu-image-decode: JPEG/PNG decoding on the CPU in a CUDA training pipeline (info).

An ImageFolder's finding carries the structural ``dali`` fix (``tcaudit fix --dali``): the training
DataLoader over it (one in each arm where it is built on opposite arms of an ``if``) is handed to
``tcaudit_dali_loader`` (GPU decode with DALI, falling back to nvjpeg
and to the original loader; the runtime in tcaudit/rewrite/dali_runtime.py is inserted after the
imports). Scan declines it, with the reason, for a pipeline the conversion would not reproduce. Once
converted the rule is silent. A decoder in a Dataset or loader function of the file is reported
without a fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, parse_expression, parse_statement
from tcaudit.rewrite.edits import CallEditor, index_after_imports, insert_block
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of
from tcaudit.script.evidence import CUDA_EVIDENCE, TRAINS
from tcaudit.script.expressions import assigned_name, function_returns, literal
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.guards import exclusive
from tcaudit.script.loader_construction import DALI_LOADER, LoaderSite, is_eval_name
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, keyword
from tcaudit.source.triggers import all_of

FOLDER_DATASETS = frozenset(
    {"torchvision.datasets.ImageFolder", "torchvision.datasets.folder.ImageFolder",
     "torchvision.datasets.ImageNet", "torchvision.datasets.imagenet.ImageNet"}
)
# Per-sample decoders; only reported inside a Dataset (``__getitem__``) or a loader function.
DECODERS = frozenset(
    {"PIL.Image.open", "cv2.imread", "cv2.imdecode", "torchvision.io.read_image", "torchvision.io.image.read_image",
     "torchvision.io.decode_image", "torchvision.io.image.decode_image", "torchvision.io.decode_jpeg",
     "torchvision.io.image.decode_jpeg", "imageio.imread", "skimage.io.imread"}
)
ADVICE = (
    "decode on the GPU instead: a DALI pipeline (`tcaudit fix --dali`), or workers that return the "
    "encoded bytes and `torchvision.io.decode_jpeg(..., device=\"cuda\")`"
)


class CpuImageDecode(ScriptRule):
    id = "TC405"
    after = ("TC303",)  # fixed after TC303 in a round: its channels_last decides the layout DALI writes
    # It needs images, CUDA and a file that trains (a step, or a framework that owns the loop).
    triggers = (all_of(r"ImageFolder|ImageNet|PIL|cv2|read_image|decode_image|decode_jpeg|imread|imageio|skimage",
                       CUDA_EVIDENCE, TRAINS),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.uses_cuda or not pipeline.trains:
            return
        cost = context.cost(self.spec, "decode")
        for call in facts.calls:
            qual = call.qualname or ""
            if qual in FOLDER_DATASETS:
                if keyword(call.node, "loader") is not None or not _training_use(facts, call):
                    continue  # a custom loader= may already skip decoding
                loaders = [site for site in pipeline.loaders_over(call.node) if site.training]
                if loaders and all(pipeline.dali_wrapped(site) for site in loaders):
                    continue  # ``fix --dali`` converted it
                what = f"`{qual.split('.')[-1]}` decodes every JPEG with PIL on the CPU"
                fix = self.planned_fix(
                    FixClass.STRUCTURAL, "decode images on the GPU (DALI or nvjpeg)",
                    lambda call=call: plan_conversion(facts, pipeline, call), option="dali", context=context,
                )
            elif qual in DECODERS:
                device = keyword(call.node, "device")
                if device is not None and literal(device.value) != "cpu":
                    continue  # already decoded on the GPU
                if not _in_sample_loader(facts, pipeline, call) or facts.in_eval(call.ctx):
                    continue
                what = f"`{call.name}` decodes each sample on the CPU inside the data pipeline"
                fix = Fix(
                    FixClass.STRUCTURAL, "decode images on the GPU (DALI or nvjpeg)", available=False, option="dali",
                    reason="this file's own code decodes the samples (a Dataset or a loader function); `fix --dali` "
                    "converts ImageFolder pipelines only: port this one to DALI or to `decode_jpeg(..., device=\"cuda\")` "
                    "by hand",
                )
            else:
                continue
            yield self.finding(
                facts, call.node, what, fix=fix,
                explanation=f"For a fast model this caps the training rate: {ADVICE}{cost}.",
            )


def _training_use(facts: ScriptFacts, call: CallSite) -> bool:
    if facts.in_eval(call.ctx) or is_eval_name(assigned_name(call)):
        return False
    return not any(
        frame.kind == "def" and is_eval_name(frame.node.name.value)  # type: ignore[attr-defined]
        for frame in call.ctx.chain()
    )


def _in_sample_loader(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite, depth: int = 2) -> bool:
    """Inside a Dataset (a class with ``__getitem__``/``__iter__``), or a function such a class calls,
    or one passed as ``loader=`` (``pil_loader``). A one-off ``load_image("style.jpg")`` is not."""
    if _in_dataset_class(call.ctx.class_def):
        return True
    fn = call.ctx.function
    if fn is None or depth == 0:
        return False
    name = fn.name.value
    if name.endswith("loader") or any(
        arg.keyword is not None and arg.keyword.value == "loader" and full_name(arg.value) == name
        for c in facts.calls
        for arg in c.node.args
    ):
        return True
    return any(_in_sample_loader(facts, pipeline, c, depth - 1) for c in callers_of(facts, fn, how="self", outside=True))


def _in_dataset_class(cls: cst.ClassDef | None) -> bool:
    if cls is None:
        return False
    methods = {s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)}
    return bool(methods & {"__getitem__", "__getitems__", "__iter__"})


# -- the plan ------------------------------------------------------------------------------------

RUNTIME = Path(__file__).parents[2] / "rewrite" / "dali_runtime.py"
BLOCK_START = "# -- tcaudit fix --dali"

# The steps tcaudit_dali_loader maps to DALI, in their order; RandomResizedCrop and a to-tensor step are needed.
STEPS = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "PILToTensor", "Normalize")
SAMPLERS = ("DistributedSampler", "RandomSampler", "SequentialSampler")


@dataclass(frozen=True, eq=False)
class LoaderWrap:
    """One training DataLoader handed to ``tcaudit_dali_loader``: after ``target = DataLoader(...)`` as
    ``target = tcaudit_dali_loader(target)`` (``statement`` set), or around the call where it is built
    inside an expression (``return DataLoader(...)``)."""

    loader: cst.Call  # the DataLoader call
    statement: cst.SimpleStatementLine | None  # ``target = DataLoader(...)``, followed by the wrap
    target: str | None


@dataclass(frozen=True, eq=False)
class DaliConversion(FixPlan):
    """Hand the training DataLoader over an ImageFolder to ``tcaudit_dali_loader``; one wrap per
    DataLoader where the script builds it on opposite arms of an ``if`` (a distributed flag, a platform)."""

    kind = "gpu-decode"
    wraps: tuple[LoaderWrap, ...]
    targets: tuple[str | None, ...]  # the wrapped loaders' names, for the report
    call: str  # the dataset class, qualified
    line: int  # the dataset call's line


def plan_conversion(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite) -> DaliConversion:
    """The conversion of the training DataLoader(s) over this ImageFolder, once every step of the
    pipeline has been checked to be one the conversion reproduces; DeclineFix with the reason otherwise."""
    wraps = []
    for site in training_loaders(facts, pipeline, call):
        target = assigned_name(site.call)
        statement = site.call.statement.node if site.call.statement else None
        if target is None or not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            target, statement = None, None
        wraps.append(LoaderWrap(site.call.node, statement, target))
    return DaliConversion(
        tuple(wraps), tuple(w.target for w in wraps), call.qualname or "", facts.position(call.node).start.line
    )


def training_loaders(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite) -> list[LoaderSite]:
    """The training DataLoader over this ImageFolder call (or one per arm where it is built on opposite
    arms of an ``if``: only one of them runs); DeclineFix when the pipeline is not one the conversion
    reproduces."""
    qual = call.qualname or ""
    short = qual.split(".")[-1]
    if any(arg.star for arg in call.node.args):
        raise DeclineFix(f"`{short}` gets `*args`/`**kwargs`: its transform cannot be read")
    for key in ("loader", "target_transform"):
        if keyword(call.node, key) is not None:
            raise DeclineFix(f"`{short}` has a `{key}=`, which the DALI pipeline would skip; convert by hand")
    positional = [a for a in call.node.args if a.keyword is None]
    transform = keyword(call.node, "transform")
    if short == "ImageFolder" and len(positional) > 2:
        raise DeclineFix(f"`{short}` has a `target_transform` or `loader`, which the DALI pipeline would skip")
    if transform is None and short == "ImageFolder" and len(positional) == 2:
        transform = positional[1]
    if transform is None:
        raise DeclineFix(f"`{short}` has no transform: its samples are PIL images, not tensors")
    _check_transform(facts, transform.value)
    loaders = [site for site in pipeline.loaders_over(call.node) if site.training]
    if not loaders:
        factory = _loader_factory(facts, call.node)
        if factory is not None:
            raise DeclineFix(
                f"the `{short}` reaches its DataLoader through `{factory}(...)`, a helper, lambda or `partial` of "
                "this file that may build other loaders too (the DALI conversion wraps a DataLoader where it is "
                "built); convert by hand"
            )
        raise DeclineFix(f"no training DataLoader over this `{short}` was found; convert by hand")
    if not all(exclusive(a.call.ctx, b.call.ctx) for i, a in enumerate(loaders) for b in loaders[i + 1:]):
        raise DeclineFix(f"several DataLoaders read this `{short}`; convert by hand")
    for site in loaders:
        for key in ("batch_sampler", "collate_fn"):
            if site.has(key):
                raise DeclineFix(f"the DataLoader has a `{key}=`, which the DALI pipeline would not reproduce")
        for value in site.values("sampler"):
            for leaf in _leaves(facts, value):
                name = full_name(leaf.func) if isinstance(leaf, cst.Call) else None
                if literal(leaf) is None or (name and name.split(".")[-1] in SAMPLERS):
                    continue
                shown = facts.code(leaf)
                raise DeclineFix(f"the DataLoader's sampler `{shown}` is not a random, sequential or distributed one")
    return loaders


def _loader_factory(facts: ScriptFacts, dataset: cst.Call) -> str | None:
    """The name of a function, lambda or ``partial`` of this file that gets the dataset as an argument
    (``build_loader(train_set, True)``), if any."""
    for call in facts.calls:
        if call.name is None or "." in call.name or facts.resolve(call.name):
            continue
        if not (call.name in facts.functions_by_name or facts.bindings_of(call.name)):
            continue
        if any(value is dataset for arg in call.node.args for value in facts.binding_values(arg.value)):
            return call.name
    return None


def _leaves(facts: ScriptFacts, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What ``expr`` may be: the values its names are bound to, both sides of a conditional; a name
    bound nowhere in this file stays a leaf."""
    out = []
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue
        if isinstance(value, (cst.Name, cst.Attribute)) and facts.bindings_of(full_name(value) or ""):
            continue
        out.append(value)
    return out


def _transform_leaves(facts: ScriptFacts, expr: cst.BaseExpression, depth: int = 2) -> list[cst.BaseExpression]:
    """What the transform may be, followed into a function of this file that returns it
    (``train_transform(args.size)``): each of its return values, so that every one is checked."""
    out = []
    for leaf in _leaves(facts, expr):
        name = leaf.func.value if isinstance(leaf, cst.Call) and isinstance(leaf.func, cst.Name) else None
        helpers = facts.functions_by_name.get(name, []) if name and not facts.resolve(name) else []
        returned = [value for fn in helpers for value in function_returns(fn)]
        if depth and helpers and len(returned) >= len(helpers):
            out += [value for expr in returned for value in _transform_leaves(facts, expr, depth - 1)]
        else:
            out.append(leaf)
    return out


def _check_transform(facts: ScriptFacts, expr: cst.BaseExpression) -> None:
    for compose in _transform_leaves(facts, expr):
        shown = facts.code(compose)
        qual = facts.qualname(compose.func) if isinstance(compose, cst.Call) else None
        if not (qual or "").startswith("torchvision.transforms.") or not qual.endswith(".Compose"):
            raise DeclineFix(f"the training transform `{_short(shown)}` is not a torchvision `Compose([...])` built here")
        listed = compose.args[0].value if compose.args and compose.args[0].keyword is None else None
        if not isinstance(listed, (cst.List, cst.Tuple)) or any(isinstance(e, cst.StarredElement) for e in listed.elements):
            raise DeclineFix("the training transform's list of steps is built at run time; convert by hand")
        names = [_step_name(facts, element.value) for element in listed.elements]
        to_tensor = "PILToTensor" if "PILToTensor" in names else "ToTensor"
        order = ["RandomResizedCrop", "RandomHorizontalFlip", to_tensor] + (["Normalize"] if to_tensor == "ToTensor" else [])
        if names[:1] != ["RandomResizedCrop"] or to_tensor not in names or names != [n for n in order if n in names]:
            raise DeclineFix(
                f"the training transform ({', '.join(names)}) is not RandomResizedCrop, [RandomHorizontalFlip], "
                "ToTensor, [Normalize] (or PILToTensor) in that order; convert by hand"
            )


def _step_name(facts: ScriptFacts, expr: cst.BaseExpression) -> str:
    kinds = set()
    for leaf in _leaves(facts, expr):
        name = full_name(leaf.func) if isinstance(leaf, cst.Call) else None
        qual = facts.qualname(leaf.func) if isinstance(leaf, cst.Call) else None
        short = (qual or name or "").split(".")[-1]
        if not (qual or "").startswith("torchvision.transforms.") or short not in STEPS:
            shown = name or facts.code(leaf)
            raise DeclineFix(
                f"`{_short(shown)}` in the training transform has no counterpart in the DALI conversion (it maps "
                "RandomResizedCrop, RandomHorizontalFlip, ToTensor/PILToTensor and Normalize); convert by hand"
            )
        if short == "RandomResizedCrop":
            for key in ("interpolation", "antialias"):
                if keyword(leaf, key) is not None:
                    raise DeclineFix(f"`RandomResizedCrop({key}=...)`: the DALI pipeline resizes bilinearly with antialiasing")
            if len([a for a in leaf.args if a.keyword is None]) > 3:
                raise DeclineFix("`RandomResizedCrop` with a positional interpolation: the DALI pipeline resizes bilinearly")
        kinds.add(short)
    if len(kinds) != 1:
        raise DeclineFix("a step of the training transform is chosen at run time; convert by hand")
    return kinds.pop()


def _short(code: str) -> str:
    code = " ".join(code.split())
    return code if len(code) <= 60 else code[:57] + "..."


# -- the fix ---------------------------------------------------------------------------------------------


class CpuImageDecodeFix(Codemod):
    rule = "TC405"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        # Read from the text this fix gets (after TC303's fix in the same round), not from the plan.
        extra = ", nhwc=True" if facts.references_to("torch.channels_last") else ""
        editor = CallEditor()
        wraps = [wrap for finding in findings for wrap in finding.fix.plan.wraps]
        for wrap in wraps:
            if wrap.statement is not None:
                editor.insert_after(wrap.statement, [parse_statement(f"{wrap.target} = {DALI_LOADER}({wrap.target}{extra})", module)])
                continue
            wrapper = parse_expression(f"{DALI_LOADER}(loader{extra})", module)
            editor.rewrite_call(
                wrap.loader,
                lambda node, wrapper=wrapper: wrapper.with_changes(args=[wrapper.args[0].with_changes(value=node), *wrapper.args[1:]]),
            )
        if _defines_helper(module):
            return editor.apply(module)
        # Where the block goes, counted before the edits: they all come after the imports.
        return insert_block(editor.apply(module), helper_block(), index_after_imports(facts))


def _defines_helper(module: cst.Module) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == DALI_LOADER for s in module.body)


# rules/TC405.toml shows the inserted block as this one line (the block is long and the same in every
# fixed form); the catalog test expands it to helper_block() before comparing.
HELPER_PLACEHOLDER = "# [the tcaudit_dali_loader helper block: tcaudit/rewrite/dali_runtime.py from its marker line down]"


def helper_block() -> str:
    """The code inserted after the imports: tcaudit/rewrite/dali_runtime.py from its marker line down."""
    text = RUNTIME.read_text(encoding="utf-8")
    return text[text.index("\n" + BLOCK_START) + 1:]
