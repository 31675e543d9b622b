"""TC201 missing-autocast: a training step whose forward and loss run in fp32 on a GPU.

Detects each function (or the module level) holding training steps that no autocast covers, in a
script that runs on an accelerator and updates its parameters, and recommends bf16 autocast or fp16
autocast with a GradScaler (``precision`` in the configuration, else by model and optimizer).

Fix (numerics): wrap each step's forward and loss statements in ``torch.autocast(device_type,
dtype=..., enabled=...)``; for fp16 also create a ``torch.amp.GradScaler`` (before the step's
outermost loop, or in ``__init__`` for a method without a loop), scale each backward, route each
``optimizer.step()`` through the scaler and call ``scaler.update()`` after the last one. Everything
the fix edits is found at detection and held in a :class:`WrapAutocast` plan.

Other rules ask what this fix will do: TC208 asks :func:`statements_planned_for_autocast` which
statements it puts under autocast, and TC303 runs this rule's check to learn whether autocast comes
(it reports channels_last on the naive fp32 script because autocast comes with it).
:class:`GradScalerPlan`, :func:`plan_grad_scaler` and :class:`AutocastEditor` (shared with TC204) are in
:mod:`tcaudit.rewrite.autocast`; the device-type expression at a step is :func:`tcaudit.script.devices.device_expression`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, Fix, FixClass, FixPlan, FollowsFix, Severity, Situation, SituationKind
from tcaudit.gpus import Target
from tcaudit.rewrite.autocast import AutocastEditor, DevicePlanner, DeviceVariable, GradScalerPlan, plan_grad_scaler
from tcaudit.rewrite.codemod import FixContext, ensure_import, parse_statement, torch_import_name
from tcaudit.rules.advice import held_back, little_to_gain
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.amp import (
    BRANCH,
    PARTIAL,
    UNCOVERED,
    AmpFacts,
    ForwardStatement,
    StepCoverage,
    amp_facts,
    unsafe_kind,
)
from tcaudit.script.facts import CallSite, ScriptFacts, TrainingStep, loss_statements
from tcaudit.script.guards import branches
from tcaudit.script.pipeline import pipeline_facts
from tcaudit.source.syntax import call_nodes, full_name, names_in

# -- the plan -----------------------------------------------------------------------------------


def _called_under(statements: "Iterable[cst.BaseStatement]") -> "tuple[Situation, ...]":
    """What an autocast wrap around ``statements`` brings about: every function they call by a bare
    or ``self.`` name runs under autocast (a helper whose BCE TC208 declined to fix, say)."""
    names: list[str] = []
    for statement in statements:
        for call in call_nodes(statement):
            func = call.func
            if isinstance(func, cst.Name):
                name = func.value
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
                name = func.attr.value
            else:
                continue
            if name not in names:
                names.append(name)
    return tuple(Situation(SituationKind.RUNS_UNDER_AUTOCAST, name) for name in names)


@dataclass(frozen=True, eq=False)
class AutocastStep:
    """One training step under the fix: the statements to wrap and the backward to scale."""

    statements: tuple[cst.BaseStatement, ...]  # forward and loss: contiguous statements of one block
    backward: cst.Call
    device_type: str  # device-type expression at the step (``"cuda"``, ``device.type``, ``amp_device``)
    enabled: str


@dataclass(frozen=True, eq=False)
class WrapAutocast(FixPlan):
    kind = "wrap-autocast"
    ranges: tuple[dict, ...]  # per step: start_line, end_line, backward_line
    dtype: str
    scaler: bool
    steps: tuple[AutocastStep, ...]
    device_variable: DeviceVariable | None
    grad_scaler: GradScalerPlan | None

    def creates(self) -> "tuple[Situation, ...]":
        return _called_under(self.put_under_autocast())

    def put_under_autocast(self) -> tuple[cst.BaseStatement, ...]:
        return tuple(statement for step in self.steps for statement in step.statements)

    def to_dict(self) -> dict:
        # The nested plans hold syntax nodes; render the code they insert instead (and nothing for None).
        data = {k: v for k, v in super().to_dict().items() if k not in ("device_variable", "grad_scaler")}
        if self.device_variable is not None:
            data["device_variable"] = f"{self.device_variable.name} = {self.device_variable.code}"
        if self.grad_scaler is not None:
            data["grad_scaler"] = self.grad_scaler.create
        return data


@dataclass(frozen=True, eq=False)
class WidenAutocast(FixPlan):
    """Move the forward statements that run just before an autocast block (which covers only the
    loss) to the start of that block."""

    kind = "widen-autocast"
    lines: tuple[int, ...]  # the forward statements' lines
    autocast_line: int
    autocast: cst.With
    statements: tuple[cst.BaseStatement, ...]

    def creates(self) -> "tuple[Situation, ...]":
        return _called_under(self.statements)

    def put_under_autocast(self) -> tuple[cst.BaseStatement, ...]:
        return tuple(self.statements)


@dataclass(frozen=True, eq=False)
class WrapBranches(FixPlan):
    """Wrap the forward of each branch that runs without autocast in the autocast another branch
    uses (its expression copied), so every model path runs in the same precision."""

    kind = "wrap-branches"
    lines: tuple[int, ...]
    context: str  # the covered branch's autocast expression
    groups: tuple[tuple[cst.BaseStatement, ...], ...]  # contiguous statements of one block each

    def creates(self) -> "tuple[Situation, ...]":
        return _called_under(statement for group in self.groups for statement in group)

    @property
    def statements(self) -> tuple[cst.BaseStatement, ...]:
        return tuple(node for group in self.groups for node in group)


# -- detection ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Decision:
    amp: AmpFacts
    uncovered: dict  # function (or None) -> its uncovered training steps
    partly: tuple  # (step, StepCoverage): autocast covers the loss but not the forward, or one model branch
    dtype: str
    scaler: bool
    why: str


def _decide(
    facts: ScriptFacts, precision: str, convnet: bool | None = None, gpu: "Target | None" = None,
    compiled: bool = False,
) -> _Decision | None:
    """Whether TC201 reports this file, and with which recipe; None when it does not. ``convnet`` is the
    model audit's verdict on the trained model (fp16 for a convnet, bf16 where ``compiled``: ``fix
    --compile`` compiles the trained models), None to judge from the text."""
    if facts.frameworks or not facts.uses_accelerator or not facts.updates_parameters:
        return None  # a framework owns precision; a CPU-only script gets no AMP advice
    amp = amp_facts(facts)
    if amp.half_model_casts or amp.double_model:
        return None  # TC206 covers a model cast to half; float64 models ignore autocast on purpose
    uncovered: dict[object, list[TrainingStep]] = {}
    partly: list[tuple[TrainingStep, StepCoverage]] = []
    for step in facts.training_steps:
        coverage = amp.step_coverage(step)
        if coverage.kind == UNCOVERED:
            uncovered.setdefault(step.function, []).append(step)
        elif coverage.kind in (PARTIAL, BRANCH) and coverage.flow is not None:
            partly.append((step, coverage))
    if not uncovered and not partly:
        return None
    dtype, scaler, why = amp.recommended_precision(precision, convnet, gpu, compiled)
    return _Decision(amp, uncovered, tuple(partly), dtype, scaler, why)


def audited_convnet(facts: ScriptFacts, context: RuleContext) -> bool | None:
    """The model audit's verdict on whether the trained model is a convnet; None without one."""
    if context.models is None:
        return None
    return pipeline_facts(facts).audited_convnet(context.models)




class MissingAutocast(ScriptRule):
    id = "TC201"
    triggers = (r"\.backward\(",)
    # TC301's fix first in a round (autocast silences TC301, yet it was reported and TF32 still speeds
    # up the fp32 matmuls left outside autocast); this fix follows TC206's removal of a model cast. Under
    # ``fix --compile`` the recipe depends on whether TC305 compiles the trained models.
    after = ("TC301", "TC206", "TC305")

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        decision = _decide(facts, context.settings.precision, audited_convnet(facts, context), context.settings.target,
                           context.compiles_trained_models(facts))
        if decision is None:
            yield from self._after_cast_removal(facts, context)
            return
        recipe = "bf16 autocast" if decision.dtype == "bfloat16" else "fp16 autocast with a GradScaler"
        small = little_to_gain(facts, context)  # the same for every step of the file
        # A launch-bound model gains nothing it could be quoted: the explanation says why instead.
        cost = context.cost(self.spec, "autocast") if small is None else ""
        for function, steps in decision.uncovered.items():
            steps = [step for step in steps if not _forward_on_cpu(facts, step)]
            if not steps:
                continue
            first_node = _step_statements(facts, steps[0])[0]
            where = f"in `{function.name.value}`" if function is not None else "at module level"
            lines = ", ".join(
                f"{r['start_line']}" if r["start_line"] == r["end_line"] else f"{r['start_line']}-{r['end_line']}"
                for r in _ranges(facts, steps)
            )
            flow = decision.amp.step_coverage(steps[0]).flow
            if len(steps) == 1 and _forward_in_caller(facts, steps[0]) and flow is not None:
                caller = flow.function.name.value if flow.function is not None else "module level"
                message = f"the forward feeding the backward {where} runs in fp32 (line {lines}, in `{caller}`)"
                explanation = f"Wrap it, not the backward, in torch.autocast{cost}; {recipe} ({decision.why})."
            else:
                message = f"training step {where} runs forward and loss in fp32 (line {lines})"
                explanation = f"Wrap them in torch.autocast{cost}; {recipe} ({decision.why})."
            severity = None
            if small is not None:
                message, explanation, severity = message + small.message, explanation + small.explanation, Severity.INFO
            yield self.finding(
                facts,
                first_node,
                message,
                severity=severity,
                fix=held_back(self.planned_fix(
                    FixClass.NUMERICS,
                    f"wrap forward and loss in torch.autocast(device_type, dtype=torch.{decision.dtype})"
                    + (" and scale the loss with torch.amp.GradScaler" if decision.scaler else ""),
                    lambda steps=steps: _plan(facts, decision, steps),
                ), small, self.id, context.settings),
                explanation=explanation,
                details=small.details if small is not None else None,
            )
        for step, coverage in decision.partly:
            finding = self._partly_covered(facts, step, coverage)
            if small is not None:
                finding = dataclasses.replace(finding, severity=Severity.INFO, message=finding.message + small.message,
                                              details={**finding.details, **small.details},
                                              fix=held_back(finding.fix, small, self.id, context.settings))
            yield finding

    def _partly_covered(self, facts: ScriptFacts, step: TrainingStep, coverage: StepCoverage) -> Finding:
        assert coverage.flow is not None
        uncovered = sorted((s for s in coverage.flow.forwards if not s.covered), key=lambda s: facts.line_of(s.node))
        numbers = [str(facts.line_of(s.node)) for s in uncovered]
        lines = ("line " if len(numbers) == 1 else "lines ") + ", ".join(numbers)
        if coverage.kind == PARTIAL:
            message = f"the forward ({lines}) runs in fp32 outside the autocast block that covers only the loss"
            explanation = (
                "Its GEMMs and convolutions never reach the Tensor Cores; put the forward under the autocast."
            )
            description = "move the forward into the autocast block"
        else:
            message = f"autocast covers only some of the model branches: the forward on {lines} runs in fp32"
            explanation = "Put every branch's forward under the same autocast."
            description = "wrap the other branches' forward in the same autocast"
        return self.finding(
            facts,
            uncovered[0].node,
            message,
            fix=self.planned_fix(FixClass.NUMERICS, description, lambda: _plan_partial(facts, step, coverage)),
            explanation=explanation,
        )


    def _after_cast_removal(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        """A model cast to half precision is TC206's: its fix drops the cast, and this rule's fix wraps
        the step in autocast in the round after. Scan reports that second step now."""
        amp = amp_facts(facts)
        if not amp.half_model_casts or amp.double_model or facts.frameworks or not facts.uses_accelerator:
            return
        casts = context.findings_of("TC206", facts)
        if not casts or not all(f.fix is not None and f.fix.available for f in casts):
            return
        for step in facts.training_steps:
            if amp.step_is_covered(step):
                continue
            yield self.finding(
                facts,
                _step_statements(facts, step)[0],
                "with the half-precision model cast removed (TC206), the step runs in fp32: wrap forward and "
                "loss in torch.autocast",
                fix=Fix(FixClass.NUMERICS, "wrap forward and loss in torch.autocast, once TC206's fix has "
                        "removed the model cast", plan=FollowsFix("TC206")),
            )
            return  # one finding: the recipe is decided on the script as TC206 leaves it


def _forward_on_cpu(facts: ScriptFacts, step: TrainingStep) -> bool:
    """The step's forward calls only models the script keeps on the CPU itself (``model_0.to("cpu")``, a
    notebook's CPU baseline beside a CUDA model): CUDA autocast around it would change nothing."""
    kept = facts.models_kept_on_cpu
    if not kept:
        return False
    called = {full_name(node.func) for statement in _step_statements(facts, step)
              for node in call_nodes(statement)}
    trained = facts.optimized_models or frozenset()
    return bool(called & kept) and not (called & (trained - kept))


def _step_statements(facts: ScriptFacts, step: TrainingStep) -> list[cst.CSTNode]:
    """The step's forward and loss statements, or the backward's statement when they are elsewhere.

    A forward shared with an earlier step of the block (a GAN's ``fake``, used by the discriminator's
    loss and then the generator's) belongs to that step: only the statements after the last other
    backward before this one are this step's, so no wrap takes in another step's backward."""
    statements = loss_statements(facts, step)
    caller_forward = _forward_in_caller(facts, step)
    if not statements and caller_forward:
        return [s.node for s in caller_forward]
    if statements:
        here = step.backward.statement
        others = {id(s.backward.statement.node) for s in facts.training_steps if s is not step and s.backward.statement}
        cut = max((i for i in range(here.index) if id(here.block[i]) in others), default=-1)
        own = [s.node for s in statements if s.index > cut]
        return own or [s.node for s in statements]
    return [step.backward.statement.node if step.backward.statement else step.backward.node]


def _forward_in_caller(facts: ScriptFacts, step: TrainingStep) -> list[ForwardStatement]:
    """When the loss comes into the step's function as a parameter (``def _backward(self, loss)``),
    the statements of the one caller that compute it, in the block of the call passing it in: the
    forward to wrap (never the backward). Empty otherwise."""
    if loss_statements(facts, step):
        return []
    flow = amp_facts(facts).step_coverage(step).flow
    if flow is None or flow.through is None or flow.through.statement is None:
        return []
    block = flow.through.statement.block
    # The passing statement itself (``self._backward(self._forward(b))``) runs the backward: never wrapped.
    return [s for s in flow.statements if s.block is block and s.node is not flow.through.statement.node]


def _wrap_place(facts: ScriptFacts, step: TrainingStep) -> TrainingStep:
    """The step as seen from where its forward is wrapped: itself, or (the forward in a caller) the
    call passing the loss in, so the autocast's device type is an expression valid there."""
    if _forward_in_caller(facts, step):
        through = amp_facts(facts).step_coverage(step).flow.through  # type: ignore[union-attr]
        return TrainingStep(through, step.loss, None)  # type: ignore[arg-type]
    return step


def _ranges(facts: ScriptFacts, steps: list[TrainingStep]) -> tuple[dict, ...]:
    out = []
    for step in steps:
        nodes = _step_statements(facts, step)
        out.append({
            "start_line": facts.line_of(nodes[0]),
            "end_line": facts.position(nodes[-1]).end.line,
            "backward_line": facts.line_of(step.backward.node),
        })
    return tuple(out)


def _plan(facts: ScriptFacts, decision: _Decision, steps: list[TrainingStep]) -> WrapAutocast:
    if decision.amp.uses_lbfgs and decision.scaler:
        raise DeclineFix("LBFGS closures cannot use GradScaler")
    device = DevicePlanner(facts)
    ranges = _ranges(facts, steps)
    planned = []
    in_caller = any(_forward_in_caller(facts, step) for step in steps)
    for step, step_range in zip(steps, ranges):
        device_type, enabled = device.at(_wrap_place(facts, step))
        statements = _block_statements(facts, step, step_range["start_line"], step_range["end_line"])
        planned.append(AutocastStep(tuple(statements), step.backward.node, device_type, enabled))
    wrapped = [id(node) for step in planned for node in step.statements]
    if len(set(wrapped)) < len(wrapped) or any(id(s.backward.statement.node) in wrapped for s in steps):
        if any(loss_statements(facts, s) or _forward_in_caller(facts, s) for s in steps):
            raise DeclineFix("the forward and loss of one step include another step's backward; wrap them by hand")
        raise DeclineFix("the loss comes from outside the backward's function and its forward was not "
                         "found; wrap the forward (not the backward) in torch.autocast by hand")
    _refuse_unsafe_ops(facts, set(wrapped))
    _refuse_log_probabilities(facts, set(wrapped))
    grad_scaler = None
    if decision.scaler:
        # The GradScaler belongs where the backward is; the wrap may sit in a caller (another function).
        scaler_device = DevicePlanner(facts) if in_caller else device
        grad_scaler = plan_grad_scaler(facts, steps, scaler_device)
        if in_caller and scaler_device.variable is not None:
            raise DeclineFix("the GradScaler's device type would need a variable beside the backward; "
                             "add the GradScaler by hand or use precision = \"bf16\"")
    return WrapAutocast(ranges, decision.dtype, decision.scaler, tuple(planned), device.variable, grad_scaler)


def _plan_partial(facts: ScriptFacts, step: TrainingStep, coverage: StepCoverage) -> WidenAutocast | WrapBranches:
    flow = coverage.flow
    assert flow is not None
    uncovered = sorted((s for s in flow.forwards if not s.covered), key=lambda s: facts.line_of(s.node))
    if coverage.kind == PARTIAL:
        return _plan_widen(facts, flow.statements, uncovered)
    return _plan_branches(facts, [s for s in flow.forwards if s.covered], uncovered)


def _plan_widen(
    facts: ScriptFacts, statements: Sequence[ForwardStatement], uncovered: list[ForwardStatement]
) -> WidenAutocast:
    target = next((s.autocast for s in statements if s.covered and s.autocast is not None), None)
    if target is None:
        raise DeclineFix("the loss runs under autocast inside a helper; move the forward into it by hand")
    block = uncovered[0].block
    position = next((i for i, node in enumerate(block) if node is target), None)
    if position is None or any(s.block is not block for s in uncovered):
        raise DeclineFix("the forward and the autocast block are not in the same block; "
                         "put the forward under autocast by hand")
    first = min(s.index for s in uncovered)
    if first > position:
        raise DeclineFix("the forward runs after the autocast block; put it under autocast by hand")
    moved = tuple(block[first:position])
    _refuse_compound_or_step(facts, moved, "between the forward and the autocast block")
    if not isinstance(target.body, cst.IndentedBlock):
        raise DeclineFix("the autocast block is a one-line suite; put the forward under it by hand")
    _refuse_unsafe_ops(facts, {id(node) for node in moved})
    return WidenAutocast(
        tuple(facts.line_of(s.node) for s in uncovered), facts.line_of(target), target, moved  # type: ignore[arg-type]
    )


def _plan_branches(
    facts: ScriptFacts, covered: list[ForwardStatement], uncovered: list[ForwardStatement]
) -> WrapBranches:
    source = next((s for s in covered if s.autocast is not None), None)
    if source is None or source.ctx is None:
        raise DeclineFix("the covered branch runs under autocast through a helper; wrap the other branches by hand")
    autocast = source.autocast
    assert autocast is not None
    if len(autocast.items) != 1 or autocast.items[0].asname is not None:
        raise DeclineFix("the covered branch's autocast block has several items or an `as` name; "
                         "wrap the other branches by hand")
    expression = autocast.items[0].item
    # Only where the names the autocast reads exist on the other branches too.
    own_arms = {(id(b.test), b.taken) for b in branches(source.ctx)}
    for forward in uncovered:
        assert forward.ctx is not None
        arms = own_arms - {(id(b.test), b.taken) for b in branches(forward.ctx)}
        for name in {n.split(".")[0] for n in names_in(expression)}:
            for binding in facts.bindings_of(name):
                if binding.ctx.function is source.ctx.function and arms & {
                    (id(b.test), b.taken) for b in branches(binding.ctx)
                }:
                    raise DeclineFix(f"`{name}`, which the autocast reads, is set on the covered branch only; "
                                     "wrap the other branches by hand")
    groups = []
    for block in {id(s.block): s.block for s in uncovered}.values():
        indices = [s.index for s in uncovered if s.block is block]
        group = tuple(block[min(indices): max(indices) + 1])
        _refuse_compound_or_step(facts, group, "in an uncovered branch's forward")
        groups.append(group)
    _refuse_unsafe_ops(facts, {id(node) for group in groups for node in group})
    return WrapBranches(
        tuple(facts.line_of(s.node) for s in uncovered),
        facts.code(expression),
        tuple(groups),  # type: ignore[arg-type]
    )


def _refuse_compound_or_step(facts: ScriptFacts, nodes: Sequence[cst.CSTNode], where: str) -> None:
    for node in nodes:
        if not isinstance(node, cst.SimpleStatementLine):
            raise DeclineFix(f"a compound statement {where} (line {facts.line_of(node)}); "
                             "put the forward under autocast by hand")
    inside = {id(node) for node in nodes}
    for call in facts.calls:
        if call.statement is not None and id(call.statement.node) in inside and call.method == "backward":
            raise DeclineFix(f"a backward {where} (line {facts.line_of(call.node)}); "
                             "put the forward under autocast by hand")
    for call in facts.optimizer_steps:
        if call.statement is not None and id(call.statement.node) in inside:
            raise DeclineFix(f"an optimizer step {where} (line {facts.line_of(call.node)}); "
                             "put the forward under autocast by hand")


def _refuse_unsafe_ops(facts: ScriptFacts, wrapped: set[int]) -> None:
    """Decline where the wrap would put binary cross-entropy on probabilities under autocast in a way
    TC208's fix cannot undo: in a compound statement, or inside a helper the wrapped code calls (it
    raises on CUDA). A BCE in a plain wrapped statement is TC208's to take out, in the next round."""
    for call in facts.calls:
        if call.statement is None or id(call.statement.node) not in wrapped:
            continue
        if unsafe_kind(facts, call) == "bce":
            if not isinstance(call.statement.node, cst.SimpleStatementLine):
                raise DeclineFix("binary cross-entropy in a compound statement would run under autocast, "
                                 "where it raises; use BCEWithLogitsLoss, or wrap by hand")
            continue
        name = (call.name or "").removeprefix("self.")
        for helper in facts.functions_by_name.get(name, []) if name and "." not in name else []:
            if _computes_bce(facts, helper, set()):
                raise DeclineFix(
                    f"`{name}` computes binary cross-entropy on probabilities, which raises under autocast, "
                    "and TC208 cannot move it out of a helper; use BCEWithLogitsLoss on the logits, or wrap "
                    "the forward by hand"
                )


def _computes_bce(facts: ScriptFacts, function: cst.FunctionDef, seen: set[int], depth: int = 4) -> bool:
    """Whether ``function``, or a function of this file it calls (a few calls deep: ``_forward`` calling
    ``compute_loss``), computes binary cross-entropy on probabilities."""
    seen.add(id(function))
    for inner in facts.calls_in(function):
        if unsafe_kind(facts, inner) == "bce":
            return True
        name = (inner.name or "").removeprefix("self.")
        for helper in facts.functions_by_name.get(name, []) if depth and name and "." not in name else []:
            if id(helper) not in seen and _computes_bce(facts, helper, seen, depth - 1):
                return True
    return False


def _refuse_log_probabilities(facts: ScriptFacts, wrapped: set[int]) -> None:
    """Decline where the wrapped code computes ``torch.distributions`` log-probabilities, itself or in a
    function or method of this file it calls (an RL agent's ``get_action_and_value``): policy-gradient
    losses take ``exp(new_log_prob - old_log_prob)`` of nearly equal numbers (PPO clips the ratio at
    1 ± 0.2 and stops early on a KL of 0.01), where bf16's 8-bit mantissa is noise, not precision."""
    for call in facts.calls:
        if call.statement is None or id(call.statement.node) not in wrapped:
            continue
        helpers = facts.functions_by_name.get((call.name or "").split(".")[-1], []) if call.name else []
        if _computes_log_probabilities(facts, [call]) or any(
            _computes_log_probabilities(facts, facts.calls_in(helper)) for helper in helpers
        ):
            raise DeclineFix(
                "the loss is built from `torch.distributions` log-probabilities: under bf16 autocast the "
                "logits keep 8 mantissa bits, and a ratio `exp(new_log_prob - old_log_prob)` that should be "
                "exactly 1 before the first update carries that rounding; keep this step in fp32, or wrap it "
                "by hand where the precision is enough"
            )


def _computes_log_probabilities(facts: ScriptFacts, calls: Iterable[CallSite]) -> bool:
    return any(
        call.method == "log_prob" or (facts.qualname(call.node.func) or "").startswith("torch.distributions.")
        for call in calls
    )


def _block_statements(facts: ScriptFacts, step: TrainingStep, start: int, end: int) -> list[cst.CSTNode]:
    """The statements of the step's block whose lines fall in [start, end]."""
    statement = step.backward.statement
    caller_forward = _forward_in_caller(facts, step)
    if caller_forward:
        block = caller_forward[0].block
    elif statement is None:
        raise DeclineFix("the backward call is not a plain statement")
    else:
        block = statement.block
    chosen = [
        node for node in block
        if start <= facts.line_of(node) and facts.position(node).end.line <= end
    ]
    if not chosen:
        raise DeclineFix("the forward and loss are not statements of the backward's block")
    indices = [next(i for i, n in enumerate(block) if n is node) for node in chosen]
    if indices != list(range(indices[0], indices[0] + len(indices))):
        raise DeclineFix("the forward and loss statements are not contiguous")
    return chosen


# -- the fix ------------------------------------------------------------------------------------


class MissingAutocastFix(Codemod):
    rule = "TC201"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        torch_name = torch_import_name(facts) or "torch"
        editor = AutocastEditor()
        for finding in findings:
            plan = finding.fix.plan
            if isinstance(plan, WidenAutocast):
                editor.widen(plan.autocast, list(plan.statements))
                continue
            if isinstance(plan, WrapBranches):
                for group in plan.groups:
                    editor.wrap(list(group), plan.context)
                continue
            assert isinstance(plan, WrapAutocast)
            if plan.device_variable is not None:
                variable = plan.device_variable
                editor.insert_before(variable.loop, [parse_statement(f"{variable.name} = {variable.code}", module)])
            for step in plan.steps:
                editor.wrap(list(step.statements), f"{torch_name}.autocast(device_type={step.device_type}, "
                                                   f"dtype={torch_name}.{plan.dtype}, enabled={step.enabled})")
            if plan.grad_scaler is not None:
                editor.add_grad_scaler(plan.grad_scaler, module)
        new = module.visit(editor)
        if torch_import_name(facts) is None:
            new = ensure_import(new, "import torch")
        return new
