"""TC305 not-compiled: a trained model never goes through ``torch.compile`` (info).

Detects a CUDA training script that compiles, scripts or exports nothing through torch's APIs (a legacy
TorchScript flag that TC304's fix deletes does not count), one finding per model an optimizer trains
that is not compiled in place already. Fix (structural, ``fix --compile``), per model: ``model.compile()``
in place, on CUDA only, after the statements that build and prepare that model, before a DDP or
DataParallel wrap (under DataParallel only with one visible GPU); declined for a model whose forward is
torch.nn's own, one built in a loop, a TorchScript module, or FSDP.

Where the model audit finds the step small (``PipelineFacts.audited_small_step``: the trained models'
forwards modelled within ``SMALL_STEP_MS``, or each launch-bound), the mode is chosen for all the file's
models at once: ``model.compile(mode="reduce-overhead")`` (CUDA graphs) plus
``torch.compiler.cudagraph_mark_step_begin()`` first in every loop that calls them, where
``tcaudit/rules/compile/cuda_graphs.py`` finds the step graph-safe; the default mode otherwise, with the
failed check in the explanation and the fix's description. The message names the mode in its code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import MESSAGE_LIMIT, DeclineFix, Finding, FixClass, FixPlan
from tcaudit.model_profile import SMALL_STEP_MS
from tcaudit.rewrite.codemod import FixContext, StatementEditor, ensure_import, parse_statement, torch_import_name
from tcaudit.project.frameworks import LoopOwner, Setting, lightning_forward, lightning_module_class, loop_owners
from tcaudit.rewrite.edits import (
    AddKeyword,
    KeywordPlan,
    ReplaceArgument,
    add_torch_import,
    apply_keyword_edits,
    contains,
)
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.rules.compile.cuda_graphs import MARK_STEP, GraphSafety, cuda_graph_safety
from tcaudit.script.amp import gradient_penalty_call
from tcaudit.script.devices import device_expression
from tcaudit.script.distributed import (
    callee_type,
    distributed_facts,
    innermost_loop,
    is_dataparallel,
    is_ddp,
    is_fsdp,
)
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import literal
from tcaudit.script.facts import Binding, CallSite, ScriptFacts
from tcaudit.script.guards import training_phase
from tcaudit.script.model_classes import callee_class, defines_no_forward, recurrent_layer, torch_forward
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.script.trained_models import ModelSite, from_loop_or_comprehension, is_prep, strip_chain
from tcaudit.source.syntax import call_nodes, full_name, names_in, parent_map
from tcaudit.source.triggers import all_of

# Any of these means the script already compiles, scripts or exports something on purpose.
COMPILERS = ("torch.compile", "torch.jit", "torch._dynamo", "torch._C._jit", "torch.export", "torch._inductor")


class NotCompiled(ScriptRule):
    id = "TC305"
    triggers = (all_of(BACKWARD_CALL, CUDA_EVIDENCE), r"TrainingArguments|SFTConfig|HfArgumentParser",
                all_of(r"LightningModule", r"\.fit\("))
    after = ("TC304",)  # the legacy TorchScript flags TC304's fix deletes are not the script's compiling

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            yield from self._hf_arguments(facts, context)
            yield from self._lightning_modules(facts, context)
        if not pipeline.owns_cuda_training or _compiles_on_purpose(facts, context):
            return
        compiled = _compiled_in_place(facts)
        trained = _trained_models(facts, pipeline)
        models = [(name, site) for name, site in trained if name not in compiled]
        planned: set[tuple[int, str]] = set()  # (the statement it goes after, what is inserted)
        attempts = []
        for name, site in models:
            node = site.construction if site is not None else facts.training_steps[0].backward.node
            # In place (nn.Module.compile): ``model = torch.compile(model)`` would prefix every state_dict
            # key with ``_orig_mod.`` and break loading checkpoints.
            plan = _attempt(lambda: _compile_plan(facts, name, f"{name}.compile()", facts.position(node).end.line))
            if isinstance(plan, CompileInPlace):
                if plan.compiled in compiled:
                    continue  # ``model.compile()`` before ``ddp_model = DDP(model)``: compiled already
                key = (id(plan.after), plan.statement)
                if key in planned:
                    continue  # ``opt1 = SGD(model...)``, ``opt2 = SGD(ddp_model...)``: one model, one compile
                planned.add(key)
            attempts.append((name, site, node, plan))
        graphs = _graph_choice(facts, context, pipeline, attempts)
        for name, site, node, plan in attempts:
            if isinstance(plan, CompileInPlace) and graphs is not None and graphs.safe:
                plan = replace(
                    plan, code=f"{name}.compile({REDUCE_OVERHEAD})",
                    statement=plan.statement.replace(".compile()\n", f".compile({REDUCE_OVERHEAD})\n"),
                    mark_steps=graphs.mark_steps,
                )
            code = plan.code if isinstance(plan, CompileInPlace) else f"{name}.compile()"
            profile = pipeline.profile_of(site, context.models) if site is not None else None
            subject = f"trained model `{name}`"
            explanation = (
                f"`{code}` (in place, so checkpoint keys stay the same) fuses its elementwise ops and cuts Python "
                "overhead" + context.cost(self.spec, "compiled")
                + (f" ({profile.describe()})" if profile is not None else "")
                + (f"; one of {len(trained)} models trained here, each compiled on its own" if len(trained) > 1 else "")
                + "." + _graph_note(graphs, self.spec, context)
            )
            suffix = "" if graphs is None else " (a small step)" if graphs.safe else " (a small step; no CUDA graphs)"
            message = f"{subject} is never compiled: `{code}`"
            if len(message + suffix) <= MESSAGE_LIMIT:  # the mode is in the code; the why, in the explanation
                message += suffix
            yield self.finding(
                facts,
                node,
                message,
                explanation=explanation,
                fix=self.planned_fix(
                    FixClass.STRUCTURAL,
                    _fix_description(graphs),
                    lambda plan=plan: _made(plan),
                    option="compile", context=context,
                ),
            )


    def _hf_arguments(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """Hugging Face training arguments that leave ``torch_compile`` off: the Trainer compiles the model
        itself when it is on. Fixed under ``fix --compile`` as ``torch_compile=torch.cuda.is_available()``."""
        values = context.values(facts)
        for owner in loop_owners(facts):
            if owner.framework != "transformers" or owner.cpu_only(values):
                continue
            setting = owner.setting(values, "torch_compile")
            if not setting.values or any(v.value is not False for v in setting.values):
                continue
            how = "`torch_compile` is not set" if setting.source == "default" else setting.how
            yield self.finding(
                facts,
                owner.node.func,
                f"`{owner.label}` never compiles the model: {how}",
                explanation="With `torch_compile=True` the Trainer passes the model through `torch.compile`, which "
                "fuses its elementwise ops and cuts Python overhead" + context.cost(self.spec, "compiled") + ".",
                fix=self.planned_fix(FixClass.STRUCTURAL, "set torch_compile=torch.cuda.is_available()",
                                     lambda owner=owner, setting=setting: _hf_compile_plan(owner, setting),
                                     option="compile", context=context),
            )


    def _lightning_modules(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """LightningModules of this file that a Lightning ``Trainer`` of this file fits (``trainer.fit(model,
        ...)``) and nothing compiles. Fixed under ``fix --compile`` as TC305 compiles a script's model: in
        place (``model.compile()``, Lightning calls the module's compiled forward from ``training_step``, and
        the checkpoint keys stay the same), on CUDA, after the statement that builds it."""
        values = context.values(facts)
        trainers = {id(o.node) for o in loop_owners(facts)
                    if o.framework == "lightning" and o.label == "Trainer" and not o.cpu_only(values)}
        if not trainers or _compiles_on_purpose(facts, context):
            return
        compiled = _compiled_in_place(facts)
        seen: set[str] = set()
        for call in facts.calls:
            if call.method != "fit" or call.receiver is None or not _fits_with(facts, call.receiver, trainers):
                continue
            given = call.arg("model", 0)
            if given is None:
                continue
            name = full_name(given) if isinstance(given, (cst.Name, cst.Attribute)) else None
            if name is not None and (name in compiled or name in seen):
                continue
            built = [v for v in facts.binding_values(given) if isinstance(v, cst.Call)] if name else [given]
            classes = [lightning_module_class(facts, v) for v in built]
            if not built or not all(classes):
                continue  # not a LightningModule this file builds (a compiled one, one from a factory)
            seen.add(name or "")
            code = f"{name or 'model'}.compile()"
            explanation = (
                f"`{code}` (in place: Lightning calls the compiled forward from `training_step`, and checkpoint keys "
                "stay the same; Lightning's docs pass `torch.compile(model)` to `fit`, which it unwraps to the same) "
                "fuses its elementwise ops and cuts Python overhead" + context.cost(self.spec, "compiled") + "."
            )
            label = f"`{name}`" if name else f"`{classes[0].name.value}(...)`"
            yield self.finding(
                facts,
                given,
                f"the LightningModule {label} given to `fit` is never compiled: `{code}`",
                explanation=explanation,
                fix=self.planned_fix(
                    FixClass.STRUCTURAL, "compile the LightningModule in place on CUDA (tcaudit fix --compile)",
                    lambda name=name, classes=classes, given=given: _lightning_plan(facts, name, classes, given),
                    option="compile", context=context,
                ),
            )


def _fits_with(facts: ScriptFacts, receiver: cst.BaseExpression, trainers: set[int]) -> bool:
    """``receiver`` (of a ``.fit(...)``) is one of the Lightning ``Trainer(...)`` calls ``trainers``, or a name
    bound only to them."""
    values = facts.binding_values(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else [receiver]
    calls = [v for v in values if isinstance(v, cst.Call)]
    return bool(calls) and all(id(v) in trainers for v in calls)


def _lightning_plan(facts: ScriptFacts, name: str | None, classes, given: cst.BaseExpression) -> "CompileInPlace":
    without = [cls.name.value for cls in classes if not lightning_forward(facts, cls)]
    if without:
        raise DeclineFix(
            f"`{without[0]}` defines no `forward`: its `training_step` calls its layers itself, and compiling the "
            "module compiles only `forward`; compile the submodules `training_step` runs by hand (`self.net.compile()`)"
        )
    if name is None:
        raise DeclineFix(
            f"the LightningModule is built inside the `fit(...)` call (`{facts.code(given)}`): bind it "
            "to a name first (`model = ...`), then `model.compile()` before `fit`"
        )
    return _compile_plan(facts, name, f"{name}.compile()", facts.position(given).end.line)


def _hf_compile_plan(owner: LoopOwner, setting: Setting) -> KeywordPlan:
    if owner.parsed_by is not None:
        raise DeclineFix(f"the training arguments come from the command line (`{owner.parsed_by}`): pass "
                         "`--torch_compile`")
    if setting.source == "command line":
        flag = setting.flag or "--torch_compile"
        raise DeclineFix(f"the value comes from the command line ({setting.how}): pass `{flag}`")
    if setting.arg is not None and literal(setting.arg.value) is ...:
        raise DeclineFix(f"`torch_compile` is set where its value comes from ({setting.how}): change it there by hand")
    if owner.call.has_star_kwargs:
        raise DeclineFix("the call passes `**kwargs`, which may hold torch_compile; a second one would be a TypeError")
    torch_local = torch_import_name(owner.facts)
    code = f"{torch_local or 'torch'}.cuda.is_available()"
    imports = () if torch_local else ("torch",)
    if setting.arg is not None:
        return ReplaceArgument(owner.node, setting.arg, "torch_compile", code, imports)
    return AddKeyword(owner.node, "torch_compile", code, imports)


# -- the mode ---------------------------------------------------------------------------------------------

REDUCE_OVERHEAD = 'mode="reduce-overhead"'


def _graph_choice(facts: ScriptFacts, context: RuleContext, pipeline, attempts) -> GraphSafety | None:
    """None where the model audit did not find the step small (launch-bound, or its forwards modelled
    within SMALL_STEP_MS): the default mode. Otherwise whether the compiled models' step can run as
    CUDA graphs, and where the markers go."""
    if not attempts or not pipeline.audited_small_step(context.models):
        return None
    if not all(isinstance(plan, CompileInPlace) for _, _, _, plan in attempts):
        return GraphSafety(False, "not every trained model can be compiled")
    return cuda_graph_safety(facts, [(name, site.construction if site else None) for name, site, _, _ in attempts])


def _graph_note(graphs: GraphSafety | None, spec, context: RuleContext) -> str:
    if graphs is None:
        return ""
    if graphs.safe:
        return (
            f" The model audit found the step small (its forwards model within {SMALL_STEP_MS:g} ms, or each is "
            "launch-bound), so launches and Python cost about as much as its math: CUDA graphs "
            f"(`{REDUCE_OVERHEAD}`) replay each compiled forward and backward with one launch"
            + context.cost(spec, "graphs")
            + "; every loop that calls the model starts with `torch.compiler.cudagraph_mark_step_begin()`, so one "
            "iteration's outputs and gradients stay valid until the next iteration begins."
        )
    return (
        " The model audit found the step small, where CUDA graphs (`mode=\"reduce-overhead\"`) "
        f"would pay most, but they are not safe here: {graphs.reason}; the default mode is kept."
    )


def _fix_description(graphs: GraphSafety | None) -> str:
    if graphs is not None and graphs.safe:
        return f"compile the model in place on CUDA with CUDA graphs ({REDUCE_OVERHEAD}; a small step)"
    if graphs is not None:
        return f"compile the model in place on CUDA (default mode: CUDA graphs unsafe, {graphs.reason})"
    return "compile the model in place on CUDA (tcaudit fix --compile)"


def _trained_models(facts: ScriptFacts, pipeline) -> list[tuple[str, ModelSite | None]]:
    """Every model an optimizer trains (a GAN's two nets, a trainer's student and critic), with the call
    that builds it where one is found. A model no optimizer names (a frozen teacher, an evaluator) is
    not compiled: this rule is about the training step, and such a model often comes from a checkpoint
    or runs under other shapes. Without any optimizer, the first model-like name, as before."""
    names = pipeline.optimized_model_names or pipeline.trained_model_names[:1] or ["model"]
    first_site: dict[str, ModelSite] = {}
    for site in pipeline.trained_models:
        first_site.setdefault(site.name, site)
    return [(name, first_site.get(name)) for name in names]


def _attempt(plan) -> "CompileInPlace | DeclineFix":
    try:
        return plan()
    except DeclineFix as exc:
        return exc


def _made(plan: "CompileInPlace | DeclineFix") -> "CompileInPlace":
    """The plan ``_attempt`` made; its decline raised again, for ``planned_fix`` to report."""
    if isinstance(plan, DeclineFix):
        raise plan
    return plan


@dataclass(frozen=True, eq=False)
class CompileInPlace(FixPlan):
    kind = "insert-after"
    after: cst.CSTNode  # the statement the compile goes after
    line: int
    target: str  # the trained model's name
    code: str  # ``model.compile()``, as the message says
    statement: str  # what is inserted: the compile under its device condition
    compiled: str  # the module compiled: the model, the module inside its wrapper, or the name wrapped
    # With CUDA graphs: the first statement of each loop body that calls a compiled model, where
    # ``torch.compiler.cudagraph_mark_step_begin()`` goes (shared by the file's models, inserted once).
    mark_steps: tuple[cst.CSTNode, ...] = ()


def _compile_plan(facts: ScriptFacts, name: str, code: str, line: int) -> CompileInPlace:
    penalty = gradient_penalty_call(facts)
    if penalty is not None:
        # A compiled module's backward cannot be differentiated again: the penalty's second backward
        # raises ("torch.compile with aot_autograd does not currently support double backward").
        raise DeclineFix(
            f"the script differentiates gradients again (autograd.grad with create_graph=True, line "
            f"{facts.line_of(penalty.node)}), which a compiled model does not support; compile by hand what "
            "the gradient penalty does not run through"
        )
    torch_name = torch_import_name(facts) or "torch"
    compiled, after, condition = _plan(facts, name, torch_name)
    if isinstance(after, cst.If) and facts.code(after.test) == condition:
        # ``if device == "cuda": model = model.cuda()`` gains the compile in the same block.
        return CompileInPlace(after.body.body[-1], line, name, code, f"{compiled}.compile()\n", _unwrapped(compiled))
    return CompileInPlace(after, line, name, code, f"if {condition}:\n    {compiled}.compile()\n", _unwrapped(compiled))


def _compiles_on_purpose(facts: ScriptFacts, context: RuleContext) -> bool:
    """Whether the script compiles, scripts or exports anything through torch's APIs (also behind a
    flag): then compiling is the author's decision, for every model. The private TorchScript flags
    TC304's fix deletes do not count."""
    deleted = {
        id(f.fix.plan.call.func) for f in context.fixable("TC304", facts) if isinstance(getattr(f.fix.plan, "call", None), cst.Call)
    }
    return any(id(ref.node) not in deleted for ref in facts.references_to(*COMPILERS))


def _compiled_in_place(facts: ScriptFacts) -> set[str]:
    """The names ``nn.Module.compile()`` is called on (``model.compile()``, ``model.module.compile()``
    inside a DDP wrapper → ``model``): those models are compiled, the others of the script may not be."""
    return {_unwrapped(call.receiver_name) for call in facts.calls if call.method == "compile" and call.receiver_name}


def _unwrapped(name: str) -> str:
    return name.removesuffix(".module")


# -- the plan -------------------------------------------------------------------------------------------


def _plan(facts: ScriptFacts, name: str, torch_name: str, depth: int = 0) -> tuple[str, cst.CSTNode, str]:
    """(what to compile, the statement to put the compile after, the device condition)."""
    bindings = [b for b in facts.bindings_of(name) if not facts.in_eval(b.ctx)]
    if not bindings:
        raise DeclineFix(f"could not find where the trained model `{name}` is built")
    # ``model = Net(); model.load_state_dict(torch.load(...))`` after the loop rebuilds the model for
    # evaluation: compiling there would leave the training uncompiled (and compile after training).
    training = [b for b in bindings if b.statement is None or training_phase(facts, b.ctx, b.statement.node) != "after"]
    if not training:
        raise DeclineFix(f"`{name}` is only built after its training loop here; compile it by hand where it trains")
    bindings = training
    replicated = _check_wraps(facts, name)
    builds, wraps_of_other = [], []
    for binding in bindings:
        kind, inner = _classify(facts, binding, name)
        if kind == "build":
            builds.append(binding)
        elif kind == "wrap-other":
            wraps_of_other.append((binding, inner))
        elif kind == "wrap-build":
            builds.append(binding)
            # ``model = DataParallel(Net()).cuda()``: replicated as well, though no name goes in.
            replicated = replicated or _wrap_kind(facts, strip_chain(binding.value)) == "dataparallel"
    if wraps_of_other and not builds:
        # ``ddp_model = DDP(model)``: compile ``model`` before it is wrapped.
        inners = {inner for _, inner in wraps_of_other}
        if len(inners) != 1 or depth > 2:
            raise DeclineFix(f"`{name}` wraps different models on different paths; compile it by hand")
        compiled, after, condition = _plan(facts, inners.pop(), torch_name, depth + 1)
        if replicated and not condition.endswith(_ONE_DEVICE.format(torch=torch_name)):
            condition += _ONE_DEVICE.format(torch=torch_name)
        return compiled, after, condition
    if not builds:
        raise DeclineFix(f"could not find the statement that builds `{name}`")
    for binding in builds:
        _check_build(facts, binding, name)
    pipeline = pipeline_facts(facts)
    recurrent = [
        layer for layer in (recurrent_layer(facts, pipeline.constructions(b.value)) for b in builds) if layer is not None
    ]
    if recurrent and len(recurrent) == len(builds):
        raise DeclineFix(
            f"`{name}` computes in `{recurrent[0]}`: cuDNN's recurrent kernels, which torch.compile does not fuse; "
            f"compiling the rest made a word LM slower ({_RECURRENT_COST})"
        )
    functions = {id(b.ctx.function) for b in builds}
    if len(functions) != 1:
        raise DeclineFix(f"`{name}` is built in several functions; compile it by hand where it is used")
    after, block = _common_statement(facts, [b.statement.node for b in builds])
    in_wrap = [b for b in builds if _classify(facts, b, name)[0] == "wrap-build"]
    if in_wrap:
        if len(builds) != 1:
            raise DeclineFix(f"`{name}` is built inside a DDP wrap on one path only; compile it by hand")
        target = f"{name}.module"
    else:
        target = name
        after = _after_prep(facts, block, after, name)
    condition = _device_condition(facts, name, builds, block, after, torch_name)
    if recurrent:
        # Built recurrent on some paths only (``--model LSTM`` or ``Transformer``): compile where it is not.
        condition += f" and not any(isinstance(m, {torch_name}.nn.RNNBase) for m in {target}.modules())"
    if replicated:
        condition += _ONE_DEVICE.format(torch=torch_name)
    return target, after, condition


# -- what each binding does ------------------------------------------------------------------------------


def _wrap_kind(facts: ScriptFacts, call: cst.Call) -> str | None:
    dotted = full_name(call.func)
    qual = callee_type(facts, CallSite(call, dotted, facts.qualname(call.func), facts.module_frame, None))
    if is_ddp(qual):
        return "ddp"
    if is_dataparallel(qual):
        return "dataparallel"
    if is_fsdp(qual):
        return "fsdp"
    return None


def _classify(facts: ScriptFacts, binding: Binding, name: str) -> tuple[str, str | None]:
    """``build`` (a new model, or another name's), ``prep`` (``model = model.cuda()``), ``wrap-self``
    (``model = DDP(model)``), ``wrap-other`` (``ddp = DDP(model)``: the inner name), ``wrap-build``
    (``model = DDP(Net().cuda())``), ``other``."""
    expr = strip_chain(binding.value)
    kind = _wrap_kind(facts, expr) if isinstance(expr, cst.Call) else None
    if kind == "fsdp":
        _decline_fsdp()
    if kind is not None:
        positional = [a.value for a in expr.args if a.keyword is None and not a.star]
        if not positional:
            return "other", None
        inner = strip_chain(positional[0])
        inner_name = full_name(inner) if isinstance(inner, (cst.Name, cst.Attribute)) else None
        if inner_name == name:
            return "wrap-self", None
        if inner_name is not None:
            return "wrap-other", inner_name
        return "wrap-build", None
    dotted = full_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if dotted == name:
        return "prep", None
    if _converts_in_place(facts, expr, name):
        return "prep", None
    if isinstance(expr, cst.Name) and expr.value == "None":
        return "other", None
    return "build", None


# torch functions that take a model and hand back the same model with some layers swapped (the
# torchvision classification reference: ``model = nn.SyncBatchNorm.convert_sync_batchnorm(model)``
# under --sync-bn): the model's own forward still runs, so they are preparation, not a new build.
_IN_PLACE_CONVERSIONS = frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm"})


def _converts_in_place(facts: ScriptFacts, expr: cst.BaseExpression, name: str) -> bool:
    if not isinstance(expr, cst.Call) or facts.qualname(expr.func) not in _IN_PLACE_CONVERSIONS:
        return False
    positional = [a.value for a in expr.args if a.keyword is None and not a.star]
    return bool(positional) and full_name(strip_chain(positional[0])) == name


def _check_wraps(facts: ScriptFacts, name: str) -> bool:
    """Declines FSDP; True when DataParallel wraps the model (or a part of it, ``model.features``)."""
    replicated = False
    for wrap in distributed_facts(facts).wraps:
        if wrap.kind == "ddp":
            continue
        args = [a.value for a in wrap.call.node.args if a.keyword is None and not a.star]
        inner = full_name(strip_chain(args[0])) if args else None
        if wrap.target == name or inner == name or (inner or "").startswith(f"{name}."):
            if wrap.kind == "fsdp":
                _decline_fsdp()
            replicated = True
    return replicated


# ``nn.Module.compile()`` stores the compiled ``_call_impl`` bound to this module, and DataParallel's
# replicas copy it: on more than one GPU every replica would run the original's parameters. With one
# visible GPU DataParallel calls the module itself, so the compile is guarded by the device count.
_ONE_DEVICE = " and {torch}.cuda.device_count() == 1"


def _decline_fsdp() -> None:
    raise DeclineFix("the model is sharded with FSDP: compile its blocks before sharding, by hand")


def _check_build(facts: ScriptFacts, binding: Binding, name: str) -> None:
    if innermost_loop(binding.ctx) is not None:
        raise DeclineFix(f"`{name}` is built in a loop; compile each model by hand")
    statement = binding.statement
    if statement is None or not isinstance(statement.node, cst.SimpleStatementLine):
        raise DeclineFix(f"`{name}` is built in a one-line suite; split the line first")
    if from_loop_or_comprehension(facts, binding.value):
        raise DeclineFix(f"`{name}` is one of several models built in a loop or a comprehension; "
                         "compile each by hand")
    for call in call_nodes(binding.value):
        qual = facts.qualname(call.func) or ""
        if qual.startswith("torch.jit"):
            raise DeclineFix(f"`{name}` is a TorchScript module; torch.compile does not take ScriptModules")
    pipeline = pipeline_facts(facts)
    classes = facts.classes_by_name
    for call in pipeline.constructions(binding.value):
        cls = classes.get(callee_class(call))
        if cls is not None and any(
            (full_name(base.value) or "").endswith("ScriptModule") for base in cls.bases
        ):
            raise DeclineFix(f"`{name}` is a TorchScript module; torch.compile does not take ScriptModules")
        native = torch_forward(facts, call)
        if native is not None:
            raise DeclineFix(
                f"`{name}` is a `{native}`, whose forward is torch's own: `{name}.compile()` compiles "
                f"nothing there (seen on torch 2.11), and `{name} = torch.compile({name})` would prefix "
                "its checkpoint keys with `_orig_mod.`; compile it by hand"
            )
        if cls is not None and defines_no_forward(facts, cls):
            raise DeclineFix(
                f"`{name}` is a `{cls.name.value}`, which defines no `forward`: the script calls its other "
                f"methods, and `{name}.compile()` compiles only `forward`; compile those methods or its "
                "submodules by hand"
            )


# Measured on one H200, torch 2.11 (benchmarks/realworld/results.json, word_lm): the patched LSTM LM.
_RECURRENT_COST = "H200, LSTM 650x2, batch 64: 4,881 samples/s after `fix`, 3,520 after `fix --compile`"


# -- where the compile goes --------------------------------------------------------------------------------


def _common_statement(facts: ScriptFacts, statements: list[cst.CSTNode]) -> tuple[cst.CSTNode, list]:
    """The statement of the innermost block holding all ``statements`` that contains the last of them
    (``if pretrained: model = A() else: model = B()`` → the ``if``), and that block."""
    parents = parent_map(facts.module)
    chains = []
    for statement in statements:
        chain = []  # (block body, statement in it), innermost first
        node: cst.CSTNode | None = statement
        while node is not None:
            parent = parents.get(id(node))
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                chain.append((parent, node))
            node = parent
        chains.append(list(reversed(chain)))
    last = max(range(len(statements)), key=lambda i: facts.line_of(statements[i]))
    depth = 0
    while all(len(c) > depth for c in chains) and len({id(c[depth][0]) for c in chains}) == 1:
        depth += 1
    if depth == 0:
        raise DeclineFix("the model is built in unrelated places; compile it by hand")
    block, after = chains[last][depth - 1]
    return after, list(block.body)


def _after_prep(facts: ScriptFacts, block: list, after: cst.CSTNode, name: str) -> cst.CSTNode:
    """The last statement after ``after`` in its block that still prepares the model (``model.cuda()``,
    ``model = model.to(device)``, ``model.load_state_dict(...)``), stopping at the first statement
    that uses the model otherwise (an optimizer, a DDP wrap, the training loop)."""
    index = next(i for i, item in enumerate(block) if item is after)
    for statement in block[index + 1:]:
        mentions = name in names_in(statement)
        if not mentions:
            continue
        if is_prep(statement, name):
            after = statement
            continue
        break
    return after


# -- on which device -------------------------------------------------------------------------------------


def _device_condition(
    facts: ScriptFacts, name: str, builds: list[Binding], block: list, after: cst.CSTNode, torch_name: str
) -> str:
    """The condition the compile runs under: :func:`device_expression` over the statements from the
    model's build to ``after``, with the script's own ``if`` around the model's moves as its guard."""
    statements = [b.statement.node for b in builds]
    first = min(i for i, item in enumerate(block) if any(contains(item, s) for s in statements))
    last = next(i for i, item in enumerate(block) if item is after)
    # ``if device == "cuda": model = model.cuda()`` (or ``if args.cuda:``): the script's own test.
    tests = {
        facts.code(item.test)
        for item in block[first:last + 1]
        if isinstance(item, cst.If) and is_prep(item, name)
        and any(isinstance(c.func, cst.Attribute) and c.func.attr.value in ("cuda", "to") for c in call_nodes(item.body))
    }
    guard = tests.pop() if len(tests) == 1 and "\n" not in next(iter(tests)) else None
    return device_expression(facts, [*statements, *block[first:last + 1]], "condition", torch_name, guard=guard)


# -- the fix ------------------------------------------------------------------------------------------


class NotCompiledFix(Codemod):
    rule = "TC305"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        # Hugging Face training arguments (``torch_compile=...``): only in a file that owns no loop of its own,
        # so never beside an in-place compile (the check reports one or the other).
        options = [f.fix.plan for f in findings if isinstance(f.fix.plan, (AddKeyword, ReplaceArgument))]
        if options:
            new = apply_keyword_edits(module, options)
            return add_torch_import(new, "import torch") if any("torch" in p.imports for p in options) else new
        editor = StatementEditor()
        torch_local = torch_import_name(context.facts)
        torch_name = torch_local or "torch"
        marked: set[int] = set()
        for finding in findings:  # one per trained model, each with its own place (the check made them distinct)
            plan: CompileInPlace = finding.fix.plan
            editor.insert_after(plan.after, [parse_statement(plan.statement, module)])
            for first in plan.mark_steps:
                if id(first) not in marked:
                    marked.add(id(first))
                    editor.insert_before(first, [parse_statement(f"{torch_name}.{MARK_STEP}\n", module)])
        new = editor.apply(module)
        if torch_local is None:
            new = ensure_import(new, "import torch")
        return new
