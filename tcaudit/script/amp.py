"""Mixed-precision facts derived from :class:`ScriptFacts`, shared by the TC2 rules:
which autocast contexts exist and in which dtype, whether a training step runs under one, how the
model is cast, and which precision a fix should use."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from tcaudit import gpus
from tcaudit.script.callers import callers_of, reachable_functions
from tcaudit.script.expressions import numeric_constant
from tcaudit.script.facts import AUTOCAST_QUALNAMES, CallSite, Frame, ScriptFacts, TrainingStep, assigned_names
from tcaudit.script.guards import branches, exclusive
from tcaudit.source.memo import remembered
from tcaudit.source.syntax import call_nodes, evaluated_value, keyword, names_in, nodes_of, param_names, strip_comments
from tcaudit.source.syntax import full_name

if TYPE_CHECKING:
    from tcaudit.model_profile import AuditedModels

HALF = "float16"
BF16 = "bfloat16"
UNKNOWN = "unknown"

_DTYPE_NAMES = {
    "torch.float16": HALF,
    "torch.half": HALF,
    "torch.bfloat16": BF16,
    "torch.float32": "float32",
    "torch.float": "float32",
    "torch.float64": "float64",
    "torch.double": "float64",
}
# An ``if`` test that chooses the precision rather than the model (``args.amp``, ``use_fp16``).
_AMP_FLAG = re.compile(r"amp|autocast|fp16|bf16|half|precision|mixed|scaler", re.IGNORECASE)
_DTYPE_STRINGS = {"float16": HALF, "fp16": HALF, "half": HALF, "bfloat16": BF16, "bf16": BF16}


def dtypes_of(facts: ScriptFacts, expr: cst.BaseExpression | None) -> frozenset[str]:
    """The dtypes an expression may denote (following names and conditionals); UNKNOWN if unsure."""
    if expr is None:
        return frozenset({UNKNOWN})
    out: set[str] = set()
    for value in facts.binding_values(expr):
        if isinstance(value, (cst.IfExp, cst.BooleanOperation)):
            continue  # its branches are among the values
        if isinstance(value, (cst.Name, cst.Attribute)):
            qual = facts.qualname(value)
            if qual in _DTYPE_NAMES:
                out.add(_DTYPE_NAMES[qual])
            elif not facts.bindings_of(full_name(value) or ""):
                out.add(UNKNOWN)
        elif isinstance(value, cst.SimpleString):
            text = evaluated_value(value)
            out.add(_DTYPE_STRINGS.get(str(text), UNKNOWN))
        else:
            out.add(UNKNOWN)
    return frozenset(out or {UNKNOWN})


@dataclass(frozen=True, eq=False)
class ForwardStatement:
    """A simple statement on the data path of a step's loss (the forward, the loss, what they read)."""

    node: cst.SimpleStatementLine
    block: tuple[cst.CSTNode, ...]  # the block holding it
    index: int  # its place in that block
    ctx: Frame | None  # where it runs (the frame of its first call), None when it calls nothing
    autocast: cst.With | None  # the innermost autocast ``with`` of the walk around it
    covered: bool  # runs under autocast: inside one, or through a helper of this file that opens one
    runs_model: bool  # calls the trained model (or a helper of this file that does): the GEMM/conv work


@dataclass(frozen=True, eq=False)
class LossFlow:
    """Where a training step's loss is computed: statements of ``function`` before ``anchor``, found by
    following the names the loss reads back through assignments, ``with`` blocks and ``if`` arms.
    ``through`` is the call that passes the loss into the step's function (``self._backward(loss)``)
    when the loss arrives as a parameter; the statements are then the caller's."""

    function: cst.FunctionDef | None
    anchor: cst.CSTNode  # the statement holding the backward (or the call passing the loss in)
    statements: tuple[ForwardStatement, ...]
    through: CallSite | None

    @property
    def forwards(self) -> list[ForwardStatement]:
        return [s for s in self.statements if s.runs_model]


COVERED = "covered"
UNCOVERED = "uncovered"  # nothing on the loss's path runs under autocast
PARTIAL = "partial"  # the loss is under autocast, the forward before it is not
BRANCH = "branch"  # the forward runs under autocast on some arms of an ``if`` and not on others
# The loss comes in as a parameter from a caller that cannot be resolved (``loss_scaler(loss, opt)``
# through a name the script passes around) in a file that uses autocast: where its forward runs, and
# under which precision, is not known, so no rule claims it is fp32.
UNSEEN = "unseen"


@dataclass(frozen=True, eq=False)
class StepCoverage:
    kind: str
    flow: LossFlow | None


@dataclass(frozen=True)
class AutocastSite:
    call: CallSite
    device: str | None  # "cuda", "cpu", or None when not a literal
    dtypes: frozenset[str]
    enabled_literal_false: bool


def _device_of(facts: ScriptFacts, call: CallSite) -> str | None:
    qual = call.qualname or ""
    if qual.startswith("torch.cuda."):
        return "cuda"
    if qual.startswith("torch.cpu."):
        return "cpu"
    expr = call.arg("device_type", 0)
    if isinstance(expr, cst.SimpleString):
        return str(evaluated_value(expr)).split(":")[0]
    return None


def _autocast_site(facts: ScriptFacts, call: CallSite, args_from: cst.Call | None = None) -> AutocastSite:
    node = args_from or call.node
    proxy = CallSite(node, call.name, call.qualname, call.ctx, call.statement)
    device = _device_of(facts, call if args_from is None else proxy)
    dtype_expr = None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "dtype":
            dtype_expr = arg.value
    if dtype_expr is None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        skip = 0 if (call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) else 1
        if args_from is not None:
            skip += 1  # partial(torch.autocast, "cuda", torch.float16): first arg is the callable
        if len(positional) > skip and (call.qualname or "").startswith(("torch.cuda.", "torch.cpu.")) is False:
            candidate = positional[skip].value
            if not (isinstance(candidate, cst.Name) and candidate.value in ("True", "False")):
                dtype_expr = candidate
    if dtype_expr is not None:
        dtypes = dtypes_of(facts, dtype_expr)
    elif any(arg.star for arg in node.args):
        dtypes = frozenset({UNKNOWN})
    elif device == "cuda":
        dtypes = frozenset({HALF})
    elif device == "cpu":
        dtypes = frozenset({BF16})
    else:
        dtypes = frozenset({UNKNOWN})
    enabled = None
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value == "enabled":
            enabled = arg.value
    disabled = isinstance(enabled, cst.Name) and enabled.value == "False"
    return AutocastSite(call, device, dtypes, disabled)


class AmpFacts:
    """Per-file AMP analysis; build once per file with :func:`amp_facts`."""

    def __init__(self, facts: ScriptFacts) -> None:
        self.facts = facts

    @functools.cached_property
    def autocast_sites(self) -> list[AutocastSite]:
        facts = self.facts
        sites = []
        for call in facts.calls:
            qual = call.qualname or ""
            if qual in AUTOCAST_QUALNAMES:
                sites.append(_autocast_site(facts, call))
            elif (qual == "functools.partial" or call.name == "partial") and call.node.args:
                target = facts.qualname(call.node.args[0].value)
                if target in AUTOCAST_QUALNAMES:
                    proxy = CallSite(call.node, call.name, target, call.ctx, call.statement)
                    sites.append(_autocast_site(facts, proxy, args_from=call.node))
        return sites

    @functools.cached_property
    def training_autocast_sites(self) -> list[AutocastSite]:
        return [s for s in self.autocast_sites if not self.facts.in_eval(s.call.ctx) and not s.enabled_literal_false]

    @functools.cached_property
    def autocast_dtypes(self) -> frozenset[str]:
        out: set[str] = set()
        for site in self.training_autocast_sites:
            out |= site.dtypes
        return frozenset(out)

    @functools.cached_property
    def has_indirect_autocast(self) -> bool:
        """Autocast used in a way this analysis cannot place (``ctx.__enter__()``, an ExitStack,
        passed to a helper): treat every step as possibly covered rather than guess."""
        facts = self.facts
        with_items: set[int] = set()
        for node, _ in facts.withs:
            for item in node.items:
                with_items.add(id(item.item))
                if isinstance(item.item, cst.Call):
                    with_items.add(id(item.item.func))
        for fn, _ in facts.functions:
            for dec in fn.decorators:
                with_items.add(id(dec.decorator))
        binding_values = {id(b.value) for b in facts.bindings}
        for site in self.autocast_sites:
            node = site.call.node
            if id(node) in with_items or facts.in_eval(site.call.ctx):
                continue
            if id(node) in binding_values:
                continue  # ``ctx = autocast(...)``: its ``with ctx`` use is resolved through the binding
            if self._is_partial_or_returned(site.call):
                continue
            return True
        return False

    def _is_partial_or_returned(self, call: CallSite) -> bool:
        """``return torch.autocast(...)`` in a helper, or an assignment: resolved through the
        helper's callers or the binding, so not an unplaceable use."""
        statement = call.statement.node if call.statement else None
        if isinstance(statement, cst.SimpleStatementLine):
            return any(isinstance(small, (cst.Return, cst.Assign, cst.AnnAssign)) for small in statement.body)
        return isinstance(statement, cst.Return)

    def step_is_covered(self, step: TrainingStep) -> bool:
        return self.step_coverage(step).kind == COVERED

    def step_coverage(self, step: TrainingStep) -> StepCoverage:
        """Whether the step's forward runs under autocast, judged on the path its loss is computed on:
        a forward outside an autocast that covers only the loss is PARTIAL, one covered on some arms
        of an ``if`` only is BRANCH; a loss handed in from a caller is followed to the caller."""
        cached = self._coverage.get(id(step))
        if cached is None:
            cached = self._coverage[id(step)] = self._step_coverage(step)
        return cached

    @functools.cached_property
    def _coverage(self) -> dict[int, StepCoverage]:
        return {}

    def _step_coverage(self, step: TrainingStep) -> StepCoverage:
        if self._covered_by_context(step):
            return StepCoverage(COVERED, None)
        flow = self.loss_flow(step)
        if flow is not None:
            forwards = flow.forwards
            if forwards and all(s.covered for s in forwards):
                return StepCoverage(COVERED, flow)
            if forwards and any(s.covered for s in flow.statements):
                covered = [s for s in forwards if s.covered]
                uncovered = [s for s in forwards if not s.covered]
                separated = [
                    [c for c in covered if u.ctx is not None and c.ctx is not None and exclusive(u.ctx, c.ctx)]
                    for u in uncovered
                ]
                if covered and all(separated):
                    if all(self._precision_switch(u, others) for u, others in zip(uncovered, separated)):
                        return StepCoverage(COVERED, flow)  # ``if args.amp: with autocast: ... else: ...``
                    return StepCoverage(BRANCH, flow)
                return StepCoverage(PARTIAL, flow)
            if not forwards and any(s.covered for s in flow.statements):
                return StepCoverage(COVERED, flow)
        if self._covered_nearby(step):
            return StepCoverage(COVERED, flow)
        if self._forward_unseen(step, flow):
            return StepCoverage(UNSEEN, flow)
        return StepCoverage(UNCOVERED, flow)

    def _forward_unseen(self, step: TrainingStep, flow: "LossFlow | None") -> bool:
        """The step's function gets its loss as a parameter, computes no forward itself, no caller
        passing it is found, and the file uses autocast somewhere (``with amp_autocast():`` through a
        name the trace cannot resolve): the forward is elsewhere, maybe under that autocast."""
        function = step.function
        if flow is None or flow.through is not None or flow.forwards or function is None:
            return False
        loss = step.loss
        if isinstance(loss, cst.Call) and loss.args:  # scaler.scale(loss)
            loss = loss.args[0].value
        incoming = names_in(loss) & set(param_names(function, stars=False)) - {"self", "cls"}
        return bool(incoming) and "autocast" in strip_comments(self.facts.source.text)

    def _precision_switch(self, uncovered: ForwardStatement, covered: list[ForwardStatement]) -> bool:
        """Whether the ``if`` between an uncovered forward and a covered one chooses the precision (an
        AMP flag), not the model: its test names AMP, or both arms run the very same forward."""
        module = self.facts.module
        code = module.code_for_node(uncovered.node).strip()
        if any(module.code_for_node(c.node).strip() == code for c in covered):
            return True
        assert uncovered.ctx is not None
        theirs = {(id(b.test), b.taken) for c in covered if c.ctx is not None for b in branches(c.ctx)}
        ours = {id(b.test) for b in branches(uncovered.ctx)}
        for branch in branches(uncovered.ctx):
            if id(branch.test) in ours and (id(branch.test), not branch.taken) in theirs:
                if _AMP_FLAG.search(module.code_for_node(branch.test.test)):
                    return True
        return False

    def _covered_by_context(self, step: TrainingStep) -> bool:
        """The step itself runs under autocast: around it, around a caller, or in the model's forward."""
        facts = self.facts
        if self.has_indirect_autocast or self._forward_runs_under_autocast:
            return True
        if facts.in_autocast(step.ctx):
            return True
        function = step.function
        if function is not None:
            # Callers that run this step under autocast (``with autocast(): self.train_step(b)``).
            frontier = [function]
            seen = {function}
            for _ in range(3):
                nxt = []
                for fn in frontier:
                    for caller in callers_of(facts, fn):
                        if facts.in_autocast(caller.ctx):
                            return True
                        outer = caller.ctx.function
                        if outer is not None and outer not in seen:
                            seen.add(outer)
                            nxt.append(outer)
                frontier = nxt
        return False

    def _covered_nearby(self, step: TrainingStep) -> bool:
        """An autocast in the step's function or one it calls, off the loss's traced path: counted as
        covering the step rather than guessed wrong (helpers the trace cannot see into)."""
        facts = self.facts
        function = step.function
        related = {function} | reachable_functions(facts, function)
        if any(fn in self._functions_around_autocast for fn in related):
            return True
        return any(fn is not None and facts.function_has_autocast_decorator(fn) for fn in related)

    @functools.cached_property
    def _functions_around_autocast(self) -> set[cst.FunctionDef | None]:
        """Every function that holds an autocast ``with`` (outside eval paths), at any depth; None
        when one is at module level. Computed once: checking each step against each ``with`` made
        files of many steps quadratic."""
        out: set[cst.FunctionDef | None] = set()
        for _node, ctx in self.facts.autocast_withs:
            if self.facts.in_eval(ctx):
                continue
            out.add(ctx.function)
            out.update(frame.node for frame in ctx.chain() if frame.kind == "def")  # type: ignore[misc]
        return out

    @functools.cached_property
    def _forward_runs_under_autocast(self) -> bool:
        """A model whose own forward runs under autocast covers every step that calls it."""
        for _node, ctx in self.facts.autocast_withs:
            outer = ctx.function
            if outer is not None and outer.name.value == "forward":
                return True
        return False

    # -- the loss's path ----------------------------------------------------------------------------
    def loss_flow(self, step: TrainingStep) -> LossFlow | None:
        """The statements computing the step's loss (see :class:`LossFlow`); None when the backward is
        not a plain statement."""
        statement = step.backward.statement
        if statement is None:
            return None
        function = step.function
        loss = step.loss
        if isinstance(loss, cst.Call) and loss.args:  # scaler.scale(loss)
            loss = loss.args[0].value
        found, wanted = self._trace(function, statement.node, names_in(loss))
        local = LossFlow(function, statement.node, tuple(found), None)
        if function is None or local.forwards:
            return local
        incoming = sorted(wanted & set(param_names(function, stars=False)) - {"self", "cls"})
        call = self._single_training_caller(function)
        # Callers are found by name, so a name two functions share is ambiguous; a ``__call__``'s callers
        # are the calls of its own class's instances.
        ambiguous = function.name.value != "__call__" and len(self.facts.functions_by_name.get(function.name.value, [])) != 1
        if not incoming or call is None or ambiguous:
            return local
        argument = _argument_for(function, call, incoming[0])
        if argument is None:
            return local
        caller_found, _ = self._trace(call.ctx.function, call.statement.node, names_in(argument))  # type: ignore[union-attr]
        anchor = call.statement.node  # type: ignore[union-attr]
        if not isinstance(argument, (cst.Name, cst.Attribute)) and isinstance(anchor, cst.SimpleStatementLine):
            # ``self._backward(self._forward(batch))``: the forward is in the passing statement itself.
            block, index = call.statement.block, call.statement.index  # type: ignore[union-attr]
            caller_found.append(self._forward_statement(anchor, block, index, None, False))
        return LossFlow(call.ctx.function, call.statement.node, tuple(caller_found), call)  # type: ignore[union-attr]

    def helpers_on_loss_path(self, step: TrainingStep) -> set[cst.FunctionDef]:
        """The functions of this file that the statements computing the step's loss call (the
        ``_forward`` of ``loss = self._forward(batch)``), in the step's function or its caller."""
        flow = self.loss_flow(step)
        out: set[cst.FunctionDef] = set()
        for statement in flow.statements if flow is not None else ():
            for call in self._calls_by_statement.get(id(statement.node), []):
                out.update(self._helpers(call))
        return out

    def _is_module_name(self, dotted: str | None) -> bool:
        """A name bound to a torch.nn / torchvision module built in this file (``wide = nn.Sequential(...)``)."""
        facts = self.facts
        for binding in facts.bindings_of(dotted or ""):
            value = binding.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in (
                "to", "cuda", "train", "float"
            ):
                value = value.func.value
            qual = facts.qualname(value.func) if isinstance(value, cst.Call) else None
            if qual and qual.startswith(("torch.nn.", "torchvision.models.")) and not qual.startswith(
                "torch.nn.functional."
            ):
                return True
        return False

    def _single_training_caller(self, function: cst.FunctionDef) -> CallSite | None:
        facts = self.facts
        calls = [
            c for c in callers_of(facts, function)
            if c.statement is not None and c.ctx.function is not function and not facts.in_eval(c.ctx)
        ]
        return calls[0] if len(calls) == 1 else None

    def _trace(
        self, function: cst.FunctionDef | None, anchor: cst.CSTNode, wanted: set[str]
    ) -> tuple[list[ForwardStatement], set[str]]:
        """Walk back from ``anchor`` through its block and the blocks around it, collecting the
        statements that assign a wanted name (and wanting what they read in turn)."""
        body = self.facts.module.body if function is None else (
            function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
        )
        path = _path_to(tuple(body), anchor)
        found: list[ForwardStatement] = []
        wanted = set(wanted)
        budget = [400]  # statements looked at: a long module-level script stays linear
        autocast_at: list[cst.With | None] = []
        current: cst.With | None = None
        for block, index in path:
            autocast_at.append(current)
            node = block[index]
            if isinstance(node, cst.With):
                kinds = self.facts.with_kinds(node)
                current = node if "autocast" in kinds else (None if "autocast-off" in kinds else current)
        for (block, index), around in zip(reversed(path), reversed(autocast_at)):
            for i in range(index - 1, -1, -1):
                self._visit(block, i, around, False, wanted, found, budget)
        found.reverse()
        return found, wanted

    def _visit(self, block, index, autocast, in_eval, wanted, found, budget) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            return
        node = block[index]
        if isinstance(node, cst.SimpleStatementLine):
            if assigned_names(node) & wanted:
                found.append(self._forward_statement(node, block, index, autocast, in_eval))
                wanted |= names_in(node)
        elif isinstance(node, cst.With) and isinstance(node.body, cst.IndentedBlock):
            kinds = self.facts.with_kinds(node)
            inner = node if "autocast" in kinds else (None if "autocast-off" in kinds else autocast)
            body = tuple(node.body.body)
            for i in range(len(body) - 1, -1, -1):
                self._visit(body, i, inner, in_eval or "eval" in kinds, wanted, found, budget)
        elif isinstance(node, cst.If):
            arm: cst.CSTNode | None = node
            arms = []
            while isinstance(arm, cst.If):
                arms.append(arm.body)
                arm = arm.orelse
            if isinstance(arm, cst.Else):
                arms.append(arm.body)
            before = set(wanted)
            for suite in arms:
                if not isinstance(suite, cst.IndentedBlock):
                    continue
                arm_wanted = set(before)
                body = tuple(suite.body)
                for i in range(len(body) - 1, -1, -1):
                    self._visit(body, i, autocast, in_eval, arm_wanted, found, budget)
                wanted |= arm_wanted

    def _forward_statement(self, node, block, index, autocast, in_eval) -> ForwardStatement:
        calls = self._calls_by_statement.get(id(node), [])
        ctx = calls[0].ctx if calls else None
        # A statement under ``autocast(..., enabled=False)`` runs in fp32 by the author's decision (or
        # TC208's fix: a BCE loss taken out of the autocast around it): its precision is settled.
        covered = autocast is not None or (ctx is not None and (
            self.facts.in_autocast(ctx) or self.facts.autocast_turned_off(ctx)
        )) or any(self._helper_opens_autocast(c) for c in calls)
        runs_model = not in_eval and any(self._calls_model(c) for c in calls)
        return ForwardStatement(node, block, index, ctx, autocast, covered, runs_model)

    @functools.cached_property
    def _calls_by_statement(self) -> dict[int, list[CallSite]]:
        table: dict[int, list[CallSite]] = {}
        for call in self.facts.calls:
            if call.statement is not None:
                table.setdefault(id(call.statement.node), []).append(call)
        return table

    def _helpers(self, call: CallSite) -> list[cst.FunctionDef]:
        short = (call.name or "").removeprefix("self.")
        return self.facts.functions_by_name.get(short, []) if short and "." not in short else []

    def _helper_opens_autocast(self, call: CallSite) -> bool:
        facts = self.facts
        for helper in self._helpers(call):
            for fn in {helper} | reachable_functions(facts, helper, depth=2):
                if fn in self._functions_around_autocast or facts.function_has_autocast_decorator(fn):
                    return True
        return False

    def _calls_model(self, call: CallSite) -> bool:
        models = self.facts.model_names
        if call.name is not None and (call.name in models or call.name.removesuffix(".module") in models):
            return True
        func = call.node.func
        while isinstance(func, cst.Subscript):  # ``layers[0](x)``
            func = func.value
        if self._is_module_name(full_name(func)):
            return True
        for helper in self._helpers(call):
            for fn in {helper} | reachable_functions(self.facts, helper, depth=2):
                if any(c.name in models for c in self.facts.calls_in(fn) if c.name):
                    return True
        return False

    @functools.cached_property
    def casts(self) -> list[tuple[CallSite, str]]:
        """The calls that cast what they are called on to a dtype (:func:`cast_dtype`), with it, in the
        file's order (several passes ask of every call)."""
        facts = self.facts
        out = []
        for call in facts.calls:
            dtype = cast_dtype(facts, call)
            if dtype is not None:
                out.append((call, dtype))
        return out

    @functools.cached_property
    def half_model_casts(self) -> list[CallSite]:
        """Calls that cast the whole trained model to fp16/bf16 (``model.half()``, ``.to(torch.float16)``)."""
        facts = self.facts
        out = []
        for call, dtype in self.casts:
            if dtype not in (HALF, BF16):
                continue
            if facts.in_eval(call.ctx):
                continue
            if is_model_expr(facts, call) and not self._cast_back_to_fp32(call):
                out.append(call)
        return out

    def _cast_back_to_fp32(self, call: CallSite) -> bool:
        """``model.half().float()``, ``model.bfloat16().to(torch.float32)``, or ``model.half()`` then
        ``model.float()`` later in the same block: the weights are rounded to 16 bits once and then
        trained in fp32, which is not half-precision training."""
        facts = self.facts
        outer = self._fp32_casts_by_receiver.get(id(call.node))
        if outer is not None:
            return True
        name = _cast_model_name(call)
        statement = call.statement
        if name is None or statement is None:
            return False
        # Not when training happens in between: ``model.half()``, the loop, then ``model.float()`` to
        # save the weights trained in fp16.
        backward_lines = [facts.line_of(step.backward.node) for step in facts.training_steps]
        for later in self._fp32_casts_by_receiver.values():
            if later.statement is None or later.statement.block is not statement.block:
                continue
            if later.statement.index <= statement.index or _cast_model_name(later) != name:
                continue
            first, last = facts.line_of(call.node), facts.line_of(later.node)
            if not any(first < line < last for line in backward_lines):
                return True
        return False

    @functools.cached_property
    def _fp32_casts_by_receiver(self) -> dict[int, CallSite]:
        """Casts to fp32 (``.float()``, ``.to(torch.float32)``), by the id of the expression they cast,
        seen through device moves (``x.half().cuda().float()``)."""
        out: dict[int, CallSite] = {}
        for call in self.facts.calls:
            if not _casts_to_fp32(self.facts, call):
                continue
            receiver = call.receiver
            while True:
                if receiver is not None:
                    out[id(receiver)] = call
                if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) \
                        and receiver.func.attr.value in ("to", "cuda", "cpu", "train") \
                        and keyword(receiver, "dtype") is None:
                    receiver = receiver.func.value
                    continue
                break
        return out

    @functools.cached_property
    def double_model(self) -> bool:
        return any(
            dtype == "float64" and is_model_expr(self.facts, call) for call, dtype in self.casts
        ) or any(
            (c.qualname or "") == "torch.set_default_dtype" and c.node.args
            and dtypes_of(self.facts, c.node.args[0].value) == frozenset({"float64"})
            for c in self.facts.calls
        )

    @functools.cached_property
    def uses_lbfgs(self) -> bool:
        return any((c.qualname or "").endswith("optim.LBFGS") for c in self.facts.calls)

    @functools.cached_property
    def uses_gradient_penalty(self) -> bool:
        """``torch.autograd.grad(..., create_graph=True)``: a gradient penalty (WGAN-GP, R1). Under a
        GradScaler its gradients are computed from the unscaled output, so fp16 needs the AMP recipe
        written by hand (scale the outputs, unscale the gradients, skip on inf); bf16 needs none."""
        return gradient_penalty_call(self.facts) is not None

    @functools.cached_property
    def has_optimizer(self) -> bool:
        return bool(self.facts.optimizer_steps) or bool(self.facts.optimizers)

    @functools.cached_property
    def is_conv_model(self) -> bool:
        """The script's text says the model is a convnet: a 2-D (or wider than 1x1 1-D) convolution or a
        torchvision convnet family, and no attention anywhere (a Transformer whose feed-forward is a 1x1
        ``Conv1d`` is a Transformer)."""
        facts = self.facts
        if self.has_attention:
            return False
        for call in facts.calls:
            qual = call.qualname or ""
            if qual.startswith("torch.nn.Conv") and not _pointwise_conv1d(call) or qual.startswith(
                "torchvision.models") and any(
                key in qual for key in ("resnet", "resnext", "vgg", "efficientnet", "mobilenet", "regnet",
                                        "convnext", "densenet", "inception", "googlenet", "squeezenet",
                                        "shufflenet", "mnasnet", "alexnet", "wide_resnet")
            ):
                return True
        quals = facts.referenced_qualnames
        return any("torchvision.models" in q for q in quals) and not any("vit" in q or "swin" in q for q in quals)

    @functools.cached_property
    def has_attention(self) -> bool:
        """Attention anywhere in the script: an attention or Transformer module, SDPA, a class named
        ``*Attention*``, or a softmax in a function that multiplies matrices (``softmax(q @ k.T)``)."""
        facts = self.facts
        if any("attention" in node.name.value.lower() or "transformer" in node.name.value.lower()
               for node, _ in facts.classes):
            return True
        for call in facts.calls:
            qual = call.qualname or ""
            if qual in _ATTENTION_CALLS or qual.startswith("torch.nn.Transformer"):
                return True
            if (qual in _SOFTMAX_CALLS or call.method == "softmax") and _has_matmul(
                    call.ctx.function if call.ctx.function is not None else call.node):
                return True
        return False

    @functools.cached_property
    def fp16_overflow(self) -> tuple[CallSite, float] | None:
        """The first fill of a constant beyond fp16's range (``scores.masked_fill(mask, -1e9)``,
        ``torch.finfo(torch.float32).min``): under fp16 autocast its tensor is half, and the fill raises
        "value cannot be converted to type at::Half without overflow". Infinities fit in fp16."""
        for call in self.facts.calls:
            name = call.method if call.method in _FILL_POSITIONS else (call.qualname or "")
            spec = _FILL_POSITIONS.get(name)
            if spec is None:
                continue
            value = _fill_magnitude(self.facts, call.arg(spec[0], spec[1]))
            if value is not None and FP16_MAX < abs(value) < float("inf"):
                return call, value
        return None

    @functools.cached_property
    def contrastive_temperature(self) -> cst.CSTNode | None:
        """The first division of logits by a temperature (``logits /= self.T``, ``sim / temperature``,
        ``/ args.moco_t``) in a function that multiplies matrices: an InfoNCE or NT-Xent loss (MoCo,
        SimCLR). Its gradient carries ``1 / (batch * T)``; at T = 0.07 and a small per-GPU batch, fp16's
        GradScaler at its initial scale overflows in the first backward passes and skips those updates
        (see :meth:`recommended_precision`)."""
        for function, _ in self.facts.functions:
            found = remembered(function, "temperature division",
                               lambda function=function: _temperature_division(function))
            if found is not None and not self.facts.function_is_eval(function):
                return found  # (a sampling temperature, ``generate``'s, is not a loss's)
        return None

    @functools.cached_property
    def contrastive_companions(self) -> tuple[str, ...]:
        """What else of a MoCo-style model the script has: a momentum (EMA) encoder updated from the trained
        one (``param_k.data = param_k.data * m + param_q.data * (1. - m)``, ``.mul_(m).add_(...)``,
        ``lerp_``) and a queue of past keys (``register_buffer("queue", ...)``)."""
        found = []
        text = strip_comments(self.facts.source.text)
        if _MOMENTUM_UPDATE.search(text):
            found.append("a momentum encoder")
        if _KEY_QUEUE.search(text):
            found.append("a queue of past keys")
        return tuple(found)

    def recommended_precision(
        self, setting: str, convnet: bool | None = None, gpu: "gpus.Target | None" = None, compiled: bool = False
    ) -> tuple[str, bool, str]:
        """(dtype, needs GradScaler, why) for a TC201 fix under ``precision = setting`` on the target
        ``gpu`` (None: ``auto``, no GPU known); ``convnet`` is the model audit's verdict on the trained model (None: judge
        from the script's text). A GPU without bf16 Tensor Cores (before sm_80: V100, T4) gets fp16 and
        a GradScaler unless the configuration asks for bf16. A constant fill beyond fp16's range makes
        it bf16 whatever the setting: fp16 would raise at that fill. ``compiled``: ``fix --compile``
        compiles every trained model, which changes the convnet recipe (bf16, see ``_precision_choice``)."""
        target = gpu if gpu is not None else gpus.target(gpus.AUTO)
        dtype, scaler, why = self._precision_choice(setting, convnet, target, compiled)
        overflow = self.fp16_overflow
        if dtype != HALF or overflow is None:
            return dtype, scaler, why
        call, value = overflow
        what = call.method or call.name or "a fill"
        where = f" at line {self.facts.line_of(call.node)}"
        tail = "" if target.has_bf16 else (
            f" ({target.gpu.label if target.gpu else target.setting} has no bf16 Tensor Cores: slower, but it trains)")
        return BF16, False, (f"`{what}` fills {value:g}{where}, beyond fp16's range (±65,504): under fp16 it "
                             f"raises 'value cannot be converted to type at::Half without overflow', so bf16"
                             f"{tail}")

    def _precision_choice(
        self, setting: str, convnet: bool | None, target: gpus.Target, compiled: bool
    ) -> tuple[str, bool, str]:
        if setting == "auto" and not target.has_bf16:
            lacks = f"{target.gpu.label if target.gpu else target.setting} has no bf16 Tensor Cores"
            if self.uses_lbfgs or not self.has_optimizer:
                return BF16, False, (f"{lacks}, but fp16 needs a GradScaler, which cannot drive an LBFGS closure "
                                     "or manual updates: bf16 runs, without Tensor Cores")
            if self.uses_gradient_penalty:
                return BF16, False, (f"{lacks}, but fp16 needs a GradScaler, and the gradient penalty's "
                                     "autograd.grad would then need its outputs scaled by hand: bf16 runs, "
                                     "without Tensor Cores")
            return HALF, True, f"{lacks}: fp16 with a GradScaler"
        if setting == "bf16":
            return BF16, False, "precision = bf16 in the configuration"
        if setting == "fp16":
            if self.uses_lbfgs or not self.has_optimizer:
                return BF16, False, "fp16 needs a GradScaler, which cannot drive an LBFGS closure or manual updates"
            if self.uses_gradient_penalty:
                return BF16, False, ("fp16 needs a GradScaler, and the gradient penalty's autograd.grad would then need "
                                     "its outputs scaled and its gradients unscaled by hand")
            return HALF, True, "precision = fp16 in the configuration"
        if self.uses_lbfgs or not self.has_optimizer:
            return BF16, False, "bf16 needs no GradScaler (LBFGS closures and manual updates cannot use one)"
        if self.uses_gradient_penalty:
            return BF16, False, ("bf16 needs no GradScaler: the gradient penalty's autograd.grad runs on unscaled "
                                 "outputs, which fp16 would need scaled by hand")
        temperature = self.contrastive_temperature
        if temperature is not None:  # ``auto`` on a GPU with bf16 (a GPU without it got fp16 above)
            # benchmarks/moco_fp16.py on an H100 (torch 2.11, benchmarks/results/h100/moco_fp16_*.json).
            divisor = temperature.value if isinstance(temperature, cst.AugAssign) else temperature.right
            extra = "".join(f", {what}" for what in self.contrastive_companions)
            return BF16, False, (
                f"contrastive logits divided by a temperature (`{full_name(divisor)}` at line "
                f"{self.facts.line_of(temperature)}{extra}): their gradients carry 1/(batch x T), which fp16's "
                "GradScaler at its initial 65,536 overflows at small per-GPU batches and skips the first updates; "
                "bf16 keeps fp32's range and needs no scaler (fp16 ran a MoCo ResNet50 step 19% faster on an "
                "H100, and trains too where its skipped steps are acceptable: precision = fp16)"
            )
        if self.is_conv_model if convnet is None else convnet:
            if compiled:
                # benchmarks/convnet_recipe.py on an H200 (torch 2.11, BENCHMARKS.md): compiled ResNet50 ran
                # bf16 + fused SGD at 6,533 img/s, fp16 + GradScaler + foreach SGD at 6,175; fused SGD under
                # a GradScaler went NaN in eager mode, so fp16 cannot have the fused update.
                return BF16, False, (
                    "convnet under torch.compile: bf16 with fused SGD trained ResNet50 faster than fp16 + GradScaler"
                )
            return HALF, True, (
                "convnet: eager fp16 + channels_last trained ResNet50 faster than bf16"
            )
        return BF16, False, "bf16 keeps fp32's range: no GradScaler, no overflow in large activations"


FP16_MAX = 65504.0
# A temperature's name (``T``, ``self.T``, ``tau``, ``temperature``, ``args.moco_t``, ``self.temp``); not
# ``t`` or ``warmup_t``, a loop's step or a schedule's length.
_TEMPERATURE = re.compile(
    r"^(?:\w+\.)*(?:T|tau|temp|temperature|\w+_(?:tau|temp|temperature)|(?:moco|nce|contrast\w*)_t)$")
_MOMENTUM_UPDATE = re.compile(
    r"\*\s*(?:self\.)?(?:m|momentum)\s*\+[^\n]*\(\s*1(?:\.0?)?\s*-\s*(?:self\.)?(?:m|momentum)\s*\)"
    r"|\.mul_\(\s*(?:self\.)?(?:m|momentum|decay|ema_decay)\s*\)\s*\.add_\(|\.lerp_\(")
_KEY_QUEUE = re.compile(r"register_buffer\(\s*[\"']queue[\"']")
_ATTENTION_CALLS = {
    "torch.nn.MultiheadAttention", "torch.nn.modules.activation.MultiheadAttention",
    "torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.multi_head_attention_forward",
}
_SOFTMAX_CALLS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
# The fills that convert their value to the tensor's dtype (and raise on overflow): the value's
# (keyword, position) by method or function.
_FILL_POSITIONS = {
    "masked_fill": ("value", 1), "masked_fill_": ("value", 1), "fill_": ("value", 0),
    "index_fill": ("value", 2), "index_fill_": ("value", 2), "fill_diagonal_": ("fill_value", 0),
    "new_full": ("fill_value", 1), "torch.full": ("fill_value", 1), "torch.full_like": ("fill_value", 1),
    "torch.masked_fill": ("value", 2),
}
_WIDE_DTYPES = {"float32", "float", "float64", "double"}


def _pointwise_conv1d(call: CallSite) -> bool:
    """``nn.Conv1d(d, 4 * d, 1)``: a 1x1 convolution over a sequence, i.e. a per-token linear layer."""
    if not (call.qualname or "").startswith("torch.nn.Conv1d"):
        return False
    kernel = call.arg("kernel_size", 2)
    return isinstance(kernel, cst.Integer) and kernel.value == "1"


def _temperature_division(function: cst.FunctionDef) -> cst.CSTNode | None:
    """The first division by a temperature in ``function``, where it multiplies matrices (its tree alone
    says: remembered while an editor's edits leave the function as it is)."""
    if not _has_matmul(function):
        return None
    for node in nodes_of(function, (cst.AugAssign, cst.BinaryOperation)):
        if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            divisor = node.value
        elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            divisor = node.right
        else:
            continue
        if _TEMPERATURE.match(full_name(divisor) or ""):
            return node
    return None


def _has_matmul(node: cst.CSTNode) -> bool:
    """Whether ``node`` holds a matrix product (``@``, ``matmul``, ``bmm``, ``einsum``)."""
    if any(isinstance(op.operator, cst.MatrixMultiply) for op in nodes_of(node, cst.BinaryOperation)):
        return True
    return any((full_name(c.func) or "").rsplit(".", 1)[-1] in ("matmul", "bmm", "einsum", "baddbmm")
               for c in call_nodes(node))


def _fill_magnitude(facts: ScriptFacts, expr: cst.BaseExpression | None) -> float | None:
    """The value of a fill: a numeric constant, or ``torch.finfo(torch.float32).min``/``.max`` (the
    range of a dtype wider than fp16, negated or not)."""
    if expr is None:
        return None
    inner = expr.expression if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) else expr
    if (isinstance(inner, cst.Attribute) and inner.attr.value in ("min", "max") and isinstance(inner.value, cst.Call)
            and (full_name(inner.value.func) or "").endswith("finfo") and inner.value.args):
        dtype = (full_name(inner.value.args[0].value) or "").rsplit(".", 1)[-1]
        return (-3.4e38 if inner is not expr else 3.4e38) if dtype in _WIDE_DTYPES else None
    value = numeric_constant(facts, expr)
    return float(value) if value is not None else None


def gradient_penalty_call(facts: ScriptFacts) -> CallSite | None:
    """The first ``torch.autograd.grad(..., create_graph=True)`` of the script: a gradient penalty whose
    gradients are differentiated again (double backward)."""
    for call in facts.calls:
        if (call.qualname or "") != "torch.autograd.grad":
            continue
        create_graph = call.arg("create_graph", 4)
        if create_graph is not None and not (isinstance(create_graph, cst.Name) and create_graph.value == "False"):
            return call
    return None


def cast_dtype(facts: ScriptFacts, call: CallSite) -> str | None:
    method = call.method
    if method == "half" and not call.node.args:
        return HALF
    if method == "bfloat16" and not call.node.args:
        return BF16
    if method == "double" and not call.node.args:
        return "float64"
    if method in ("to", "type"):
        for arg in call.node.args:
            if arg.keyword is not None and arg.keyword.value not in ("dtype",):
                continue
            found = dtypes_of(facts, arg.value)
            for dtype in (HALF, BF16, "float64"):
                if found == frozenset({dtype}):
                    return dtype
            text = full_name(arg.value) or ""
            if text.endswith("HalfTensor"):
                return HALF
    return None


def _casts_to_fp32(facts: ScriptFacts, call: CallSite) -> bool:
    if call.method == "float" and not call.node.args:
        return True
    if call.method in ("to", "type"):
        return any(
            (arg.keyword is None or arg.keyword.value == "dtype") and dtypes_of(facts, arg.value) == frozenset({"float32"})
            for arg in call.node.args
        )
    return False


def _cast_model_name(call: CallSite) -> str | None:
    """The name a model cast works on: its receiver (``model`` of ``model.cuda().half()``) or, for
    ``model = Net().half()``, the name it binds."""
    receiver = call.receiver
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        receiver = receiver.func.value
    if isinstance(receiver, (cst.Name, cst.Attribute)):
        return full_name(receiver)
    statement = call.statement.node if call.statement else None
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return full_name(small.targets[0].target)
    return None


def is_model_expr(facts: ScriptFacts, call: CallSite) -> bool:
    """Whether the cast call's receiver is the trained model (not an input tensor)."""
    receiver = call.receiver
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
        inner = receiver.func.attr.value
        if inner in ("to", "cuda", "cpu", "half", "float", "train"):
            receiver = receiver.func.value
            continue
        break
    name = full_name(receiver) if receiver is not None else None
    if name and name in facts.model_names:
        return True
    if isinstance(receiver, cst.Call):
        statement = call.statement.node if call.statement else None
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    for target in small.targets:
                        if full_name(target.target) in facts.model_names:
                            return True
    return False


# Ops autocast cannot run: binary cross-entropy on probabilities raises, sparse multiplies have no fp16 kernel.
BCE_FUNCTIONS = frozenset({"torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy"})
BCE_MODULES = frozenset({"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})
SPARSE_MM = frozenset({"torch.sparse.mm", "torch.sparse.addmm", "torch.sspaddmm", "torch.sparse.sampled_addmm"})


def unsafe_kind(facts: ScriptFacts, call: CallSite) -> str | None:
    """"bce" or "sparse" for a call autocast cannot run (TC208), else None."""
    qual = call.qualname or ""
    if qual in BCE_FUNCTIONS:
        return "bce"
    if qual in SPARSE_MM:
        return "sparse"
    func = call.node.func
    if isinstance(func, cst.Call) and facts.qualname(func.func) in BCE_MODULES:
        return "bce"  # nn.BCELoss()(p, y)
    if isinstance(func, (cst.Name, cst.Attribute)):
        name = full_name(func)
        if name and facts.bindings_of(name):
            for value in facts.binding_values(func):
                if isinstance(value, cst.Call) and facts.qualname(value.func) in BCE_MODULES:
                    return "bce"
    return None


def amp_facts(facts: ScriptFacts) -> AmpFacts:
    return facts.derived(AmpFacts, AmpFacts)


def _path_to(body: tuple[cst.CSTNode, ...], anchor: cst.CSTNode) -> list[tuple[tuple[cst.CSTNode, ...], int]]:
    """(block, index) of each statement from ``body`` down to ``anchor``, outermost first; empty when
    ``anchor`` is not in it (nested functions and classes are not searched)."""
    for index, node in enumerate(body):
        if node is anchor:
            return [(body, index)]
        for inner in _inner_blocks(node):
            path = _path_to(inner, anchor)
            if path:
                return [(body, index), *path]
    return []


def _inner_blocks(node: cst.CSTNode) -> list[tuple[cst.CSTNode, ...]]:
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)) or not isinstance(node, cst.BaseCompoundStatement):
        return []
    suites: list[cst.BaseSuite] = [node.body]
    if isinstance(node, cst.If):
        orelse = node.orelse
        if isinstance(orelse, cst.If):
            return [*_inner_blocks_of_suite(node.body), *_inner_blocks(orelse)]
        if isinstance(orelse, cst.Else):
            suites.append(orelse.body)
    elif isinstance(node, (cst.For, cst.While)) and node.orelse is not None:
        suites.append(node.orelse.body)
    elif isinstance(node, cst.Try):
        suites += [h.body for h in node.handlers]
        suites += [part.body for part in (node.orelse, node.finalbody) if part is not None]
    return [block for suite in suites for block in _inner_blocks_of_suite(suite)]


def _inner_blocks_of_suite(suite: cst.BaseSuite) -> list[tuple[cst.CSTNode, ...]]:
    return [tuple(suite.body)] if isinstance(suite, cst.IndentedBlock) else []


def _argument_for(function: cst.FunctionDef, call: CallSite, param: str) -> cst.BaseExpression | None:
    """The expression ``call`` passes for ``param`` of ``function``; None when it cannot be told."""
    if any(arg.star for arg in call.node.args):
        return None
    names = param_names(function, stars=False)
    bound = "." in (call.name or "") or function.name.value == "__call__"  # ``obj.m(x)``, ``obj(x)``: self is bound
    offset = 1 if names and names[0] in ("self", "cls") and bound else 0
    given = keyword(call.node, param, names.index(param) - offset)
    return given.value if given is not None else None


def autocast_dtype_for(
    facts: ScriptFacts, precision: str, models: "AuditedModels | None", gpu: "gpus.Target | None" = None,
    compiled: bool = False,
) -> str:
    """The autocast dtype (``"float16"``/``"bfloat16"``) TC201's fix writes for this script under the
    ``precision`` setting on the target ``gpu``: the convnet recipe where the model audit (or the
    script's text) says the trained model is a convnet (another one where ``compiled``: ``fix --compile``
    compiles the trained models); fp16 on a GPU without bf16."""
    from tcaudit.script.pipeline import pipeline_facts

    convnet = pipeline_facts(facts).audited_convnet(models)
    return amp_facts(facts).recommended_precision(precision, convnet, gpu, compiled)[0]
