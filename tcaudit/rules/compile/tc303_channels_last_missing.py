"""TC303 channels-last-missing: a convnet trained in half precision in NCHW memory format.

Detects a 2-D convnet trained on CUDA under autocast (or one that TC201's fix will put under
autocast) while nothing in the script mentions channels_last. Fix (numerics): convert the model to
channels_last where it is built or moved to the device, the image batches where the training loop
copies them to the device, and a 1x1 input made where the model is called (a GAN's noise: a
compiled model's backward needs it in channels_last strides); the ``.view(shape)`` calls of the
model's forward code become ``.reshape(shape)``; declined for 3-D convolutions, a view whose storage
sharing matters (written in place, or its source written after it) and ``.view()`` on the model's
outputs outside its code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Severity
from tcaudit.rewrite.codemod import FixContext, ensure_import, parse_expression, parse_statement, torch_import_name
from tcaudit.rewrite.edits import CallEditor, add_keyword
from tcaudit.rules.advice import held_back, little_to_gain
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.aliasing import based_on, chain_root, in_place_write, written_through
from tcaudit.script.amp import autocast_dtype_for
from tcaudit.script.batch_loops import BatchLoop
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import moves_to_device
from tcaudit.script.facts import Binding, CallSite, ScriptFacts, assigned_names
from tcaudit.script.model_classes import calls_within, forward_outputs, init_value, model_classes, takes_images
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.script.trained_models import MODEL_CHAIN, MODEL_WRAPPERS, ModelSite
from tcaudit.source.syntax import full_name, keyword, strip_comments
from tcaudit.source.triggers import all_of

CONV3D_LAYERS = frozenset(
    f"torch.nn.{prefix}{name}"
    for prefix in ("", "modules.conv.", "modules.")
    for name in ("Conv3d", "ConvTranspose3d", "LazyConv3d", "LazyConvTranspose3d")
)


def planned_autocast(facts: ScriptFacts, context: RuleContext) -> str | None:
    """The dtype TC201's fix puts this script's training under, or None when it adds no autocast (TC201
    off, nothing to fix, or its fix declined): TC201's outcome on this text, from the engine."""
    if not context.fixable("TC201", facts):
        return None
    return autocast_dtype_for(facts, context.settings.precision, context.models, context.settings.target,
                              context.compiles_trained_models(facts))


# -- the plan: which calls and statements change ------------------------------------------------------


@dataclass(frozen=True)
class AddMemoryFormat:
    """``call`` gains ``memory_format=<channels_last>`` (``model.to(device)``, ``images.cuda()``)."""

    call: cst.Call


@dataclass(frozen=True)
class ConvertResult:
    """``call`` becomes ``call.to(memory_format=<channels_last>)`` (the model inside a wrapper)."""

    call: cst.Call


@dataclass(frozen=True)
class InsertAfter:
    statement: cst.SimpleStatementLine
    code: str


@dataclass(frozen=True)
class ReshapeView:
    """``x.view(shape)`` in the model's forward code becomes ``x.reshape(shape)``: the same values, a view
    whenever the strides allow one (every NCHW-contiguous tensor) and a copy where channels_last does not."""

    call: cst.Call


Edit = Union[AddMemoryFormat, ConvertResult, InsertAfter, ReshapeView]


@dataclass(frozen=True, eq=False)
class ChannelsLastPlan(FixPlan):
    kind = "insert-after"
    line: int  # the last line of the model's construction
    target: str  # the model's name
    code: str  # the conversion, as the message says
    edits: tuple[Edit, ...]
    channels_last: str  # ``torch.channels_last`` under the file's torch name
    reshaped: tuple[str, ...] = ()  # the model's ``.view(...)`` calls that become ``.reshape(...)``, as written


class ChannelsLastMissing(ScriptRule):
    id = "TC303"
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE),)
    # channels_last pays under autocast: also the autocast TC201's fix adds (whose dtype depends on TC305)
    after = ("TC201", "TC305")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        if "channels_last" in strip_comments(facts.source.text):
            return  # any use (model, inputs, a --channels-last flag) is the user's decision
        # The model audit's FLOP shares decide where it built the model (a factory, a name picked at run
        # time, a transformer whose patch embedding is a conv); the script's text decides elsewhere.
        convnets = pipeline.convnets(context.models)
        if not convnets:
            return
        if pipeline.trains_under_autocast:
            before_autocast = False
        elif planned_autocast(facts, context) is not None:
            before_autocast = True  # TC201's fix adds autocast: the conversion belongs to the same recipe
        else:
            return
        reported: set[str] = set()
        small = little_to_gain(facts, context)
        # No figure for a launch-bound model: the explanation says why it gains nothing instead.
        cost = context.cost(self.spec, "resnet50") if small is None else ""
        for model in convnets:
            if model.name in reported:
                continue
            reported.add(model.name)
            code = f"{model.name} = {model.name}.to(memory_format=torch.channels_last)"
            line = facts.position(model.construction).end.line
            explanation = (
                "Half-precision convolutions run on tensor cores in channels_last (NHWC); NCHW adds a transpose "
                f"around every conv{cost}. Add `{code}`."
            )
            if before_autocast:
                message = f"with autocast (TC201), also channels_last: convnet `{model.name}` trains in NCHW layout"
            else:
                message = f"convnet `{model.name}` trains under autocast in NCHW layout"
            fix = self.planned_fix(
                FixClass.NUMERICS,
                "convert the model to channels_last after it is built",
                lambda name=model.name, code=code, line=line: _channels_last_plan(
                    facts, pipeline, convnets, context, name, code, line
                ),
            )
            if fix.plan is not None and fix.plan.reshaped:
                views = ", ".join(f"`{view}`" for view in fix.plan.reshaped)
                fix = dataclasses.replace(
                    fix, description=f"{fix.description}; in its forward code {views} becomes `.reshape(...)`"
                )
            severity = None
            if small is not None:
                message, explanation, severity = message + small.message, explanation + small.explanation, Severity.INFO
            fix = held_back(fix, small, self.id, context.settings)
            yield self.finding(facts, model.construction, message, fix=fix, follows="TC201" if before_autocast else None,
                               explanation=explanation, severity=severity,
                               details=small.details if small is not None else None)


def _channels_last_plan(
    facts: ScriptFacts, pipeline: PipelineFacts, convnets: list[ModelSite], context: RuleContext, name: str, code: str,
    line: int,
) -> ChannelsLastPlan:
    channels_last = f"{torch_import_name(facts) or 'torch'}.channels_last"
    sites = [site for site in convnets if site.name == name]
    views: dict[int, CallSite] = {}
    for site in sites:
        views.update((id(view.node), view) for view in _check_model(facts, site))
    edits: list[Edit] = []
    planned: set[int] = set()
    for site in sites:
        binding = _construction_binding(facts, pipeline, site)
        if id(binding.statement.node) in planned:
            continue  # one statement builds the model in both branches of a factory
        planned.add(id(binding.statement.node))
        edits.append(_model_edit(facts, binding, site.name, channels_last))
    if all(
        takes_images(facts, site.construction, pipeline.arch_by_name(site.construction) is not None)
        or _audited_image_input(pipeline, site, context)
        for site in sites
    ):
        edits.extend(_input_edits(facts, pipeline, name, channels_last))
    edits.extend(_noise_edits(facts, name))
    edits.extend(ReshapeView(view.node) for view in views.values())
    reshaped = tuple(facts.code(view.node) for view in views.values())
    return ChannelsLastPlan(line, name, code, tuple(edits), channels_last, reshaped)


# -- the model ------------------------------------------------------------------------------------------


def _check_model(facts: ScriptFacts, site: ModelSite) -> list[CallSite]:
    """Declines what channels_last cannot take; returns the ``.view(...)`` calls of the model's forward code,
    which the fix turns into ``.reshape(...)``."""
    classes = model_classes(facts, site.construction)
    inside = calls_within(site.construction)
    views: list[CallSite] = []
    for call in facts.calls:
        in_model = call.ctx.class_def in classes or id(call.node) in inside
        if not in_model:
            continue
        if (call.qualname or "") in CONV3D_LAYERS:
            raise DeclineFix("the model has 3-D convolutions: their rank-5 weights cannot take channels_last")
        if (
            call.method == "view" and call.ctx.class_def in classes and _runs_after_conversion(call)
            and not _views_flat_layer_output(facts, call)
        ):
            _check_reshapable(facts, call)
            views.append(call)
    outputs = forward_outputs(facts, site.name)
    for call in facts.calls:
        if call.method != "view":
            continue
        receiver = call.receiver
        if (call.receiver_name in outputs) or (
            isinstance(receiver, cst.Call) and full_name(receiver.func) == site.name
        ):
            raise DeclineFix(
                f"`{facts.code(call.node)}` views the model's output, which channels_last "
                "may make non-viewable; use `.reshape()` there, then convert the model"
            )
    return views


# ``.view()`` in the model's code: fails on a channels_last activation whose memory is not in the viewed
# order, where ``.reshape()`` computes the same values (copying only then). A copy differs from a view in
# one way: writes no longer reach through it. So a view stays (and the fix declines) where a write could
# be shared: the view or a name bound to it written in place, or the viewed tensor written after it.


def _runs_after_conversion(call: CallSite) -> bool:
    """Code in ``__init__`` runs before the model is converted (on its fresh, contiguous tensors)."""
    function = call.ctx.function
    return function is None or function.name.value != "__init__"


# Layers whose output is a fresh row-major tensor whatever the layout of their input: a view of it works
# under channels_last as before, so it stays a view.
_FLAT_LAYERS = frozenset(
    f"torch.nn.{name}"
    for name in ("Linear", "Bilinear", "LazyLinear", "Embedding", "EmbeddingBag", "LSTM", "GRU", "RNN")
)


def _views_flat_layer_output(facts: ScriptFacts, view: CallSite) -> bool:
    """``self.fc(x).view(-1)``, or ``y.view(-1)`` where every assignment to ``y`` in the method is
    ``y = self.fc(...)``: a view off the conv path."""
    cls, function = view.ctx.class_def, view.ctx.function

    def flat(expr: cst.BaseExpression | None) -> bool:
        if not (isinstance(expr, cst.Call) and (full_name(expr.func) or "").startswith("self.")):
            return False
        layer = init_value(facts, cls, full_name(expr.func))
        return isinstance(layer, cst.Call) and (facts.qualname(layer.func) or "") in _FLAT_LAYERS

    receiver = view.receiver
    if isinstance(receiver, cst.Name):
        values = [b.value for b in facts.bindings_of(receiver.value) if b.ctx.function is function]
        return bool(values) and all(flat(value) for value in values)
    return flat(receiver)


def _check_reshapable(facts: ScriptFacts, view: CallSite) -> None:
    written = facts.code(view.node)
    positional = [a for a in view.node.args if a.keyword is None and not a.star]
    if keyword(view.node, "dtype") is not None or (
        len(positional) == 1 and (facts.qualname(positional[0].value) or "") in _TORCH_DTYPES
    ):
        raise DeclineFix(
            f"`{written}` in the model's code reinterprets a tensor's bits as another dtype, which "
            "`.reshape()` cannot; convert the model by hand"
        )
    function = view.ctx.function
    if written_through(facts, function, view.node):
        raise DeclineFix(
            f"`{written}` in the model's code is written in place: a `.reshape()` copy would not pass the "
            "write on to the viewed tensor, and `.view()` fails on channels_last activations; convert by hand"
        )
    after = facts.position(view.node).start
    names = {b.target for b in facts.bindings if b.ctx.function is function and based_on(b.value, view.node)}
    # The viewed tensor: ``x`` in ``x.view()``, ``x.transpose(1, 2).view()``, ``x[0].view()`` (a layer's
    # output, ``self.conv(x).view()``, is a fresh tensor nothing else holds).
    source = chain_root(view.receiver)
    if isinstance(source, cst.Name) and source.value != "self":
        names.add(source.value)
    for name in sorted(names):
        mutation = in_place_write(facts, function, name, after)
        if mutation is not None:
            raise DeclineFix(
                f"`{written}` in the model's code shares its storage with `{name}`, which "
                f"`{facts.code(mutation)}` writes in place: a `.reshape()` copy would not share "
                "that write, and `.view()` fails on channels_last activations; convert by hand"
            )


_TORCH_DTYPES = frozenset(
    f"torch.{name}"
    for name in (
        "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16",
        "short", "int32", "int", "int64", "long", "bool", "complex64", "complex128", "float8_e4m3fn",
        "float8_e5m2",
    )
)


def _construction_binding(facts: ScriptFacts, pipeline: PipelineFacts, site: ModelSite) -> Binding:
    """The assignment to the model's name that builds it (directly, through a method chain or a wrapper,
    or by calling a factory function of this file)."""
    found = [
        b for b in facts.bindings_of(site.name)
        if any(call is site.construction for call in _direct_constructions(facts, pipeline, b.value))
    ]
    if len(found) != 1:
        raise DeclineFix(f"could not tell which statement builds `{site.name}`; convert it by hand")
    binding = found[0]
    statement = binding.statement.node if binding.statement else None
    if not isinstance(statement, cst.SimpleStatementLine):
        raise DeclineFix(f"`{site.name}` is built in a one-line suite; split the line first")
    return binding


def _direct_constructions(facts: ScriptFacts, pipeline: PipelineFacts, value: cst.BaseExpression) -> list[cst.Call]:
    """What this expression itself builds (names are not followed: ``model = model.cuda()`` builds nothing)."""
    expr = _strip_wrappers(facts, value)[0]
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODEL_CHAIN:
        expr = expr.func.value
    if not isinstance(expr, cst.Call):
        return []
    dotted = full_name(expr.func)
    if dotted and "." not in dotted and dotted in facts.functions_by_name and dotted not in pipeline.class_names:
        return list(pipeline.constructions(expr))
    return [expr]


def _strip_wrappers(facts: ScriptFacts, value: cst.BaseExpression) -> tuple[cst.BaseExpression, bool]:
    """``DDP(model.cuda(), ...)`` → (``model.cuda()``, True)."""
    expr, wrapped = value, False
    while isinstance(expr, cst.Call):
        qual = facts.qualname(expr.func) or ""
        if not (qual in MODEL_WRAPPERS or qual.endswith(("DistributedDataParallel", "DataParallel"))):
            break
        positional = [a for a in expr.args if a.keyword is None and not a.star]
        if not positional:
            raise DeclineFix("the model is wrapped without a positional module argument")
        expr, wrapped = positional[0].value, True
    return expr, wrapped


def _model_edit(facts: ScriptFacts, binding: Binding, name: str, channels_last: str) -> Edit:
    inner, wrapped = _strip_wrappers(facts, binding.value)
    following = _next_device_move(facts, binding, name)
    initialised = None if wrapped else _initialised_after(facts, binding, name, following is not None)
    if initialised is not None:
        # ``netD = Discriminator().to(device)`` then ``netD.apply(weights_init)``: an in-place random init
        # fills a channels_last weight in its memory order, so converting first would put the same seeded
        # draws in other places (a different, if equally distributed, initial model). Convert after it.
        return InsertAfter(initialised, f"{name} = {name}.to(memory_format={channels_last})")
    if following is not None and not wrapped:
        # ``model = Net()`` then ``model = model.to(device)``: convert in that move.
        return AddMemoryFormat(following)
    if isinstance(inner, cst.Call) and _plain_device_to(facts, inner):
        return AddMemoryFormat(inner)
    if not wrapped:
        return InsertAfter(binding.statement.node, f"{name} = {name}.to(memory_format={channels_last})")
    if isinstance(inner, cst.Call):
        return ConvertResult(inner)
    raise DeclineFix(f"`{name}` is wrapped around a name; convert the model before it is wrapped")


def _initialised_after(
    facts: ScriptFacts, binding: Binding, name: str, skip_move: bool
) -> cst.SimpleStatementLine | None:
    """The last statement of the model's block, after its construction and before any loop, that
    initialises it in place: ``model.apply(init_fn)``, ``torch.nn.init.normal_(model.fc.weight, ...)``
    (PyTorch-GAN builds both models, moves them under ``if cuda:`` and only then applies the init)."""
    statement = binding.statement
    if statement is None:
        return None
    index = statement.index + 1 + (1 if skip_move else 0)
    last = None
    while index < len(statement.block):
        line = statement.block[index]
        index += 1
        if isinstance(line, (cst.For, cst.While, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)):
            break  # training (or code that may read the weights) from here on
        if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr)):
            if isinstance(line, cst.SimpleStatementLine) and name in assigned_names(line):
                break  # the name is bound to another model from here on
            continue
        call = line.body[0].value
        if not isinstance(call, cst.Call):
            continue
        callee = full_name(call.func) or ""
        first = next((a.value for a in call.args if a.keyword is None), None)
        target = full_name(first) if first is not None else None
        if callee == f"{name}.apply" or (
            (facts.qualname(call.func) or "").startswith("torch.nn.init.")
            and target is not None and (target == name or target.startswith(name + "."))
        ):
            last = line
    return last


def _next_device_move(facts: ScriptFacts, binding: Binding, name: str) -> cst.Call | None:
    """``model.to(device)`` or ``model = model.to(device)`` as the very next statement of the block."""
    statement = binding.statement
    if statement is None or statement.index + 1 >= len(statement.block):
        return None
    following = statement.block[statement.index + 1]
    if not isinstance(following, cst.SimpleStatementLine) or len(following.body) != 1:
        return None
    small = following.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and full_name(small.targets[0].target) == name:
        value = small.value
    elif isinstance(small, cst.Expr):
        value = small.value
    else:
        return None
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and full_name(value.func.value) == name
        and _plain_device_to(facts, value)
    ):
        return value
    return None


def _plain_device_to(facts: ScriptFacts, call: cst.Call) -> bool:
    """``x.to(device)`` / ``x.to(device=...)`` (a device move with no dtype or memory format)."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "to"):
        return False
    site = CallSite(call, None, None, facts.module_frame, None)
    if not moves_to_device(site) or keyword(call, "memory_format") is not None:
        return False
    return len([a for a in call.args if a.keyword is None]) <= 1 and not any(a.star for a in call.args)


# -- the input batches ----------------------------------------------------------------------------------


def _audited_image_input(pipeline: PipelineFacts, site: ModelSite, context: RuleContext) -> bool:
    """The model audit fed this model a rank-4 floating batch."""
    profile = pipeline.profile_of(site, context.models)
    return profile is not None and profile.image_input


def _input_edits(facts: ScriptFacts, pipeline: PipelineFacts, model: str, channels_last: str) -> list[Edit]:
    """Convert what the training loops pass to the model where it is copied to the device."""
    edits: list[Edit] = []
    converted: set[int] = set()  # a GAN's discriminator sees the same batch twice
    for batch in pipeline.batch_loops:
        if not pipeline.is_training_loop(batch):
            continue
        for forward in facts.calls:
            if forward.name != model or not _in_loop(forward, batch) or facts.in_eval(forward.ctx):
                continue
            positional = [a for a in forward.node.args if a.keyword is None and not a.star]
            if not positional:
                continue
            argument = positional[0].value
            if isinstance(argument, cst.Call):
                move = pipeline.call_site(argument)
                if move is not None and _moves_batch(facts, move, batch):
                    edits.extend(_move_edit(move, None, channels_last, converted))
                continue
            name = full_name(argument) if isinstance(argument, cst.Name) else None
            if name is None or _viewed_in_loop(facts, name, batch):
                continue
            moves = [
                b for b in facts.bindings_of(name)
                if b.ctx.inside(batch.loop) or b.ctx.function is batch.loop
            ]
            for binding in moves:
                if not isinstance(binding.value, cst.Call):
                    continue
                move = pipeline.call_site(binding.value)
                if move is not None and _moves_batch(facts, move, batch):
                    edits.extend(_move_edit(move, binding, channels_last, converted))
    return edits


# Factories of a fresh tensor whose shape the call spells out.
_SHAPED_FACTORIES = frozenset(f"torch.{name}" for name in ("randn", "rand", "zeros", "ones", "empty"))


def _noise_edits(facts: ScriptFacts, model: str) -> list[Edit]:
    """The model's 1x1 inputs made where it is called (in a training loop or not): see ``_one_by_one``."""
    edits: list[Edit] = []
    converted: set[int] = set()
    for forward in facts.calls:
        if forward.name != model or facts.in_eval(forward.ctx):
            continue
        positional = [a.value for a in forward.node.args if a.keyword is None and not a.star]
        if not positional:
            continue
        argument = positional[0]
        values = [argument]
        if isinstance(argument, cst.Name):
            values = [b.value for b in facts.bindings_of(argument.value) if b.ctx.function is forward.ctx.function]
        for value in values:
            if isinstance(value, cst.Call) and id(value) not in converted and _one_by_one(facts, value):
                converted.add(id(value))
                edits.append(ConvertResult(value))
    return edits


def _one_by_one(facts: ScriptFacts, call: cst.Call) -> bool:
    """A GAN's noise, ``torch.randn(b, nz, 1, 1)``: it gets ``.to(memory_format=channels_last)``. With 1x1
    spatial dims its NCHW strides are also channels_last-contiguous, so ``.contiguous(memory_format=...)``
    leaves them as they are, and cuDNN's transposed-conv backward then computes the weight gradient in
    NCHW while inductor expects the channels_last weight's layout: the compiled generator's backward fails
    a stride assertion (torch 2.11, H200). ``.to(memory_format=...)`` copies it into unambiguous
    channels_last strides; the values stay the same."""
    if (facts.qualname(call.func) or "") not in _SHAPED_FACTORIES:
        return False
    sizes = [a.value for a in call.args if a.keyword is None and not a.star]
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
        sizes = [element.value for element in sizes[0].elements]
    return len(sizes) == 4 and all(isinstance(s, cst.Integer) and s.value == "1" for s in sizes[2:])


def _in_loop(call: CallSite, batch: BatchLoop) -> bool:
    if isinstance(batch.loop, (cst.For, cst.While)):
        return call.ctx.inside(batch.loop)
    return call.ctx.function is batch.loop


def _moves_batch(facts: ScriptFacts, move: CallSite, batch: BatchLoop) -> bool:
    if move.method not in ("to", "cuda") or not moves_to_device(move):
        return False
    receiver = move.receiver
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    name = full_name(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
    return name in batch.names


def _viewed_in_loop(facts: ScriptFacts, name: str, batch: BatchLoop) -> bool:
    return any(c.method == "view" and c.receiver_name == name and _in_loop(c, batch) for c in facts.calls)


def _move_edit(move: CallSite, binding: Binding | None, channels_last: str, converted: set[int]) -> list[Edit]:
    node = move.node
    if keyword(node, "memory_format") is not None or id(node) in converted:
        return []
    converted.add(id(node))
    if move.method == "to":
        if len([a for a in node.args if a.keyword is None]) > 1 or any(a.star for a in node.args):
            return []  # .to(device, dtype): leave it
        return [AddMemoryFormat(node)]
    statement = binding.statement.node if binding is not None and binding.statement else None
    if binding is None or not isinstance(statement, cst.SimpleStatementLine):
        return [AddMemoryFormat(node)]
    name = binding.target
    return [InsertAfter(statement, f"{name} = {name}.contiguous(memory_format={channels_last})")]


# -- the fix ------------------------------------------------------------------------------------------


class ChannelsLastFix(Codemod):
    rule = "TC303"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        done: set[tuple[int, str]] = set()  # two models' plans may convert the same batch
        for finding in findings:
            plan: ChannelsLastPlan = finding.fix.plan
            channels_last = parse_expression(plan.channels_last, module)
            for edit in plan.edits:
                if isinstance(edit, InsertAfter):
                    key = (id(edit.statement), edit.code)
                    if key not in done:
                        editor.insert_after(edit.statement, [parse_statement(edit.code, module)])
                elif isinstance(edit, AddMemoryFormat):
                    key = (id(edit.call), "memory_format")
                    if key not in done:
                        editor.rewrite_call(edit.call, lambda node, v=channels_last: add_keyword(node, "memory_format", v))
                elif isinstance(edit, ReshapeView):
                    key = (id(edit.call), "reshape")
                    if key not in done:
                        editor.rewrite_call(edit.call, _view_to_reshape)
                else:
                    key = (id(edit.call), "to")
                    if key not in done:
                        editor.rewrite_call(edit.call, lambda node, v=channels_last: _to_memory_format(node, v))
                done.add(key)
        new = editor.apply(module)
        if torch_import_name(context.facts) is None:
            new = ensure_import(new, "import torch")
        return new


def _view_to_reshape(node: cst.Call) -> cst.Call:
    return node.with_changes(func=node.func.with_changes(attr=cst.Name("reshape")))


def _to_memory_format(node: cst.BaseExpression, channels_last: cst.BaseExpression) -> cst.Call:
    return cst.Call(
        func=cst.Attribute(value=node, attr=cst.Name("to")),
        args=[cst.Arg(channels_last, keyword=cst.Name("memory_format"),
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))],
    )
