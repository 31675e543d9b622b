"""TC509 batchnorm-small-per-gpu-batch: BatchNorm statistics that do not fit a DDP job's per-GPU batch (info).

Two sides of one question, both in a script that wraps its model in DistributedDataParallel and
trains it on a DataLoader whose per-GPU batch size can be read from the text (a literal, a constant,
an argparse default, divided by the world size where the script divides it):

* SyncBatchNorm (``convert_sync_batchnorm`` of a model with BatchNorm, or a model class of the file
  built from ``nn.SyncBatchNorm``) with at least 32 samples per GPU: every BN layer all-reduces its
  statistics in each forward, a collective per layer per step, where plain BatchNorm is already
  stable. Not when the conversion sits behind a flag (``--sync-bn``: chosen per run) or in a
  contrastive / self-supervised script (SimCLR, MoCo: global BN on purpose).
* Plain BatchNorm (the file's own model classes, ``nn.Sequential``, or a torchvision classification
  model that contains BN) with fewer than 16 samples per GPU and no SyncBatchNorm anywhere in the
  file: each GPU normalises with the statistics of its own few samples. Not when the script freezes
  BN (``FrozenBatchNorm``, ``isinstance(m, nn.BatchNorm2d)`` with ``m.eval()``).

No automatic fix: whether to synchronise BN is a modelling choice (accuracy, and for SyncBN memory
and step time); the finding says which way the numbers point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.callers import callers_of
from tcaudit.script.distributed import distributed_facts, in_test_code
from tcaudit.script.expressions import attribute_chain, literal
from tcaudit.script.facts import Frame, ScriptFacts
from tcaudit.script.guards import process_count_of
from tcaudit.script.loader_sharding import feeds_training, is_training_loader
from tcaudit.script.model_classes import classes_building
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.script.training_code import flag_frames
from tcaudit.source.syntax import evaluated_value, full_name, keyword, nodes_of
from tcaudit.source.triggers import all_of

SMALL_BATCH = 16  # fewer samples per GPU than this: BN statistics get noisy (Wu & He 2018, Fig. 1)
LARGE_BATCH = 32  # at least this many per GPU: plain BN is stable, SyncBN only adds collectives

_BN_LAYERS = frozenset(
    f"torch.nn.{module}{kind}BatchNorm{dim}d"
    for module in ("", "modules.", "modules.batchnorm.")
    for kind in ("", "Lazy")
    for dim in (1, 2, 3)
)
_SYNC_BN = frozenset(f"torch.nn.{module}SyncBatchNorm" for module in ("", "modules.", "modules.batchnorm."))
_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})
# torchvision classification models built with nn.BatchNorm2d (convnext and the transformers use LayerNorm,
# vgg without `_bn`, squeezenet and alexnet have no norm; detection models freeze theirs).
_BN_ARCH = re.compile(
    r"^(resnet\d+|resnext\d+_\w+|wide_resnet\d+_\d+|densenet\d+|efficientnet_(b\d|v2_[sml])|mobilenet_v2"
    r"|mobilenet_v3_(large|small)|regnet_[xy]_\w+|mnasnet\d_\d+|shufflenet_v2_x\d_\d|inception_v3|googlenet"
    r"|vgg\d+_bn)$"
)
_NOT_CLASSIFICATION = (".detection.", ".segmentation.", ".video.", ".quantization.", ".optical_flow.")
# What a script divides its global batch by to get the per-GPU one.
_WORLD = re.compile(
    r"world_?size|WORLD_SIZE|get_world_size|device_count|\bn_?gpus\w*|num_gpus|gpus_per_node|nprocs|num_replicas"
    r"|num_processes",
    re.IGNORECASE,
)
# Contrastive and self-supervised methods use global BN on purpose (a local one leaks the batch's identity).
_SELF_SUPERVISED = re.compile(r"simclr|\bmoco|byol|simsiam|swav|barlow|contrastive|nt_?xent|info_?nce", re.IGNORECASE)
_SYNC_NAME = re.compile(r"(?i)^\w*(sync_?bn|sync_?batch_?norm|syncbn)\w*$")
_SYNC_OPTION = re.compile(r"(?i)--?\w*sync[-_]?(bn|batch[-_]?norm)\w*")
_FROZEN_BN_TEST = re.compile(r"isinstance\([^)]*BatchNorm|\.find\(\s*['\"]BatchNorm|__name__\s*==\s*['\"]BatchNorm")


@dataclass(frozen=True)
class PerGpuBatch:
    low: int
    high: int
    split: bool  # divided by a world size this file does not fix: ``high`` holds on 2 GPUs or more

    def shown(self, small: bool) -> str:
        if self.split:
            return f"at most {self.high}" if small else f"{self.low}"
        return str(self.high if small else self.low)


class BatchNormPerGpuBatch(ScriptRule):
    id = "TC509"
    triggers = (
        all_of(
            r"DistributedDataParallel",
            r"DataLoader",
            r"BatchNorm|resne|densenet|efficientnet|mobilenet|regnet|mnasnet|shufflenet|inception|googlenet|vgg"
            r"|get_model|create_model|__dict__|getattr",
        ),
    )

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        if facts.frameworks or not facts.training_steps or not facts.optimizer_steps:
            return  # a framework owns the loop, or nothing trains here
        wraps = [w for w in info.wraps_of("ddp") if not in_test_code(w.call.ctx) and w.call.node.args]
        if not wraps:
            return
        pipeline = pipeline_facts(facts)
        models: list[cst.Call] = []
        for wrap in wraps:
            models += pipeline.constructions(wrap.call.node.args[0].value)
        if not models:
            return
        batch = _per_gpu_batch(facts, pipeline)
        if batch is None:
            return
        norms = _NormFacts(facts, pipeline)
        synced = [m for m in models if norms.syncs(m)]
        if synced:
            if batch.low < LARGE_BATCH or _SELF_SUPERVISED.search(info.text):
                return
            site = synced[0]
            if not _runs_in_every_ddp_job(facts, site):
                return  # behind ``--sync-bn``: the user chooses it per run
            shown = batch.shown(small=False)
            yield self.finding(
                facts,
                site,
                f"SyncBatchNorm with {shown} samples per GPU all-reduces every BN layer's statistics each forward",
                explanation=(
                    f"Each SyncBatchNorm layer all-reduces its mean and variance (2 x C floats) in every forward: a "
                    f"latency-bound collective per BN layer per step (not measured). With {shown} samples per GPU "
                    "plain BatchNorm statistics are already stable; SyncBatchNorm pays off below about "
                    f"{SMALL_BATCH} per GPU (detection, segmentation)."
                ),
            )
            return
        if batch.high >= SMALL_BATCH or _offers_sync_bn(facts):
            return
        if not all(norms.builds_bn(m) for m in models) or norms.frozen_bn or _never_in_train_mode(facts):
            return
        shown = batch.shown(small=True)
        where = " on 2+ GPUs" if batch.split else ""
        wrap = wraps[0].call.node
        yield self.finding(
            facts,
            wrap,
            f"BatchNorm under DDP normalises over {shown} samples per GPU{where}, without SyncBatchNorm",
            explanation=(
                f"Each GPU computes BatchNorm statistics from its own {shown} samples; below {SMALL_BATCH} "
                "they get noisy and accuracy drops. `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` "
                "before the DDP wrap computes them over the global batch (torchvision's detection and "
                "segmentation references: `--sync-bn`), at the cost of an all-reduce per BN layer per forward."
            ),
        )


# -- which models normalise how ------------------------------------------------------------------------------


class _NormFacts:
    """Which constructions of the file build BatchNorm or SyncBatchNorm layers."""

    def __init__(self, facts: ScriptFacts, pipeline: PipelineFacts) -> None:
        self.facts = facts
        self.pipeline = pipeline
        # The classes that build the layer directly or through another such class; a layer named as a
        # parameter default (``norm_layer=nn.BatchNorm2d``, torchvision's blocks) counts too. Base classes
        # are not read: a subclass of a BatchNorm model of this file is not taken for one (as this rule
        # always judged), where TrainedModelFacts.conv_classes reads them.
        self.bn_classes = classes_building(facts, lambda call: _is_bn(call.qualname or ""), defaults=_is_bn)
        self.sync_classes = classes_building(
            facts, lambda call: _is_sync_bn(call.qualname or ""), defaults=_is_sync_bn
        )

    def _own_class(self, call: cst.Call) -> str | None:
        dotted = full_name(call.func)
        if not dotted or self.facts.qualname(call.func):
            return None
        last = dotted.split(".")[-1]
        return last if last in self.pipeline.class_names else None

    def builds_bn(self, call: cst.Call) -> bool:
        """A call that builds a model with plain BatchNorm layers: a torchvision BN architecture (by
        factory or by a name whose every value is one), a class of this file, or a container of them."""
        facts = self.facts
        if keyword(call, "norm_layer") is not None:
            return False  # ``resnet50(norm_layer=...)``: another normalisation
        qual = facts.qualname(call.func) or ""
        if _is_bn_arch(qual):
            return True
        picked = self.pipeline.arch_by_name(call)
        if picked is not None:
            archs = self.pipeline.string_values(picked)
            return bool(archs) and all(_BN_ARCH.match(arch) for arch in archs)
        if qual in _CONTAINERS:
            return any(self._holds(arg.value, self.builds_bn_layer) for arg in call.args)
        own = self._own_class(call)
        return own is not None and own in self.bn_classes

    def builds_bn_layer(self, call: cst.Call) -> bool:
        qual = self.facts.qualname(call.func) or ""
        return qual in _BN_LAYERS or self.builds_bn(call)

    def syncs(self, call: cst.Call) -> bool:
        """A call that gives the DDP model SyncBatchNorm layers: ``convert_sync_batchnorm`` of a model that
        has BatchNorm, or a class of this file built from ``nn.SyncBatchNorm``."""
        if self.converts(call):
            if not call.args:
                return False
            inner = [c for c in self.pipeline.constructions(call.args[0].value) if not self.converts(c)]
            return bool(inner) and all(self.builds_bn(c) for c in inner)
        if (self.facts.qualname(call.func) or "") in _CONTAINERS:
            return any(self._holds(arg.value, self.syncs) for arg in call.args)
        own = self._own_class(call)
        return own is not None and own in self.sync_classes

    def converts(self, call: cst.Call) -> bool:
        qual = self.facts.qualname(call.func) or ""
        return qual.startswith("torch.") and qual.endswith("SyncBatchNorm.convert_sync_batchnorm")

    def _holds(self, expr: cst.BaseExpression, wanted) -> bool:
        found = False

        class _Calls(cst.CSTVisitor):
            def visit_Call(inner, node: cst.Call) -> None:  # noqa: N805
                nonlocal found
                found = found or wanted(node)

        expr.visit(_Calls())
        return found

    @property
    def frozen_bn(self) -> bool:
        """BN kept in eval mode while the rest trains (``FrozenBatchNorm2d``, or ``m.eval()`` for every
        module that is a BatchNorm): its statistics are not the batch's."""
        facts = self.facts
        if "FrozenBatchNorm" in facts.source.text:
            return True
        for call in facts.calls:
            if call.name != "isinstance" and call.method not in ("find", "startswith"):
                continue
            if "BatchNorm" not in facts.code(call.node):
                continue
            scope = call.ctx.function or (call.statement.node if call.statement else call.node)
            text = facts.code(scope)
            if _FROZEN_BN_TEST.search(text) and re.search(r"\.eval\(\s*\)|requires_grad", text):
                return True
        return False


def _is_bn(qual: str) -> bool:
    """A BatchNorm layer, or a torchvision classification model built with them."""
    return qual in _BN_LAYERS or _is_bn_arch(qual)


def _is_sync_bn(qual: str) -> bool:
    return qual in _SYNC_BN


def _is_bn_arch(qual: str) -> bool:
    if not qual.startswith("torchvision.models.") or any(part in qual + "." for part in _NOT_CLASSIFICATION):
        return False
    return bool(_BN_ARCH.match(qual.split(".")[-1]))


# -- the per-GPU batch ---------------------------------------------------------------------------------------


def _per_gpu_batch(facts: ScriptFacts, pipeline: PipelineFacts) -> PerGpuBatch | None:
    """The bounds of the per-GPU batch of every training DataLoader, or None when one of them is not
    known from the text (a config file, a parameter nobody passes a literal, a batch_sampler)."""
    info = distributed_facts(facts)
    bounds: list[PerGpuBatch] = []
    for call in info.dataloaders:
        if in_test_code(call.ctx) or facts.in_eval(call.ctx):
            continue
        flow = feeds_training(facts, info, call)
        if flow is False or (flow is None and not is_training_loader(facts, info, call, info.dataloader_name(call))):
            continue
        site = pipeline.loader_for(call.node)
        if site is None or not site.complete or site.has("batch_sampler"):
            return None
        values = site.values("batch_size")
        if not values:
            return None
        for value in values:
            found = _Bounds(facts, pipeline).of(value, call.ctx.function)
            if found is None:
                return None
            bounds.append(found)
    if not bounds:
        return None
    return PerGpuBatch(min(b.low for b in bounds), max(b.high for b in bounds), any(b.split for b in bounds))


class _Bounds:
    """The values an integer expression may take, as bounds; a division by a world size the file does not
    fix gives an upper bound for 2 GPUs or more."""

    def __init__(self, facts: ScriptFacts, pipeline: PipelineFacts) -> None:
        self.facts = facts
        self.pipeline = pipeline

    def of(self, expr: cst.BaseExpression, fn, depth: int = 0, seen: frozenset[str] = frozenset()) -> PerGpuBatch | None:
        if depth > 8:
            return None
        value = literal(expr)
        if isinstance(value, int) and not isinstance(value, bool):
            return PerGpuBatch(value, value, False) if value > 0 else None
        if isinstance(expr, cst.Call):
            if full_name(expr.func) == "int" and len(expr.args) == 1 and not self.facts.bindings_of("int"):
                return self.of(expr.args[0].value, fn, depth + 1, seen)
            return None
        if isinstance(expr, cst.BinaryOperation):
            return self._operation(expr, fn, depth, seen)
        dotted = attribute_chain(expr)
        if dotted is None:
            return None
        return self._name(dotted, fn, depth, seen)

    def _operation(self, expr: cst.BinaryOperation, fn, depth: int, seen) -> PerGpuBatch | None:
        left = self.of(expr.left, fn, depth + 1, seen)
        if left is None:
            return None
        if isinstance(expr.operator, (cst.FloorDivide, cst.Divide)):
            right = self.of(expr.right, fn, depth + 1, seen)
            if right is None:
                if not _WORLD.search(self.facts.code(expr.right)):
                    return None
                return PerGpuBatch(0, left.high // 2, True)  # DDP on 2 GPUs or more
            if right.low <= 0:
                return None
            return PerGpuBatch(left.low // right.high, left.high // right.low, left.split or right.split)
        right = self.of(expr.right, fn, depth + 1, seen)
        if right is None or left.split or right.split:
            return None
        if isinstance(expr.operator, cst.Multiply):
            return PerGpuBatch(left.low * right.low, left.high * right.high, False)
        return None

    def _name(self, dotted: str, fn, depth: int, seen: frozenset[str]) -> PerGpuBatch | None:
        facts = self.facts
        bindings = [b for b in facts.bindings_of(dotted) if not b.is_item_write]
        if dotted in seen:
            bindings = []  # ``args.bs = args.bs // world``: the value before the update
        if "." not in dotted:
            local = [b for b in bindings if b.ctx.function is fn]
            bindings = local or [b for b in bindings if b.ctx.function is None]
        candidates: list[PerGpuBatch | None] = []
        if bindings:
            # One update that every DDP run makes (``args.batch_size //= world`` under ``if args.distributed``)
            # replaces the value it started from; otherwise each binding and the start are possible.
            only = bindings[0] if len(bindings) == 1 else None
            updates = only is not None and dotted in facts.code(only.value) and _runs_in_every_ddp_job(facts, only.ctx)
            candidates = [self.of(b.value, b.ctx.function, depth + 1, seen | {dotted}) for b in bindings]
            if updates or "." not in dotted or dotted.startswith("self."):
                return _join(candidates)
        start = self._start(dotted, fn, depth)
        if start is None and not candidates:
            return None
        return _join([*candidates, start])

    def _start(self, dotted: str, fn, depth: int) -> PerGpuBatch | None:
        """What a name holds before the file assigns it: an argparse default (``args.batch_size``), or a
        parameter's value from every caller of the function in this file."""
        facts = self.facts
        head, _, last = dotted.rpartition(".")
        if head and head != "self":
            default = self.pipeline.flag_default(last)
            if isinstance(default, int) and not isinstance(default, bool) and default > 0:
                return PerGpuBatch(default, default, False)
            return None
        if head or fn is None:
            return None
        positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        params = {p.name.value: p for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
        if dotted not in params:
            return None
        callers = callers_of(facts, fn, outside=True)
        if not callers:
            return None
        index = positional.index(dotted) if dotted in positional else None
        if index is not None and positional[:1] in (["self"], ["cls"]):
            index -= 1
        found = []
        for caller in callers:
            arg = caller.arg(dotted, index)
            if arg is None:
                default = params[dotted].default
                found.append(self.of(default, None, depth + 1) if default is not None else None)
            else:
                found.append(self.of(arg, caller.ctx.function, depth + 1))
        return _join(found)


def _join(bounds: list[PerGpuBatch | None]) -> PerGpuBatch | None:
    if not bounds or any(b is None for b in bounds):
        return None
    known = [b for b in bounds if b is not None]
    return PerGpuBatch(min(b.low for b in known), max(b.high for b in known), any(b.split for b in known))


# -- where it runs -------------------------------------------------------------------------------------------


def _runs_in_every_ddp_job(facts: ScriptFacts, where: cst.CSTNode | Frame) -> bool:
    """Not behind a flag: outside any ``if`` (the main guard aside), or only behind tests that hold in
    every multi-process run (``if args.distributed:``, ``if world_size > 1:``)."""
    if isinstance(where, Frame):
        ctx = where
    else:
        ctx = next((c.ctx for c in facts.calls if c.node is where), None)
        if ctx is None:
            return False
    for frame in flag_frames(ctx):
        if frame.kind == "except":
            return False
        test = frame.node.test  # type: ignore[attr-defined]
        if _in_every_ddp_job(test) is not (frame.kind == "if"):
            return False
    return True


def _in_every_ddp_job(test: cst.BaseExpression) -> bool | None:
    """True when ``test`` holds in every multi-process run, False when it fails in every one, None when
    it depends on something else (``args.distributed and args.sync_bn``: the flag decides)."""
    if isinstance(test, cst.BooleanOperation):
        left, right = _in_every_ddp_job(test.left), _in_every_ddp_job(test.right)
        if isinstance(test.operator, cst.And):
            return True if left is True and right is True else False if False in (left, right) else None
        return True if True in (left, right) else False if left is False and right is False else None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _in_every_ddp_job(test.expression)
        return None if inner is None else not inner
    implied = process_count_of(test)
    return True if implied == "multi" else False if implied == "single" else None


def _offers_sync_bn(facts: ScriptFacts) -> bool:
    """SyncBatchNorm in the code (not the prose): a name (``nn.SyncBatchNorm``, ``args.sync_bn``,
    apex's ``convert_syncbn_model``) or an option string (``"--sync-bn"``)."""
    if any(_SYNC_NAME.match(name.value) for name in nodes_of(facts.module, cst.Name)):
        return True
    return any(
        isinstance(evaluated_value(text), str) and _SYNC_OPTION.fullmatch(evaluated_value(text))
        for text in nodes_of(facts.module, cst.SimpleString)
    )


def _never_in_train_mode(facts: ScriptFacts) -> bool:
    """``model.eval()`` somewhere and ``.train()`` nowhere: BN runs on its stored statistics."""
    calls = facts.calls
    return any(c.method == "eval" and not c.node.args for c in calls) and not any(c.method == "train" for c in calls)
