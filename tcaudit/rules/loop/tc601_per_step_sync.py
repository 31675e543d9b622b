"""TC601 per-step-sync: a device-to-host sync in the body of the training loop, every step.

No automatic fix (each finding says why): how often to log is the user's decision, and an
accumulator (``running_loss += loss.item()``) kept on the device changes the type every later use of
it sees, so the change is left to the user, with the recipe in the reason.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterator

import libcst as cst

from tcaudit.findings import Finding, Fix, FixClass, Related, Severity, mirrored_at
from tcaudit.project.frameworks import lightning_training_steps, loop_owners
from tcaudit.project.importers import training_importers
from tcaudit.project.modules import load_module
from tcaudit.project.symbols import Symbol
from tcaudit.rules.base import RuleContext, ScriptRule
from tcaudit.script.aliasing import chain_root, expression_chain
from tcaudit.script.distributed import DistributedFacts, distributed_facts, in_test_code, literal_value
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.host_sync import SYNC_METHODS, SYNCHRONIZE
from tcaudit.script.steps import is_interval_guard, is_opt_in_flag, runs_every_step
from tcaudit.source.syntax import full_name, keyword, nodes_of

TENSORBOARD_METHODS = ("add_scalar", "add_scalars", "add_histogram")
_LOSS_CALL = re.compile(r"loss|criterion|crit$", re.IGNORECASE)
_PACKING = re.compile(r"pack_padded_sequence|pack_sequence")
_NUMPY_CHAIN = re.compile(r"\bnp\.|\bnumpy\.")


def _is_sync_method_call(node: cst.BaseExpression) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in SYNC_METHODS
        and not any(a.keyword is None for a in node.args)
    )


def _numpy_rooted(facts: ScriptFacts, receiver: cst.BaseExpression, depth: int = 0) -> bool:
    """The receiver is built only from NumPy values (``np.…(...)``, ``x.numpy()``, names every binding of
    which is one, numbers): its ``.tolist()`` reads host memory; any sync happened at the ``.cpu()``
    that made it, which is reported on its own line."""
    if depth > 4:
        return False
    operands = [receiver]
    numpy = False
    while operands:
        node = operands.pop()
        if isinstance(node, cst.BinaryOperation):
            operands += [node.left, node.right]
        elif isinstance(node, cst.Comparison):
            operands += [node.left] + [target.comparator for target in node.comparisons]
        elif isinstance(node, cst.UnaryOperation):
            operands.append(node.expression)
        elif isinstance(node, (cst.Integer, cst.Float)):
            continue
        elif _is_numpy_call(facts, node):
            numpy = True
        else:
            root = chain_root(node)
            if _is_numpy_call(facts, root) or any(_is_numpy_call(facts, part) for part in expression_chain(node)):
                numpy = True
                continue
            if not isinstance(root, cst.Name):
                return False
            bindings = facts.bindings_of(root.value)
            if not bindings or not all(
                binding.value is not None and _numpy_rooted(facts, binding.value, depth + 1) for binding in bindings
            ):
                return False
            numpy = True
    return numpy


def _is_numpy_call(facts: ScriptFacts, node: cst.BaseExpression) -> bool:
    """``x.numpy()`` or a call of a NumPy function (``np.array(...)``)."""
    if not isinstance(node, cst.Call):
        return False
    if isinstance(node.func, cst.Attribute) and node.func.attr.value == "numpy":
        return True
    return _NUMPY_CHAIN.match((facts.qualname(node.func) or full_name(node.func) or "") + ".") is not None


class _Tensors:
    """Names that hold tensors in training code: losses and model outputs, never rebound to a number."""

    def __init__(self, facts: ScriptFacts) -> None:
        names: set[str] = set()
        for step in facts.training_steps:
            loss = step.loss
            if isinstance(loss, cst.Call) and loss.args and step.scaler:
                loss = loss.args[0].value
            dotted = full_name(loss) if isinstance(loss, (cst.Name, cst.Attribute)) else None
            if dotted:
                names.add(dotted)
        for binding in facts.bindings:
            value = binding.value
            if not isinstance(value, cst.Call):
                continue
            func = full_name(value.func) or ""
            qual = facts.qualname(value.func) or ""
            last = func.split(".")[-1]
            if qual.startswith("torch.nn.") and last[:1].isupper():
                continue  # ``criterion = nn.CrossEntropyLoss()`` builds a module, not a tensor
            if func in facts.model_names or _LOSS_CALL.search(last) or qual.startswith("torch.nn.functional."):
                names.add(binding.target)
        self.names = {n for n in names if not any(self._is_number(facts, b.value) for b in facts.bindings_of(n))}

    @staticmethod
    def _is_number(facts: ScriptFacts, value: cst.BaseExpression) -> bool:
        if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return True
        if isinstance(value, cst.Call):
            func = full_name(value.func) or ""
            if func in ("float", "int", "str", "round", "len") or func.endswith((".item", ".tolist")):
                return True
        return False

    def raw_uses(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """Tensor names an expression formats or passes as they are (``loss``, ``f"{loss:.3f}"``,
        ``"%f" % loss``, ``loss.detach()``), not through ``loss.item()`` or ``loss.shape``."""
        out: list[cst.BaseExpression] = []
        self._collect(expr, out)
        return out

    def _collect(self, expr: cst.BaseExpression, out: list[cst.BaseExpression]) -> None:
        if isinstance(expr, (cst.Name, cst.Attribute)):
            dotted = full_name(expr)
            if dotted in self.names:
                out.append(expr)
        elif isinstance(expr, cst.FormattedString):
            for part in expr.parts:
                if isinstance(part, cst.FormattedStringExpression):
                    self._collect(part.expression, out)
        elif isinstance(expr, cst.ConcatenatedString):
            self._collect(expr.left, out)
            self._collect(expr.right, out)
        elif isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
            self._collect(expr.right, out)
        elif isinstance(expr, (cst.Tuple, cst.List)):
            for element in expr.elements:
                self._collect(element.value, out)
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            method = expr.func.attr.value
            if method == "format":
                for arg in expr.args:
                    self._collect(arg.value, out)
            elif method in ("detach", "mean", "sum", "float", "clone"):
                self._collect(expr.func.value, out)
        elif isinstance(expr, cst.Call) and full_name(expr.func) == "str" and expr.args:
            self._collect(expr.args[0].value, out)


def _not_parameters(call: CallSite, uses: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """Drop names that are parameters of the enclosing function: ``def log(loss): print(loss)`` is
    often handed ``loss.item()``, a float (and that ``.item()`` is reported where it is called)."""
    fn = call.ctx.function
    if fn is None:
        return uses
    params = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
    params -= {"self", "cls"}
    return [u for u in uses if (full_name(u) or "").split(".")[0] not in params]


# tqdm / rich progress bars and loggers that turn what they are handed into text at once.
_PROGRESS_METHODS = frozenset({"set_postfix", "set_postfix_str", "set_description", "set_description_str", "log_metrics"})
# Calls that take a tensor as a tensor (the step itself, tensorboard's own check).
_PASSES_TENSORS = frozenset({"str"})


def _converts_if_tensor(facts: ScriptFacts, call: CallSite, receiver_text: str) -> bool:
    """``if isinstance(v, torch.Tensor): v = v.item()`` in a helper (torchvision's
    ``MetricLogger.update``): the value is a tensor only when a caller hands one over, usually
    ``loss.item()``, a float; a sync there is the caller's, reported where it is called."""
    if call.ctx.function is None:
        return False
    for frame in call.ctx.chain():
        if frame.kind in ("def", "class", "lambda"):
            break
        test = frame.node.test if frame.kind == "if" and isinstance(frame.node, cst.If) else None
        if (
            isinstance(test, cst.Call) and full_name(test.func) == "isinstance" and len(test.args) == 2
            and facts.code(test.args[0].value) == receiver_text
            and facts.qualname(test.args[1].value) == "torch.Tensor"
        ):
            return True
    return False


def _is_formatting(expr: cst.BaseExpression) -> bool:
    """An f-string, ``"...".format(...)`` or ``"..." % (...)``: text made from its values now. (``type() in``:
    these classes have no subclasses, and ``isinstance`` of LibCST's classes runs ABCMeta's check in
    Python: asked of every argument of every call.)"""
    kind = type(expr)
    if kind in _FORMATTED:
        return True
    if kind is cst.BinaryOperation and type(expr.operator) is cst.Modulo:
        return type(expr.left) in _STRINGS
    return (
        kind is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value == "format"
        and type(expr.func.value) in (cst.SimpleString, cst.ConcatenatedString)
    )


_FORMATTED = (cst.FormattedString, cst.ConcatenatedString)
_STRINGS = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)


def _dict_uses(tensors: "_Tensors", expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """Tensor values of a dict literal (``wandb.log({"loss": loss})``, ``set_postfix({"loss": loss})``)."""
    out: list[cst.BaseExpression] = []
    if isinstance(expr, cst.Dict):
        for element in expr.elements:
            if isinstance(element, cst.DictElement):
                out += tensors.raw_uses(element.value)
    return out


def _after_micro_steps(facts: ScriptFacts, info: DistributedFacts, ctx: Frame) -> str | None:
    """How many micro-steps a gradient-accumulation loop runs before the sync at ``ctx``: the sync sits
    in the optimizer-step loop, after an inner loop that holds the backward (nanoGPT's
    ``for micro_step in range(gradient_accumulation_steps): ... loss.backward()``). None otherwise."""
    loops = [f for f in ctx.chain() if f.kind == "loop"]
    if not loops:
        return None
    outer = loops[0]
    for step in facts.training_steps:
        if step.ctx.inside(outer.node) and not ctx.inside(step.ctx.nearest("loop").node if step.ctx.nearest("loop") else outer.node):
            inner = step.ctx.nearest("loop")
            if inner is None or inner.node is outer.node or not any(
                c.ctx.inside(outer.node) and not c.ctx.inside(inner.node) for c in facts.optimizer_steps
            ):
                continue
            node = inner.node
            if isinstance(node, cst.For) and isinstance(node.iter, cst.Call) and full_name(node.iter.func) == "range" and node.iter.args:
                return f"`{facts.code(node.iter.args[-1].value)}`"
            return "several"
    return None


_FINITE_CHECKS = frozenset({"math.isfinite", "math.isnan", "math.isinf", "numpy.isfinite", "numpy.isnan", "numpy.isinf"})


def _guarded_name(facts: ScriptFacts, call: CallSite) -> str | None:
    """The name a sync's value is assigned to when the next statements test it for a non-finite value
    and stop the run (``loss_value = loss.item()`` then ``if not math.isfinite(loss_value): sys.exit(1)``,
    the torchvision references' guard): a correctness check, not logging."""
    statement = call.statement
    if statement is None or not isinstance(statement.node, cst.SimpleStatementLine):
        return None
    assign = statement.node.body[0] if len(statement.node.body) == 1 else None
    if not isinstance(assign, cst.Assign) or assign.value is not call.node or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    if not isinstance(target, cst.Name):
        return None
    for later in statement.block[statement.index + 1:statement.index + 4]:
        if not isinstance(later, cst.If):
            continue
        tests = [c for c in nodes_of(later.test, cst.Call)
                 if (facts.qualname(c.func) or "") in _FINITE_CHECKS
                 and any(isinstance(a.value, cst.Name) and a.value.value == target.value for a in c.args)]
        stops = nodes_of(later.body, (cst.Raise, cst.Return, cst.Break)) or [
            c for c in nodes_of(later.body, cst.Call) if (facts.qualname(c.func) or "") in ("sys.exit", "exit", "quit")
        ]
        if tests and stops:
            return target.value
    return None


def _host_waits(facts: ScriptFacts, info: DistributedFacts) -> bool:
    """Whether a sync in this file's training makes the host wait for a GPU. Not in an RL script (every
    environment step already brings the action to the host, so the GPU waits on the environment, not
    on a loss.item() in the update), nor in a CPU-only one (the host is the device)."""
    return not info.is_rl_script and (facts.uses_cuda or facts.uses_accelerator)


def _short(name: str | None, limit: int = 32) -> str:
    name = name or ""
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def _within(facts: ScriptFacts, fn: cst.FunctionDef, line: int) -> bool:
    position = facts.position(fn)
    return position.start.line <= line <= position.end.line


def _every_call(facts: ScriptFacts, ctx: Frame, fn: cst.FunctionDef) -> str | bool:
    """Whether code at ``ctx`` runs every time ``fn`` (around it) runs: False under an interval or
    opt-in guard or in an ``except``; else the text of the innermost loop around it inside ``fn``
    (``p in model.parameters()``: it runs once per item), or "" where it runs once."""
    loop = ""
    for frame in ctx.chain():
        if frame.node is fn:
            return loop
        if frame.kind == "if" and (is_interval_guard(facts, frame.node.test) or is_opt_in_flag(facts, frame.node.test)):  # type: ignore[attr-defined]
            return False
        if frame.kind in ("except", "lambda", "class") or (frame.kind == "def" and frame.node is not fn):
            return False
        if frame.kind == "loop" and not loop:
            node = frame.node
            if isinstance(node, cst.For):
                loop = " ".join(f"{facts.code(node.target)} in {facts.code(node.iter)}".split())
                loop = loop if len(loop) <= 50 else loop[:47] + "…"
            else:
                loop = "a while loop"
    return False


class PerStepSync(ScriptRule):
    id = "TC601"
    # Necessary: a training step (a sync can be any formatting of a tensor, so no narrower text).
    # Or a call that may run a training loop of another module (``trainer.fit(...)``, ``train(...)``):
    # a prefilter only, what is reported is decided by following the call.
    triggers = (r"\.backward\(|\.step\(|\b(fit|train)\w*\(|\blogging_steps\b|\blog_every_n_steps\b",)
    # A helper module with a sync that training scripts of the project import (a loss helper, a meter):
    # judged from those scripts, so a scan of the helper alone (the editor, pre-commit) reports it.
    helper_triggers = (r"\.(item|cpu|numpy|tolist)\(|synchronize\(",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        info = distributed_facts(facts)
        cost = context.cost(self.spec, "per_step")
        yield from self._in_framework_steps(facts, info, context, cost)
        yield from self._framework_logging(facts, context, cost)
        own: list[Finding] = []
        if _host_waits(facts, info):
            if info.step_loops:
                own = list(self._in_this_module(facts, info, cost))
            own += self._in_other_modules(facts, info, context, cost)
            yield from own
        yield from self._for_scripts(facts, context, {(f.location.line, f.location.column) for f in own})

    def _for_scripts(self, facts: ScriptFacts, context: RuleContext,
                     reported: set[tuple[int, int]]) -> Iterator[Finding]:
        """This module's syncs that training scripts of the project run every step through its functions
        (what the scripts' scans report at their calls): reported here too, at the sync, with the call
        as the related place; a folder scan that has both files shows each once."""
        if facts.training_steps:
            return  # a training script itself: what it runs every step is reported where it calls it
        here = facts.source.path.resolve()
        importers = training_importers(here, context.settings.root)
        helper = load_module(here) if importers else None
        if helper is None:
            return  # not imported by a training script, or the module on disk cannot be read
        cost = context.cost(self.spec, "per_step")
        for script_path in importers:
            module = load_module(script_path)
            if module is None:
                continue
            script = module.facts
            info = distributed_facts(script)
            if not _host_waits(script, info):
                continue
            for finding in self._in_other_modules(script, info, context, cost):
                for place in finding.related:
                    loc = place.location
                    if not place.mirror or (loc.line, loc.column) in reported or Path(loc.path).resolve() != here:
                        continue
                    line_text = facts.source.line_text(loc.line)
                    if helper.facts.source.line_text(loc.line) != line_text:
                        continue  # this text is not the module on disk (an editor's unsaved buffer)
                    reported.add((loc.line, loc.column))
                    at = dataclasses.replace(loc, path=facts.source.display_path)
                    yield mirrored_at(finding, at, place.message, line_text)

    def _in_this_module(self, facts: ScriptFacts, info: DistributedFacts, cost: str) -> Iterator[Finding]:
        tensors = _Tensors(facts)
        for call in facts.calls:
            described = self._sync(facts, info, tensors, call)
            if described is None or in_test_code(call.ctx):
                continue
            what, node = described
            if not runs_every_step(facts, call.ctx):
                continue
            micro = _after_micro_steps(facts, info, call.ctx)
            if micro is not None:
                yield self.finding(
                    facts,
                    node,
                    f"{what} syncs once per optimizer step, after {micro} accumulation micro-steps",
                    explanation="A small cost, worth moving under a logging interval.",
                    severity=Severity.INFO,
                    fix=self._fix(facts, call),
                )
                continue
            guard = _guarded_name(facts, call)
            if guard is not None:
                yield self.finding(
                    facts,
                    node,
                    f"{what} feeds a per-step non-finite-loss guard on `{guard}` (deliberate; it syncs every step)",
                    explanation="The guard stops a diverged run at once, which needs the value on the host: "
                    "keep it, or check it under a logging interval if a few more steps of NaN are acceptable.",
                    severity=Severity.INFO,
                    fix=self._fix(facts, call),
                )
                continue
            yield self.finding(
                facts,
                node,
                f"{what} makes the host wait for the GPU every training step",
                fix=self._fix(facts, call),
                explanation=f"A sync per step stalls the queue of GPU work{cost}. Sync under a logging interval "
                "(`if step % log_interval == 0:`).",
            )


    # -- steps a framework calls ---------------------------------------------------------------------
    def _in_framework_steps(self, facts: ScriptFacts, info: DistributedFacts, context: RuleContext,
                            cost: str) -> Iterator[Finding]:
        """A sync in a LightningModule's ``training_step``, which Lightning calls once per batch: on the
        GPU whenever one is present (``accelerator="auto"``), unless a trainer of this file is visibly on
        the CPU. ``self.log(...)`` of a tensor does not sync (Lightning reads it at its logging interval)."""
        steps = lightning_training_steps(facts)
        if not steps or info.is_rl_script:
            return
        values = context.values(facts)
        if any(owner.framework == "lightning" and owner.cpu_only(values) for owner in loop_owners(facts)):
            return
        tensors = _Tensors(facts)
        for fn in steps:
            for call in facts.calls_in(fn):
                described = self._sync(facts, info, tensors, call)
                if described is None or in_test_code(call.ctx) or _every_call(facts, call.ctx, fn) is False:
                    continue
                what, node = described
                yield self.finding(
                    facts,
                    node,
                    f"{what} in `training_step` makes the host wait for the GPU every training step",
                    fix=self._fix(facts, call),
                    explanation=f"Lightning calls `training_step` once per batch and a sync there stalls the queue of "
                    f"GPU work{cost}. Log the tensor with `self.log(...)` (Lightning reads it at its logging "
                    "interval) or sync under `if batch_idx % log_interval == 0:`.",
                )

    def _framework_logging(self, facts: ScriptFacts, context: RuleContext, cost: str) -> Iterator[Finding]:
        """Hugging Face training arguments that log every step (``logging_steps=1``): the Trainer keeps the
        running loss on the GPU and copies it to the host (``.item()``, with the gradient norm) at each
        logging step (transformers 5.25, ``Trainer._maybe_log_save_evaluate``), so every step syncs.
        Silent where ``logging_strategy`` is not "steps", on the CPU, and for a value it cannot read."""
        values = context.values(facts)
        for owner in loop_owners(facts):
            if owner.framework == "lightning" and not owner.cpu_only(values):
                yield from self._lightning_logging(facts, owner, values, cost)
            if owner.framework != "transformers" or owner.parsed_by is not None or owner.cpu_only(values):
                continue
            setting = owner.setting(values, "logging_steps")
            if setting.arg is None or not setting.values or not all(_is_one(v.value) for v in setting.values):
                continue
            strategy = owner.setting(values, "logging_strategy")
            if strategy.arg is not None and (not strategy.values or any(
                    str(getattr(v.value, "value", v.value)).lower() not in ("steps", "intervalstrategy.steps")
                    for v in strategy.values)):
                continue  # logged per epoch, not at all, or a strategy it cannot read
            yield self.finding(
                facts,
                setting.arg,
                f"`{owner.label}` logs every step ({setting.how}): the Trainer copies the loss to the host every step",
                severity=Severity.INFO,
                explanation=f"The Trainer sums the loss on the GPU and reads it (`.item()`, the gradient norm too) "
                f"at each logging step; every step here, so each one waits for the GPU{cost}. Little where each "
                "step is long; a larger `logging_steps` (the default is 500) syncs once per that many steps.",
                fix=Fix(FixClass.SAFE, "log less often", available=False,
                        reason="how often to log is the user's decision: set a larger `logging_steps` by hand"),
            )

    def _lightning_logging(self, facts: ScriptFacts, owner, values, cost: str) -> Iterator[Finding]:
        """A Lightning trainer that logs every step (``log_every_n_steps=1``, in the script or in a
        LightningCLI config) with a logger, for a LightningModule of this file whose ``training_step`` logs
        per step with ``self.log``: at each logging step ``LoggerConnector.log_metrics`` turns every logged
        tensor into a number (``convert_tensors_to_scalars``, ``.item()``; lightning 2.6). Silent with
        ``logger=False`` or ``barebones=True`` (nothing is sent), and where no training step of the file logs
        per step (whether a module of another file does is not followed)."""
        setting = owner.setting(values, "log_every_n_steps")
        if setting.source == "default" or not setting.values:
            return
        ones = (1, "1") if setting.source == "config" else (1,)
        if not all(v.value in ones and type(v.value) is not bool for v in setting.values):
            return
        for key in ("logger", "barebones"):
            held = owner.setting(values, key).values
            off = False if key == "logger" else True
            if held and all(v.value is off for v in held) and owner.setting(values, key).source != "default":
                return
        if not _logs_every_step(facts):
            return
        yield self.finding(
            facts,
            setting.arg if setting.arg is not None else owner.node.func,
            f"Lightning `{owner.label}` logs every step ({setting.how}): the logged tensors reach the host each step",
            severity=Severity.INFO,
            explanation="At each logging step Lightning turns every value `training_step` hands to `self.log` into a "
            "Python number for the loggers (`LoggerConnector.log_metrics`: `.item()`, lightning 2.6); every step "
            f"here, so each one waits for the GPU{cost}. Little where each step is long; Lightning's default "
            "`log_every_n_steps` is 50.",
            fix=Fix(FixClass.SAFE, "log less often", available=False,
                    reason="how often to log is the user's decision: set a larger `log_every_n_steps` (Lightning's "
                    "default is 50) by hand"),
        )

    # -- helpers of other modules ---------------------------------------------------------------------
    def _in_other_modules(self, facts: ScriptFacts, info: DistributedFacts, context: RuleContext, cost: str) -> Iterator[Finding]:
        """A call in the training loop of a function of another project module that syncs every time it
        runs (a loss helper copying its losses to the host, a clipping helper calling ``.item()`` per
        parameter): reported at the call, with the sync's line as a related place."""
        project = context.project(facts)
        here = facts.source.path.resolve()
        for call in facts.calls:
            if call.name is None or in_test_code(call.ctx):
                continue
            callee = project.callee(facts, call)
            if callee is None or callee.function is None or callee.module.path == here:
                continue
            if not runs_every_step(facts, call.ctx):
                yield from self._loop_elsewhere(facts, call, callee, context)
                continue
            syncs = self._helper_syncs(project, callee, 0, set())
            if not syncs:
                continue
            what, node, helper, loop = syncs[0]
            name = f"{callee.owner.name.value}.{callee.name}" if callee.owner is not None else callee.name
            at = f"{helper.source.display_path}:{helper.line_of(node)}"
            times = f" per item of `{loop}`" if loop else ""
            more = f" and {len(syncs) - 1} more" if len(syncs) > 1 else ""
            yield self.finding(
                facts,
                call.node,
                f"`{_short(call.name)}(...)` syncs every training step: {what}{times}{more}",
                explanation=f"`{name}` in {callee.module.display_path} brings a value to the host each time it runs, and the "
                f"training loop calls it every step{cost}. Keep the values on the device there and read them under a "
                "logging interval (`if step % log_interval == 0:`).",
                fix=Fix(
                    FixClass.SAFE,
                    "move the sync under a logging interval",
                    available=False,
                    reason=f"the sync is in {at} (`{name}`), in another module, and how often to log is the user's "
                    "decision: keep the values on the device there and read them less often, by hand",
                ),
                related=[self.place(helper, n, f"{w} syncs every training step (in `{_short(name)}`, called from the loop)",
                                    mirror=True) for w, n, helper, _ in syncs[:8]],
            )

    def _loop_elsewhere(self, facts: ScriptFacts, call: CallSite, callee, context: RuleContext) -> Iterator[Finding]:
        """``trainer.fit(loader)`` of a ``Trainer`` class in another module whose method holds the training
        loop: that module's own per-step syncs inside the method (what a scan of it reports there),
        reported at the script's call too, so a scan of the script alone shows them."""
        helper = callee.facts
        fn = callee.function
        if not helper.training_steps:
            return
        inner = [f for f in self._own_syncs(helper, context) if _within(helper, fn, f.location.line)]
        if not inner:
            return
        first = inner[0]
        name = f"{callee.owner.name.value}.{callee.name}" if callee.owner is not None else callee.name
        more = f" ({len(inner)} places)" if len(inner) > 1 else ""
        at = f"{first.location.path}:{first.location.line}"
        yield self.finding(
            facts,
            call.node,
            f"`{_short(call.name)}(...)` runs `{_short(name)}`'s training loop, which syncs every step{more}",
            explanation=f"{first.message} ({at}); " + first.explanation,
            fix=Fix(FixClass.SAFE, "move the sync under a logging interval", available=False,
                    reason=f"the loop is in {callee.module.display_path} (`{name}`), another module: move the sync "
                    "under a logging interval there, by hand"),
            related=[Related(f.location, f.message, mirror=True) for f in inner[:8]],
        )

    def _own_syncs(self, helper: ScriptFacts, context: RuleContext) -> list[Finding]:
        """This rule's findings on another module's own training loops (not followed further)."""
        key = ("tc601-own", id(helper))
        if key not in context.outcomes:
            info = distributed_facts(helper)
            found = []
            if info.step_loops and _host_waits(helper, info):
                found = list(self._in_this_module(helper, info, context.cost(self.spec, "per_step")))
            context.outcomes[key] = (helper, found)
        return context.outcomes[key][1]

    def _helper_syncs(self, project, callee, depth: int, seen: set[int]) -> list[tuple[str, cst.CSTNode, ScriptFacts, str | None]]:
        """The syncs ``callee`` (a function of a project module) makes every time it runs: its own (not
        under an interval or opt-in guard or in an ``except``) and those of the functions it calls, two
        levels down. Each: (what, node, the module's facts, the loop around it in the function or None)."""
        fn = callee.function
        if fn is None or id(fn) in seen or depth > 2:
            return []
        seen.add(id(fn))
        helper = callee.facts
        if helper.function_is_eval(fn):
            return []
        info = distributed_facts(helper)
        tensors = _Tensors(helper)
        out: list[tuple[str, cst.CSTNode, ScriptFacts, str | None]] = []
        for call in helper.calls_in(fn):
            loop = _every_call(helper, call.ctx, fn)
            if loop is False:
                continue
            described = self._sync(helper, info, tensors, call)
            if described is not None:
                out.append((described[0], described[1], helper, loop or None))
                continue
            inner = None
            if call.name is not None and "." not in call.name:
                local = [f for f in helper.functions_by_name.get(call.name, []) if helper.resolve(call.name) is None]
                if len(local) == 1:
                    inner = Symbol(callee.module, "function", call.name, local[0])
            if inner is None and call.name is not None:
                inner = project.callee(helper, call)
            if inner is not None and inner.function is not None:
                out += [(w, n, h, lp or loop or None) for w, n, h, lp in self._helper_syncs(project, inner, depth + 1, seen)]
        return out

    def _sync(self, facts: ScriptFacts, info: DistributedFacts, tensors: _Tensors, call: CallSite) -> tuple[str, cst.CSTNode] | None:
        node = call.node
        method = call.method
        if _is_sync_method_call(node):
            receiver = call.receiver
            assert receiver is not None
            if any(_is_sync_method_call(inner) for inner in list(expression_chain(receiver))):
                return None  # the inner sync (``x.cpu()`` of ``x.cpu().numpy()``) is the one reported
            receiver_text = facts.code(receiver)
            if _converts_if_tensor(facts, call, receiver_text):
                return None
            if method == "cpu":
                if call.receiver_name in info.module_names or (call.receiver_name or "").endswith(".module"):
                    return None  # moving a model, not reading a value
                if call.statement is not None and _PACKING.search(facts.code(call.statement.node)):
                    return None  # pack_padded_sequence needs its lengths on the CPU
            if method == "numpy" and not any(
                arg.keyword is not None and arg.keyword.value == "force" and literal_value(arg.value) is True
                for arg in node.args
            ):
                return None  # .numpy() refuses CUDA tensors: its sync is the .cpu() before it
            if method == "tolist" and _NUMPY_CHAIN.search(receiver_text):
                return None
            if method == "tolist" and isinstance(receiver, (cst.Name, cst.Attribute)) and receiver_text not in tensors.names:
                return None  # a list or array as often as a tensor
            if method == "tolist" and _numpy_rooted(facts, receiver):
                return None  # ``(scores > 0.5).tolist()`` of ``scores = probs.numpy()``: a NumPy array
            receiver_text = " ".join(receiver_text.split())
            short = receiver_text if len(receiver_text) <= 40 else receiver_text[:37] + "…"
            return f"`{short}.{method}()`", node
        if call.qualname and SYNCHRONIZE.match(call.qualname):
            return f"`{call.name}()`", node
        if method in _PROGRESS_METHODS or (method == "log" and call.receiver_name in ("wandb", "run", "mlflow")):
            for arg in node.args:
                uses = _not_parameters(call, tensors.raw_uses(arg.value) + _dict_uses(tensors, arg.value))
                if uses:
                    return f"`{call.name}(...)` of the tensor `{facts.code(uses[0])}`", node
            return None
        if call.name != "print" and call.name not in _PASSES_TENSORS:
            for arg in node.args:
                if _is_formatting(arg.value):
                    uses = _not_parameters(call, tensors.raw_uses(arg.value))
                    if uses:
                        return f"formatting the tensor `{facts.code(uses[0])}`", node
        if call.name == "print" and not call.method:
            for arg in node.args:
                uses = _not_parameters(call, tensors.raw_uses(arg.value))
                if uses:
                    return f"`print` of the tensor `{facts.code(uses[0])}`", node
            return None
        if method in TENSORBOARD_METHODS and len(node.args) >= 2:
            value = call.arg("scalar_value", 1) or call.arg("values", 1) or node.args[1].value
            uses = _not_parameters(call, tensors.raw_uses(value)) if method != "add_histogram" else [value]
            if uses and (method != "add_histogram" or literal_value(value) is ...):
                return f"`{call.name}(...)` of a tensor", node
        return None

    @staticmethod
    def _fix(facts: ScriptFacts, call: CallSite) -> Fix:
        statement = call.statement
        small = statement.node.body[0] if statement is not None and isinstance(statement.node, cst.SimpleStatementLine) and len(statement.node.body) == 1 else None
        if call.method == "item" and isinstance(small, cst.AugAssign) and small.value is call.node:
            target = facts.code(small.target)
            return Fix(
                FixClass.SAFE,
                f"accumulate `{target}` as a tensor (`.detach()` instead of `.item()`) and call `.item()` where it is logged",
                available=False,
                reason=f"`{target}` would then hold a tensor wherever it is read later (formatting, JSON, "
                "comparisons); accumulate `.detach()` and call `.item()` where it is logged, by hand",
            )
        return Fix(
            FixClass.SAFE,
            "move the sync under a logging interval",
            available=False,
            reason="how often to log is the user's decision; the value must be kept on the device or logged less often by hand",
        )


def _logs_every_step(facts: ScriptFacts) -> bool:
    """Whether a ``training_step`` of this file's LightningModules calls ``self.log``/``self.log_dict`` without
    ``on_step=False`` (in ``training_step`` Lightning logs on each step by default)."""
    for fn in lightning_training_steps(facts):
        for call in facts.calls_in(fn):
            if call.receiver_name != "self" or call.method not in ("log", "log_dict"):
                continue
            on_step = keyword(call.node, "on_step")
            if on_step is None or literal_value(on_step.value) is not False:
                return True
    return False


def _is_one(value: object) -> bool:
    """``logging_steps`` of 1 (an int: a float below 1 is a fraction of the run's steps)."""
    return type(value) is int and value == 1
