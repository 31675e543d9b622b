"""TC405 cpu-image-decode: JPEG/PNG decoding on the CPU in a CUDA training pipeline (info).

An ImageFolder's finding carries the structural ``dali`` fix (tcaudit/fix/tc405_cpu_image_decode.py);
once its training DataLoader is handed to ``tcaudit_dali_loader`` the rule is silent. A decoder in a
Dataset or loader function of the file is reported without a fix."""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import all_of, CUDA_TEXT, DALI_LOADER, LoaderSite, PipelineFacts, assigned_name, is_eval_name, keyword_arg, literal, pipeline_facts
from tcaudit.script.rule import RuleContext, ScriptRule

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
    "encoded bytes and `torchvision.io.decode_jpeg(..., device=\"cuda\")` (16 CPU cores decode about "
    "2,150 img/s while an H200 trains ResNet50 at 5,700+)"
)


class CpuImageDecode(ScriptRule):
    id = "TC405"
    triggers = (all_of(r"ImageFolder|ImageNet|PIL|cv2|read_image|decode_image|decode_jpeg|imread|imageio|skimage", CUDA_TEXT),)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.uses_cuda or not pipeline.trains:
            return
        for call in facts.calls:
            qual = call.qualname or ""
            if qual in FOLDER_DATASETS:
                if keyword_arg(call.node, "loader") is not None or not _training_use(facts, call):
                    continue  # a custom loader= may already skip decoding
                loaders = [site for site in dataset_loaders(facts, pipeline, call.node) if site.training]
                if loaders and all(_converted(facts, site) for site in loaders):
                    continue  # ``fix --dali`` converted it
                what = f"`{qual.split('.')[-1]}` decodes every JPEG with PIL on the CPU"
                fix = Fix(FixClass.STRUCTURAL, "decode images on the GPU (DALI or nvjpeg)", option="dali",
                          anchor={"kind": "gpu-decode", "call": qual, "line": facts.position(call.node).start.line})
            elif qual in DECODERS:
                device = keyword_arg(call.node, "device")
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
            yield self.finding(facts, call.node, f"{what}; for a fast model this caps the training rate: {ADVICE}", fix=fix)


def dataset_loaders(facts: ScriptFacts, pipeline: PipelineFacts, dataset: cst.Call) -> list[LoaderSite]:
    """The DataLoaders whose dataset is this call's result (passed directly or through names)."""
    out = []
    for site in pipeline.loaders:
        argument = site.call.arg("dataset", 0)
        if argument is not None and any(value is dataset for value in facts.binding_values(argument)):
            out.append(site)
    return out


def _converted(facts: ScriptFacts, site: LoaderSite) -> bool:
    """``tcaudit_dali_loader(DataLoader(...))``, or ``loader = tcaudit_dali_loader(loader)``."""
    for call in facts.calls:
        if call.name != DALI_LOADER or not call.node.args:
            continue
        first = call.node.args[0].value
        if first is site.call.node or (site.target is not None and get_full_name_for_node(first) == site.target):
            return True
    return False


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
        arg.keyword is not None and arg.keyword.value == "loader" and get_full_name_for_node(arg.value) == name
        for c in facts.calls
        for arg in c.node.args
    ):
        return True
    return any(_in_sample_loader(facts, pipeline, c, depth - 1) for c in pipeline.direct_callers(fn) if not c.ctx.inside(fn))


def _in_dataset_class(cls: cst.ClassDef | None) -> bool:
    if cls is None:
        return False
    methods = {s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)}
    return bool(methods & {"__getitem__", "__getitems__", "__iter__"})
