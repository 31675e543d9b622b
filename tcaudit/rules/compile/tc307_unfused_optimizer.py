"""TC307 unfused-optimizer: Adam/AdamW/SGD on CUDA without ``fused=True`` (info).

Detects a torch.optim Adam, AdamW or SGD built for CUDA training without ``fused=``/``foreach=``.
Fix (numerics): pass ``fused=True``; declined where the fused kernel would fail or misbehave (sparse
gradients, SGD under a GradScaler present or added by TC201's fix, parameters not on the GPU yet: moved
earlier in the optimizer's function or, for a model passed in as a parameter, before every call of it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan, Situation, SituationKind
from tcaudit.rewrite.codemod import FixContext, parse_expression
from tcaudit.project.frameworks import LoopOwner, Setting, lightning_hooks, loop_owners
from tcaudit.rewrite.edits import CallEditor, ReplaceArgument, add_keyword, replace_argument
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import autocast_dtype_for
from tcaudit.script.evidence import BACKWARD_CALL, CUDA_EVIDENCE
from tcaudit.script.expressions import function_returns, literal, moves_to_device
from tcaudit.script.facts import CallSite, ScriptFacts
from tcaudit.script.pipeline import PipelineFacts, pipeline_facts
from tcaudit.script.trained_models import MODEL_CHAIN, MODEL_WRAPPERS
from tcaudit.source.syntax import call_nodes, full_name, keyword
from tcaudit.source.triggers import all_of, text_matches

_SPARSE = re.compile(r"sparse(?<!\wsparse)\s*=\s*True|sparse_grad|to_sparse")  # ``\bsparse``: left edge checked after

FUSABLE = {
    "torch.optim.Adam": "Adam",
    "torch.optim.adam.Adam": "Adam",
    "torch.optim.AdamW": "AdamW",
    "torch.optim.adamw.AdamW": "AdamW",
    "torch.optim.SGD": "SGD",
    "torch.optim.sgd.SGD": "SGD",
}


class UnfusedOptimizer(ScriptRule):
    id = "TC307"
    triggers = (all_of(r"Adam|SGD", BACKWARD_CALL, CUDA_EVIDENCE), r"adamw_torch\b|adamw_hf|adamw_torch_foreach",
                all_of(r"Adam", r"configure_optimizers"))
    # fused SGD is declined under the fp16 autocast and GradScaler TC201's fix adds (bf16 where TC305 compiles)
    after = ("TC201", "TC305")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        yield from self._framework_optimizers(facts, context)
        pipeline = pipeline_facts(facts)
        if not pipeline.owns_cuda_training:
            return
        for call in facts.calls:
            kind = FUSABLE.get(call.qualname or "")
            if kind is None or facts.in_eval(call.ctx):
                continue
            node = call.node
            if any(arg.star for arg in node.args):
                continue  # ``**opt_kwargs`` may hold fused/foreach
            if keyword(node, "fused") is not None or keyword(node, "foreach") is not None:
                continue  # either way a deliberate choice (foreach=False to save memory, fused=args.fused)
            differentiable = keyword(node, "differentiable")
            if differentiable is not None and literal(differentiable.value) is not False:
                continue  # fused kernels do not support differentiable=True
            yield self.finding(
                facts,
                node,
                f"`{kind}` on CUDA without `fused=True`",
                explanation="PyTorch defaults to the foreach (multi-tensor) implementation; the fused kernel does "
                f"the whole {kind} update in one pass per parameter group, fewer launches and memory passes."
                + (_FUSED_SGD_NAN_EVIDENCE if kind == "SGD" else ""),
                fix=self.planned_fix(
                    FixClass.NUMERICS,
                    "pass fused=True (every parameter must be a floating-point CUDA tensor)",
                    lambda call=call: _fused_plan(facts, pipeline, call, context),
                ),
            )


    def _framework_optimizers(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """Hugging Face training arguments that choose an unfused AdamW by name (``optim="adamw_torch"``),
        and the Adam/AdamW a LightningModule's ``configure_optimizers`` builds without ``fused=``: Lightning
        calls it after moving the module to its device, so the parameters are on the GPU by then."""
        values = context.values(facts)
        owners = loop_owners(facts)
        for owner in owners:
            if owner.framework != "transformers" or owner.parsed_by is not None or owner.cpu_only(values):
                continue
            setting = owner.setting(values, "optim")
            if setting.arg is None or not setting.values or not all(v.value in UNFUSED_HF for v in setting.values):
                continue
            yield self.finding(
                facts,
                setting.arg,
                f"`{owner.label}` chooses the unfused AdamW: {setting.how}",
                explanation="`adamw_torch_fused` (transformers' default since 5.0) runs the whole AdamW update in "
                "one fused kernel per parameter group.",
                fix=self.planned_fix(FixClass.NUMERICS, 'set optim="adamw_torch_fused"',
                                     lambda owner=owner, setting=setting: _hf_optim_plan(owner, setting)),
            )
        if any(owner.framework == "lightning" and owner.cpu_only(values) for owner in owners):
            return
        for fn in lightning_hooks(facts, "configure_optimizers"):
            for call in facts.calls_in(fn):
                kind = FUSABLE.get(call.qualname or "")
                if kind not in ("Adam", "AdamW") or any(arg.star for arg in call.node.args):
                    continue
                if keyword(call.node, "fused") is not None or keyword(call.node, "foreach") is not None:
                    continue
                differentiable = keyword(call.node, "differentiable")
                if differentiable is not None and literal(differentiable.value) is not False:
                    continue
                yield self.finding(
                    facts,
                    call.node,
                    f"`{kind}` built in `configure_optimizers` without `fused=True`",
                    explanation=f"Lightning builds the optimizer after moving the module to its device; the fused "
                    f"kernel does the whole {kind} update in one pass per parameter group.",
                    fix=self.planned_fix(FixClass.NUMERICS, "pass fused=True",
                                         lambda call=call: _lightning_fused_plan(facts, call)),
                )


UNFUSED_HF = ("adamw_torch", "adamw_hf", "adamw_torch_foreach")


def _hf_optim_plan(owner: LoopOwner, setting: Setting) -> ReplaceArgument:
    if setting.arg is None or literal(setting.arg.value) is ...:
        raise DeclineFix(f"`optim` is set where its value comes from ({setting.how}): change it there by hand")
    return ReplaceArgument(owner.node, setting.arg, "optim", '"adamw_torch_fused"')


_LAZY = re.compile(r"\bLazy(?:Linear|Conv\w*|BatchNorm\w*|InstanceNorm\w*)\b")


def _lightning_fused_plan(facts: ScriptFacts, call: CallSite) -> "AddFused":
    if text_matches(_SPARSE, facts.source.text):
        raise DeclineFix("the script uses sparse tensors: fused optimizers reject sparse gradients")
    if text_matches(_LAZY, facts.source.text):
        raise DeclineFix("the module has lazy layers, whose parameters take their shape and device at the first "
                         "forward, after configure_optimizers; fused=True checks them when the optimizer is built")
    return AddFused(call.node)


@dataclass(frozen=True, eq=False)
class AddFused(FixPlan):
    kind = "add-kwarg"
    call: cst.Call  # the optimizer's construction
    key: str = "fused"
    value: str = "True"


def _fused_plan(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite, context: RuleContext) -> AddFused:
    if text_matches(_SPARSE, facts.source.text):
        raise DeclineFix("the script uses sparse tensors: fused optimizers reject sparse gradients")
    reason = _why_not(facts, pipeline, call, context)
    if reason is not None:
        under_scaler = _FUSED_SGD_NAN in reason
        raise DeclineFix(reason, protects=(Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER),) if under_scaler else ())
    return AddFused(call.node)


# What applies to any script's SGD under a GradScaler; the measurement behind it is the explanation's
# (_FUSED_SGD_NAN_EVIDENCE), not the reason's: it was made on another model.
_FUSED_SGD_NAN = ("fused SGD under a GradScaler has turned a loss into NaN where foreach SGD trained (the "
                  "explanation cites the run); keeping the default foreach SGD")
_FUSED_SGD_NAN_EVIDENCE = (
    " Under a GradScaler (this script's, or the one TC201's fp16 fix adds) SGD is not fused: on an H200 (torch "
    "2.11) the naive ResNet50 fixture with fp16 autocast and a GradScaler went NaN from step 3 with fused SGD "
    "and trained with foreach SGD (benchmarks/results/h200/verify_resnet50_synthetic_fused_sgd_nan.json)."
)


def _why_not(facts: ScriptFacts, pipeline: PipelineFacts, call: CallSite, context: RuleContext) -> str | None:
    if (call.qualname or "").endswith(".SGD"):
        # Measured on an H200 with torch 2.11 (benchmarks/results/h200): the naive ResNet50 patched with
        # fp16 autocast + GradScaler trained fine with foreach SGD and went NaN from step 3 with fused SGD.
        if facts.mentions_gradscaler:
            return f"this script scales its loss with a GradScaler, and {_FUSED_SGD_NAN}"
        if context.fixable("TC201", facts) and autocast_dtype_for(
            facts, context.settings.precision, context.models, context.settings.target,
            context.compiles_trained_models(facts),
        ) == "float16":
            return f"TC201's fix adds fp16 autocast with a GradScaler, and {_FUSED_SGD_NAN}"
    owners = _parameter_owners(facts, call)
    if not owners:
        return ("could not tell whose parameters the optimizer gets, so whether they are on the GPU when it is built "
                "is unknown; fused=True checks their device then")
    for owner in owners:
        if not _moved_before(facts, pipeline, owner, call.ctx.function, call.node):
            if owner in ("self", "cls"):
                return (
                    f"the optimizer is built in the model's own `{call.ctx.function.name.value}()` from its "
                    "parameters, and this file does not show them on the GPU by then; fused=True checks the "
                    "parameters' device when the optimizer is built"
                )
            if _passed_in(facts, owner, call.ctx.function, call.node):
                function = call.ctx.function.name.value
                where = (f"`{_class_name(facts, call)}(...)`" if function == "__init__" and _class_name(facts, call)
                         else f"`{function}()`")
                return (
                    f"`{owner}` comes in as an argument of {where}, and not every call of it in this file "
                    "passes a model moved to the GPU first; fused=True checks the parameters' device when the "
                    "optimizer is built"
                )
            return (
                f"`{owner}` is not moved to the GPU before the optimizer is built (as far as this file shows); "
                "fused=True checks the parameters' device when the optimizer is built"
            )
    return None


def _class_name(facts: ScriptFacts, call: CallSite) -> str | None:
    """The class whose method builds the optimizer, by name."""
    frame = call.ctx.nearest("class")
    return frame.node.name.value if frame is not None else None  # type: ignore[attr-defined]


def _parameter_owners(facts: ScriptFacts, call: CallSite) -> list[str]:
    """``SGD(model.parameters())``, ``[{"params": model.fc.parameters()}]``, ``params = list(model.parameters())``."""
    expressions: list[cst.CSTNode] = [call.node]
    for arg in call.node.args:
        if isinstance(arg.value, (cst.Name, cst.Attribute)):
            expressions += [v for v in facts.binding_values(arg.value) if v is not arg.value]
    owners: list[str] = []
    for expression in expressions:
        for node in call_nodes(expression):
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("parameters", "named_parameters"):
                name = full_name(node.func.value)
                if name is None:
                    return []
                owner = _bound_prefix(facts, name, call.ctx.function)
                if owner is None:
                    return []
                if owner not in owners:
                    owners.append(owner)
    return owners


def _bound_prefix(facts: ScriptFacts, name: str, function: cst.FunctionDef | None) -> str | None:
    """``model.module.fc`` → ``model`` (the longest prefix the file assigns, or a parameter of the function
    that builds the optimizer)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if facts.bindings_of(candidate):
            return candidate
    return parts[0] if _parameter_index(function, parts[0]) is not None else None


def _moved_before(
    facts: ScriptFacts, pipeline: PipelineFacts, owner: str, function: cst.FunctionDef | None, node: cst.CSTNode,
    depth: int = 0,
) -> bool:
    """A device move of the model earlier in ``function`` than ``node`` (the optimizer's construction):
    ``model.cuda()``, ``model = Net().to(device)``, ``model = DDP(model.cuda())``, ``model = build().cuda()``
    or a factory of this file that returns a moved model. Where the model is a parameter of the function
    (``def train_model(model, ...)``) that nothing rebinds first, every call of the function in this file
    must pass a model moved before the call (followed through up to three callers)."""
    built = _start(facts, node)
    for call in facts.calls:
        if call.ctx.function is not function or _start(facts, call.node) >= built:
            continue
        if call.method in ("cuda", "to") and moves_to_device(call) and call.receiver_name == owner:
            return True
    for binding in facts.bindings_of(owner):
        if binding.ctx.function is not function or _start(facts, binding.value) >= built:
            continue
        if _value_moves(facts, pipeline, binding.value, 0):
            return True
    if depth >= 3 or not _passed_in(facts, owner, function, node):
        return False
    passed = _arguments_passed(facts, function, owner)
    return bool(passed) and all(
        argument is not None and _moved_before(facts, pipeline, argument, caller.ctx.function, caller.node, depth + 1)
        for caller, argument in passed
    )


def _passed_in(facts: ScriptFacts, name: str, function: cst.FunctionDef | None, node: cst.CSTNode) -> bool:
    """``name`` is a parameter of the function that nothing in it rebinds before ``node``."""
    if _parameter_index(function, name) is None:
        return False
    before = _start(facts, node)
    return not any(
        b.ctx.function is function and _start(facts, b.value) < before for b in facts.bindings_of(name)
    )


def _parameter_index(function: cst.FunctionDef | None, name: str) -> int | None:
    """Where ``name`` sits among the function's positional parameters (-1: keyword-only), None if it is
    none of them."""
    if function is None:
        return None
    positional = [*function.params.posonly_params, *function.params.params]
    for index, param in enumerate(positional):
        if param.name.value == name:
            return index
    if any(param.name.value == name for param in function.params.kwonly_params):
        return -1
    return None


def _arguments_passed(
    facts: ScriptFacts, function: cst.FunctionDef, parameter: str
) -> list[tuple[CallSite, str | None]]:
    """Each call of a plain function of this file with the name it passes for ``parameter`` (None where
    that cannot be read: a ``*args``, an expression). Empty where the callers cannot all be seen: a method,
    a name defined twice, or the function used other than by calling it (``mp.spawn(train, ...)``)."""
    name = function.name.value
    if len(facts.functions_by_name.get(name, [])) != 1 or any(
        frame.kind == "class" for frame in _frames_of(facts, function)
    ):
        return []
    calls = [c for c in facts.calls if isinstance(c.node.func, cst.Name) and c.node.func.value == name]
    # Every other mention of the name (a callback, an alias) may call it with anything.
    if facts.mentions(name) != len(calls) + 1:
        return []
    index = _parameter_index(function, parameter)
    out: list[tuple[CallSite, str | None]] = []
    for call in calls:
        if any(arg.star for arg in call.node.args):
            out.append((call, None))
            continue
        given = keyword(call.node, parameter, index)
        value = given.value if given is not None else None  # None: the default, no model of the caller's
        dotted = full_name(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        out.append((call, dotted))
    return out


def _frames_of(facts: ScriptFacts, function: cst.FunctionDef):
    """The lexical frames around a function's definition (its class, the functions it is nested in)."""
    for node, ctx in facts.functions:
        if node is function:
            return list(ctx.chain())
    return []


def _start(facts: ScriptFacts, node: cst.CSTNode) -> tuple[int, int]:
    position = facts.position(node).start
    return position.line, position.column


def _value_moves(facts: ScriptFacts, pipeline: PipelineFacts, value: cst.BaseExpression, depth: int) -> bool:
    if depth > 3:
        return False
    expr = value
    while isinstance(expr, cst.Call):
        site = pipeline.call_site(expr) or CallSite(expr, None, None, facts.module_frame, None)
        if site.method in ("cuda", "to") and moves_to_device(site):
            return True
        qual = facts.qualname(expr.func) or ""
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODEL_CHAIN:
            expr = expr.func.value
            continue
        if qual in MODEL_WRAPPERS or qual.endswith(("DistributedDataParallel", "DataParallel")):
            positional = [a for a in expr.args if a.keyword is None and not a.star]
            if not positional:
                return False
            expr = positional[0].value
            continue
        dotted = full_name(expr.func)
        if dotted and "." not in dotted and dotted not in pipeline.class_names:
            return any(
                _value_moves(facts, pipeline, returned, depth + 1)
                for fn in facts.functions_by_name.get(dotted, [])
                for returned in function_returns(fn)
            )
        return False
    return False


# -- the fix ------------------------------------------------------------------------------------------


class UnfusedOptimizerFix(Codemod):
    rule = "TC307"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = CallEditor()
        for finding in findings:
            plan = finding.fix.plan
            if isinstance(plan, ReplaceArgument):  # ``optim="adamw_torch"`` of Hugging Face training arguments
                index = next(i for i, arg in enumerate(plan.call.args) if arg is plan.argument)
                value = parse_expression(plan.value, module)
                editor.rewrite_call(plan.call, lambda node, i=index, v=value: replace_argument(node, i, v))
                continue
            value = parse_expression(plan.value, module)
            editor.rewrite_call(plan.call, lambda node, k=plan.key, v=value: add_keyword(node, k, v))
        return editor.apply(module)
