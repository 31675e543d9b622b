"""TC318 compile-partial-batch: a compiled model trained on a DataLoader whose last batch is smaller.

``torch.compile`` specialises the graph on the input's shapes. A training DataLoader without
``drop_last=True`` ends each epoch with a partial batch (unless the dataset's length divides the batch
size), and the first such batch recompiles the model (with automatic dynamic shapes, as a dynamic
graph), a pause of seconds against a step of milliseconds.

Reported: the DataLoader a training batch loop iterates, in a script whose own loop trains on an
accelerator and compiles the trained model (``torch.compile(model)``, ``model.compile()``) or the step
function (``@torch.compile``, ``torch.compile(train_step)``), also behind a flag. Not reported: a
``drop_last`` other than a literal ``False``, ``batch_sampler=``, ``batch_size=None`` or ``1``, a
custom ``collate_fn`` (its batches may vary in shape anyway), an IterableDataset of this file, a
dataset whose literal length gives one batch shape, an untraceable ``**kwargs``, a compile that chooses
``dynamic=`` (or passes ``**kwargs``), ``mark_dynamic`` or dynamo's shape settings in the file, eval
loaders, and frameworks that own the loop.

Fix (numerics: up to ``batch_size - 1`` samples an epoch are left out of training): ``drop_last=True``
(replacing ``drop_last=False``). Declined when the call passes ``**kwargs``, when the loader may not
shuffle (the same samples would be left out every epoch), or when its call site also builds a loader
that is not trained on (a helper called for evaluation too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.catalog import matches_selector
from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rewrite.edits import KeywordPlan, apply_keyword_edits, plan_loader_keyword
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.batch_loops import BatchLoop
from tcaudit.script.distributed import in_test_code
from tcaudit.script.evidence import ACCELERATOR_OR_CUDA, STEP_OR_BACKWARD_CALL
from tcaudit.script.expressions import assigned_name, literal
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import training_phase
from tcaudit.script.loader_construction import LoaderSite
from tcaudit.script.loader_sharding import made_by
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.source.syntax import full_name, keyword
from tcaudit.source.triggers import all_of, text_matches

COMPILE = "torch.compile"
_COMPILE_KEYWORDS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options", "disable"})
# The user decides how shapes are traced: no finding.
_SHAPE_CHOICE = re.compile(
    r"mark_dynamic|mark_unbacked|mark_static|automatic_dynamic_shapes|assume_static_by_default|dynamic_shapes"
)
# Samplers that draw a new order each epoch: the samples a dropped last batch holds change.
_SHUFFLING_SAMPLERS = frozenset(
    f"torch.utils.data.{module}{name}"
    for module in ("", "sampler.", "distributed.")
    for name in ("RandomSampler", "WeightedRandomSampler", "SubsetRandomSampler", "DistributedSampler")
)
# torch factories whose first argument (or ``size``) gives the leading dimension of the tensor.
_SIZED_FACTORIES = frozenset(f"torch.{name}" for name in ("randn", "rand", "zeros", "ones", "empty", "full"))
_MOVES = frozenset({"to", "cuda", "cpu", "float", "half", "long", "int", "bfloat16", "pin_memory", "contiguous"})

MESSAGE = "the smaller last batch of an epoch recompiles the compiled model: pass `drop_last=True`"
MESSAGE_FALSE = "with `drop_last=False` the smaller last batch of an epoch recompiles the compiled model"
MESSAGE_AFTER_COMPILE = "once compiled (TC305), the model recompiles on the smaller last batch: pass `drop_last=True`"


@dataclass(frozen=True, eq=False)
class AddAfterCompile(FixPlan):
    """``drop_last=True`` on the training DataLoader of a model that TC305's fix (``fix --compile``)
    compiles. The fix engine makes TC305's fix first and analyses the file again, where this rule sees
    the compile and plans a plain keyword edit; this plan reaches the fix only when TC305's did not
    run, and is then declined (without the compile there is nothing to recompile)."""

    kind = "add-kwarg"
    call: cst.Call
    key: str
    value: str
    after: str = "TC305"  # the fix that must run first


class CompilePartialBatch(ScriptRule):
    id = "TC318"
    triggers = (all_of(r"DataLoader", r"compile(?<!\wcompile)\b", STEP_OR_BACKWARD_CALL, ACCELERATOR_OR_CUDA),)
    # ``fix --compile`` compiles the trained model (TC305), so the file need not say "compile".
    structural_triggers = {"compile": (all_of(r"DataLoader", STEP_OR_BACKWARD_CALL, ACCELERATOR_OR_CUDA),)}
    after = ("TC305",)  # the compile TC305's fix adds makes the partial batch recompile

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if pipeline.framework_owned or not (facts.uses_accelerator or pipeline.uses_cuda):
            return
        if text_matches(_SHAPE_CHOICE, facts.source.text):
            return
        options, compiled_steps = _training_compiles(facts, pipeline)
        if any(_chooses_shapes(call) for call in options):
            return
        # No compile of the training yet: the one ``fix --compile`` makes (TC305's fix) counts.
        companion = not options and _compiled_by_fix(facts, context)
        if not options and not companion:
            return
        cost = context.cost(self.spec, "recompile")
        seen: set[int] = set()
        for batch in pipeline.batch_loops:
            if not _trains(facts, pipeline, batch, compiled_steps):
                continue
            for site in batch.loaders:
                if id(site.call.node) in seen or not site.training or not _partial_batches(pipeline, site):
                    continue
                seen.add(id(site.call.node))
                explanation = (
                    "Unless the dataset's length divides the batch size, each epoch ends on a smaller batch, and "
                    f"torch.compile recompiles the model for its shape{cost}; `drop_last=True` leaves that batch "
                    "(fewer than batch_size samples) out of training."
                )
                if companion:
                    yield self.finding(
                        facts, site.call.node, MESSAGE_AFTER_COMPILE, explanation=explanation,
                        fix=self.planned_fix(
                            FixClass.NUMERICS, "once compiled (TC305), pass drop_last=True",
                            lambda site=site: _plan_after_compile(pipeline, site),
                        ),
                    )
                    continue
                yield self.finding(
                    facts,
                    site.call.node,
                    MESSAGE_FALSE if site.has("drop_last") else MESSAGE,
                    explanation=explanation,
                    fix=self.planned_fix(
                        FixClass.NUMERICS, "pass drop_last=True",
                        lambda site=site: _plan(pipeline, site, compiled_steps),
                    ),
                )


# -- what is compiled ------------------------------------------------------------------------------------


def _compiled_by_fix(facts: ScriptFacts, context: RuleContext) -> bool:
    """Whether ``fix --compile`` runs here and TC305's fix compiles a trained model of this file."""
    settings = context.settings
    if "compile" not in settings.structural_fixes or any(
        matches_selector("TC305", s) for s in settings.ignored_for(facts.source.display_path)
    ):
        return False
    return bool(context.fixable("TC305", facts))


def _trains(facts: ScriptFacts, pipeline: PipelineFacts, batch: BatchLoop, compiled_steps: set[str]) -> bool:
    """A training batch loop, also one whose step is a compiled step function called by the name the
    compile's result is bound to (``step = torch.compile(train_step)``)."""
    if pipeline.is_training_loop(batch):
        return True
    if not compiled_steps or facts.in_eval(batch.ctx) or not isinstance(batch.loop, (cst.For, cst.While)):
        return False
    return any(call.name in compiled_steps for call in facts.calls_within(batch.loop))


def _training_compiles(facts: ScriptFacts, pipeline: PipelineFacts) -> tuple[list[cst.Call | None], set[str]]:
    """The compiles of the trained model or of a training step function, each as the call that passes
    the compile's options (None for a bare ``@torch.compile``); and the names that hold a compiled
    step function."""
    models = set(pipeline.trained_model_names) | set(pipeline.optimized_model_names) | facts.model_names
    steps = {fn for fn in pipeline.step_functions if fn is not None} | pipeline.functions_reaching_step
    step_names = {fn.name.value for fn in steps}
    out: list[cst.Call | None] = []
    compiled_steps: set[str] = set()
    decorators: set[int] = set()
    for fn, ctx in facts.functions:
        for decorator in fn.decorators:
            expr = decorator.decorator
            func = expr.func if isinstance(expr, cst.Call) else expr
            if facts.qualname(func) != COMPILE:
                continue
            if isinstance(expr, cst.Call):
                decorators.add(id(expr))
            if fn in steps and not facts.in_eval(ctx) and not in_test_code(ctx):
                out.append(expr if isinstance(expr, cst.Call) else None)
    for call in facts.calls:
        if id(call.node) in decorators or facts.in_eval(call.ctx) or in_test_code(call.ctx):
            continue
        if call.qualname == COMPILE:
            target = call.arg("model", 0)
            name = _unwrapped(full_name(target)) if target is not None else None
            assigned = assigned_name(call)
            if name in step_names:
                if assigned:
                    compiled_steps.add(assigned)
            elif not (name in models or _unwrapped(assigned) in models):
                continue
        elif call.method == "compile" and call.qualname is None and call.receiver_name is not None:
            if any(arg.keyword.value not in _COMPILE_KEYWORDS if arg.keyword else not arg.star for arg in call.node.args):
                continue  # not nn.Module.compile(**kwargs): Keras' compile(optimizer, loss) and the like
            if _unwrapped(call.receiver_name) not in models:
                continue
        else:
            continue
        if training_phase(facts, call.ctx, call.node) == "after":
            continue  # compiled for export or evaluation after training
        out.append(call.node)
    return out, compiled_steps


def _unwrapped(name: str | None) -> str | None:
    return name.removesuffix(".module") if name else name


def _chooses_shapes(call: cst.Call | None) -> bool:
    """``dynamic=`` written (any value: the author chose how shapes are traced), or options from ``**``."""
    if call is None:
        return False
    return any(arg.star == "**" for arg in call.args) or keyword(call, "dynamic") is not None


# -- whether the loader gives a smaller last batch ---------------------------------------------------------


def _partial_batches(pipeline: PipelineFacts, site: LoaderSite) -> bool:
    if not site.complete or not all(literal(v) is None for v in site.values("batch_sampler")):
        return False
    if site.has("drop_last") and not all(literal(v) is False for v in site.values("drop_last")):
        return False
    if site.has("collate_fn") and not all(literal(v) is None for v in site.values("collate_fn")):
        return False  # padding to each batch's longest sequence: shapes vary anyway
    sizes = site.values("batch_size")
    if any(literal(v) is None for v in sizes):
        return False  # batch_size=None: the dataset's items are the batches
    if not sizes:
        return False  # DataLoader's default batch_size=1: every batch has one sample
    size = literal(sizes[0]) if len(sizes) == 1 and not site.keys["batch_size"][0].conditional else ...
    if size == 1:
        return False
    dataset = site.call.arg("dataset", 0)
    if dataset is None:
        return False
    length = _dataset_length(pipeline, dataset)
    if length is False:
        return False  # a stream of this file's own: maybe endless
    if isinstance(length, int) and isinstance(size, int) and not isinstance(size, bool):
        return length > size and length % size != 0
    return True


def _dataset_length(pipeline: PipelineFacts, dataset: cst.BaseExpression) -> int | bool | None:
    """The dataset's literal length where the file shows it; False for an IterableDataset of this file;
    None when unknown."""
    facts = pipeline.facts
    values = facts.binding_values(dataset)
    leaves = [v for v in values if not isinstance(v, (cst.Name, cst.Attribute, cst.IfExp, cst.BooleanOperation))]
    if len(leaves) != 1 or not isinstance(leaves[0], cst.Call):
        return None
    value = leaves[0]
    dotted = full_name(value.func) or ""
    if dotted.split(".")[-1] in pipeline.iterable_dataset_classes:
        return False
    qual = facts.qualname(value.func) or ""
    if dotted == "range":
        return _range_length(value)
    if qual.endswith("TensorDataset"):
        lengths = {_tensor_length(facts, arg.value) for arg in value.args if arg.keyword is None and not arg.star}
        known = {n for n in lengths if n is not None}
        return known.pop() if len(known) == 1 else None
    cls = facts.classes_by_name.get(dotted)
    if cls is not None and "." not in dotted:
        return _class_length(cls)
    return None


def _range_length(call: cst.Call) -> int | None:
    args = [literal(a.value) for a in call.args]
    if not args or not all(isinstance(a, int) and not isinstance(a, bool) for a in args) or len(args) > 3:
        return None
    try:
        return len(range(*args))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _tensor_length(facts: ScriptFacts, expr: cst.BaseExpression, depth: int = 0) -> int | None:
    """The literal leading dimension of ``torch.randn(1024, 3)``, ``torch.arange(1024)``,
    ``torch.randint(0, 10, (1024,))`` (through ``.to(device)``-like chains and one name)."""
    if depth > 3:
        return None
    values = [v for v in facts.binding_values(expr) if not isinstance(v, (cst.Name, cst.Attribute))]
    if len(values) != 1 or not isinstance(values[0], cst.Call):
        return None
    call = values[0]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _MOVES:
        return _tensor_length(facts, call.func.value, depth + 1)
    qual = facts.qualname(call.func) or ""
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    sized = keyword(call, "size")
    size = sized.value if sized is not None else None
    if qual in _SIZED_FACTORIES:
        first = keyword(call, "size", 0)
        return _leading(first.value if first is not None else None)
    if qual == "torch.randint":
        shape = size if size is not None else next((p for p in positional if isinstance(p, (cst.Tuple, cst.List))), None)
        return _leading(shape)
    if qual == "torch.arange" and size is None and len(positional) in (1, 2):
        ends = [literal(p) for p in positional]
        if all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
            return len(range(*ends))  # type: ignore[arg-type]
    return None


def _leading(expr: cst.BaseExpression | None) -> int | None:
    if isinstance(expr, (cst.Tuple, cst.List)):
        expr = expr.elements[0].value if expr.elements else None
    value = literal(expr)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _class_length(cls: cst.ClassDef) -> int | None:
    """``def __len__(self): return 4096`` in a Dataset class of this file."""
    if not isinstance(cls.body, cst.IndentedBlock):
        return None
    for item in cls.body.body:
        if isinstance(item, cst.FunctionDef) and item.name.value == "__len__" and isinstance(item.body, cst.IndentedBlock):
            body = item.body.body
            if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Return):
                value = literal(body[0].body[0].value)
                return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


# -- the plan --------------------------------------------------------------------------------------------


def _plan(pipeline: PipelineFacts, site: LoaderSite, compiled_steps: set[str]) -> KeywordPlan:
    facts = pipeline.facts
    call = site.call
    if call.has_star_kwargs:
        raise DeclineFix(
            f"the DataLoader takes keywords from **{site.kwargs_dicts[0] if site.kwargs_dicts else 'kwargs'}, "
            "which may be shared with other loaders; add drop_last=True by hand where only training uses it"
        )
    for batch in pipeline.batch_loops:
        if any(s is site for s in batch.loaders) and not _trains(facts, pipeline, batch, compiled_steps):
            raise DeclineFix(
                f"this DataLoader call also feeds the loop at line {facts.line_of(batch.loop)}, which does not "
                "train: drop_last=True would leave samples out of what it measures"
            )
    helpers = made_by(facts, call)
    if len(helpers) > 1:
        name = full_name(helpers[0].func) or "a helper"
        raise DeclineFix(
            f"the DataLoader is built by `{name}`, called {len(helpers)} times: drop_last=True would drop the "
            "last batch of its other loaders (evaluation) too"
        )
    _check_order(facts, site)
    return plan_loader_keyword(site, "drop_last", "True")


def _plan_after_compile(pipeline: PipelineFacts, site: LoaderSite) -> AddAfterCompile:
    plan = _plan(pipeline, site, set())
    return AddAfterCompile(site.call.node, plan.key, plan.value)


def _check_order(facts: ScriptFacts, site: LoaderSite) -> None:
    """DeclineFix unless the loader draws a new order every epoch: with a fixed order the batch that
    drop_last leaves out holds the same samples every epoch, and they are never trained on."""
    samplers = site.values("sampler")
    plain = True  # DataLoader's own sampler (shuffle decides) on some path
    if samplers:
        plain = False
        for value in facts.binding_values(samplers[0]):
            if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
                continue
            if isinstance(value, (cst.Name, cst.Attribute)) and (
                literal(value) is None or facts.bindings_of(full_name(value) or "")
            ):
                plain = plain or literal(value) is None
                continue
            if isinstance(value, cst.Call) and facts.qualname(value.func) in _SHUFFLING_SAMPLERS:
                shuffle = keyword(value, "shuffle")
                if shuffle is None or literal(shuffle.value) is True:
                    continue
            raise DeclineFix(
                f"the sampler (`{facts.code(value)}`) may keep one order: drop_last=True would "
                "leave the same samples out of training every epoch"
            )
    if plain and not _shuffles(site, samplers[0] if samplers else None):
        raise DeclineFix(
            "the DataLoader may not shuffle: drop_last=True would leave the same last samples out of training "
            "every epoch (shuffle the data, then pass drop_last=True)"
        )


def _shuffles(site: LoaderSite, sampler: cst.BaseExpression | None) -> bool:
    values = site.values("shuffle")
    if len(values) != 1 or site.keys["shuffle"][0].conditional:
        return False
    value = values[0]
    if literal(value) is True:
        return True
    # ``shuffle=(sampler is None)`` beside ``sampler=sampler``: shuffled whenever there is no sampler.
    if (
        sampler is not None and isinstance(value, cst.Comparison) and len(value.comparisons) == 1
        and isinstance(value.comparisons[0].operator, cst.Is) and literal(value.comparisons[0].comparator) is None
    ):
        left, right = full_name(value.left), full_name(sampler)
        return left is not None and left == right
    return False


# -- the fix ---------------------------------------------------------------------------------------------


class CompilePartialBatchFix(Codemod):
    rule = "TC318"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        ready = [finding.fix.plan for finding in findings if not isinstance(finding.fix.plan, AddAfterCompile)]
        if not ready:
            raise DeclineFix("TC305's fix did not compile the model, so its last batch recompiles nothing")
        return apply_keyword_edits(module, ready)
