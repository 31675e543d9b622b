"""TC209 apex-amp: mixed precision through NVIDIA apex's ``amp`` (deprecated, unmaintained).

``apex.amp`` was folded into PyTorch as ``torch.amp`` in 1.6 and has been deprecated since; it needs
a CUDA build of apex matching the installed PyTorch, and its O2/O3 levels keep fp16 master copies in
ways ``torch.compile``, FSDP and fused optimizers do not know about.

Fix (numerics), for the standard shape only: one ``amp.initialize(model, optimizer, opt_level=...)``
and one ``with amp.scale_loss(loss, optimizer) as s: s.backward()`` followed by ``optimizer.step()``
become ``scaler = torch.amp.GradScaler(<device type>, enabled=<opt_level in O1/O2>)``, the forward
and loss under ``torch.autocast(<device type>, dtype=torch.float16, enabled=scaler.is_enabled())``,
``scaler.scale(loss).backward()`` and ``scaler.step(optimizer); scaler.update()``; the ``from apex
import amp`` import goes when nothing else uses it. Anything else (several optimizers or losses,
``amp.master_params``, ``opt_level="O3"``, apex's checkpoint state) is reported without a fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_expression, parse_statement, torch_import_name
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.callers import callers_of
from tcaudit.script.devices import device_expression
from tcaudit.script.distributed import literal_value
from tcaudit.script.facts import CallSite, ScriptFacts, TrainingStep, loss_statements
from tcaudit.script.guards import extra_conditions
from tcaudit.source.syntax import full_name, nodes_of

INITIALIZE = "apex.amp.initialize"
SCALE_LOSS = "apex.amp.scale_loss"
SCALER = "scaler"
_ALLOWED_KEYWORDS = frozenset({"opt_level", "loss_scale", "verbosity"})


@dataclass(frozen=True, eq=False)
class MigrateToTorchAmp(FixPlan):
    kind = "apex-to-torch-amp"
    initialize: cst.SimpleStatementLine  # ``model, optimizer = amp.initialize(...)``
    initialize_code: tuple[str, ...]  # what replaces it: the scaler (and the rebinding when names differ)
    scale_loss: cst.With  # ``with amp.scale_loss(loss, optimizer) as s: s.backward()``
    backward_code: str  # ``scaler.scale(loss).backward()``
    optimizer_step: cst.SimpleStatementLine  # ``optimizer.step()``
    optimizer: str
    forward: tuple[cst.BaseStatement, ...]  # the forward and loss statements to put under autocast; empty when they are
    autocast_code: str
    imports: tuple[cst.SimpleStatementLine, ...]  # ``from apex import amp`` when nothing else needs it
    step_function: cst.FunctionDef | None  # when the scaler must be passed to the step's function
    step_call: cst.Call | None
    # ``amp.initialize`` runs under an ``if`` the step does not (``if args.amp:``): a disabled scaler
    # is created before that ``if`` so the name exists on the plain path too.
    disabled_before: cst.If | None = None
    disabled_code: str = ""


class ApexAmp(ScriptRule):
    id = "TC209"
    triggers = (r"apex",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        initializes = facts.calls_to(INITIALIZE)
        scale_losses = facts.calls_to(SCALE_LOSS)
        if not initializes and not scale_losses:
            return
        site = initializes[0] if initializes else scale_losses[0]
        yield self.finding(
            facts, site.node,
            "apex.amp is deprecated and unmaintained; use torch.amp",
            explanation="apex.amp needs a matching CUDA build of apex. Use `torch.autocast` around the forward "
            "and a `torch.amp.GradScaler` for the backward and step.",
            fix=self.planned_fix(FixClass.NUMERICS, "migrate apex.amp to torch.amp (autocast + GradScaler)",
                                 lambda: self._plan(facts, initializes, scale_losses)),
        )

    def _plan(self, facts: ScriptFacts, initializes: list[CallSite], scale_losses: list[CallSite]) -> MigrateToTorchAmp:
        others = sorted({r.qualname for r in facts.references_to("apex.amp.") if r.qualname not in (INITIALIZE, SCALE_LOSS)})
        if others:
            raise DeclineFix(f"the script also uses {', '.join(f'`{o}`' for o in others)}; migrate by hand")
        if len(initializes) != 1 or len(scale_losses) != 1:
            raise DeclineFix("not exactly one `amp.initialize` and one `amp.scale_loss`: several models, optimizers or losses")
        torch = torch_import_name(facts)
        if torch is None:
            raise DeclineFix("the file does not `import torch`")
        if facts.bindings_of(SCALER) or any(
            p.name.value == SCALER for fn, _ in facts.functions for p in fn.params.params
        ):
            raise DeclineFix(f"the name `{SCALER}` is already used in this file")
        init, scale = initializes[0], scale_losses[0]

        # amp.initialize(model, optimizer, opt_level=...)
        positional = [a for a in init.node.args if a.keyword is None]
        keywords = {a.keyword.value: a.value for a in init.node.args if a.keyword is not None}
        if len(positional) != 2 or any(a.star for a in init.node.args):
            raise DeclineFix("`amp.initialize` is not called with one model and one optimizer")
        model_text, optimizer_text = (facts.code(a.value) for a in positional)
        if not all(isinstance(a.value, (cst.Name, cst.Attribute)) for a in positional):
            raise DeclineFix("`amp.initialize` gets lists of models or optimizers")
        unknown = sorted(set(keywords) - _ALLOWED_KEYWORDS)
        if unknown:
            raise DeclineFix(f"`amp.initialize` sets {', '.join(unknown)}, which torch.amp has no equivalent for")
        if "loss_scale" in keywords and literal_value(keywords["loss_scale"]) != "dynamic":
            raise DeclineFix("a static `loss_scale`; GradScaler's scale is dynamic")
        level = keywords.get("opt_level")
        level_value = literal_value(level) if level is not None else "O1"
        if level_value in ("O1", "O2"):
            enabled = "True"
        elif level_value == "O0":
            enabled = "False"
        elif level_value is ...:
            enabled = f'{facts.code(level)} in ("O1", "O2")'
        else:
            raise DeclineFix(f"opt_level={level_value!r}: pure fp16 training has no torch.amp equivalent")
        init_statement = init.statement.node if init.statement is not None else None
        if not (isinstance(init_statement, cst.SimpleStatementLine) and len(init_statement.body) == 1):
            raise DeclineFix("`amp.initialize` is part of a larger statement")
        small = init_statement.body[0]
        device = device_expression(facts, init, "type", torch)
        codes = [f"{SCALER} = {torch}.amp.GradScaler({device}, enabled={enabled})"]
        if isinstance(small, cst.Assign) and small.value is init.node and len(small.targets) == 1:
            targets = facts.code(small.targets[0].target)
            if " ".join(targets.replace(",", " ").split()) != " ".join(f"{model_text} {optimizer_text}".split()):
                codes.insert(0, f"{targets} = {model_text}, {optimizer_text}")
        elif not (isinstance(small, cst.Expr) and small.value is init.node):
            raise DeclineFix("`amp.initialize`'s result is not assigned to the model and the optimizer")

        # with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()
        with_node = scale.statement.node if scale.statement is not None else None
        if not (isinstance(with_node, cst.With) and len(with_node.items) == 1 and with_node.items[0].item is scale.node):
            raise DeclineFix("`amp.scale_loss` is not the only item of a `with` statement")
        scale_args = [a for a in scale.node.args if a.keyword is None]
        if len(scale_args) != 2 or len(scale.node.args) != 2:
            raise DeclineFix("`amp.scale_loss` gets more than a loss and an optimizer")
        loss_text = facts.code(scale_args[0].value)
        step_optimizer = facts.code(scale_args[1].value)
        asname = with_node.items[0].asname
        body = with_node.body.body if isinstance(with_node.body, cst.IndentedBlock) else ()
        scaled = full_name(asname.name) if asname is not None else None
        backward_only = (
            scaled is not None and len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine)
            and len(body[0].body) == 1 and isinstance(body[0].body[0], cst.Expr)
            and facts.code(body[0].body[0].value).replace(" ", "") == f"{scaled}.backward()"
        )
        if not backward_only:
            raise DeclineFix("the `amp.scale_loss` block does more than `scaled_loss.backward()`")

        # optimizer.step() after it, in the same function
        step_fn = scale.ctx.function
        line = facts.line_of(scale.node)
        steps = [c for c in facts.method_calls("step") if c.receiver_name == step_optimizer
                 and c.ctx.function is step_fn and facts.line_of(c.node) > line]
        if len(steps) != 1 or steps[0].node.args:
            raise DeclineFix(f"not exactly one `{step_optimizer}.step()` after the scaled backward")
        step_statement = steps[0].statement.node if steps[0].statement is not None else None
        if not (isinstance(step_statement, cst.SimpleStatementLine) and len(step_statement.body) == 1):
            raise DeclineFix(f"`{step_optimizer}.step()` is part of a larger statement")

        # the forward and loss under autocast
        forward: tuple[cst.BaseStatement, ...] = ()
        if not facts.in_autocast(scale.ctx):
            statements = loss_statements(facts, TrainingStep(scale, scale_args[0].value, None))
            if not statements or any(facts.in_autocast(c.ctx) for c in facts.calls if c.statement in statements):
                raise DeclineFix("the forward and loss of the step could not be found before `amp.scale_loss`")
            block = statements[0].block
            forward = tuple(block[statements[0].index: statements[-1].index + 1])
        step_device = device_expression(facts, scale, "type", torch)

        # where the scaler lives: the step's function gets it as a parameter when it is elsewhere
        init_fn = init.ctx.function
        step_function = step_call = None
        if step_fn is not init_fn:
            if step_fn is None or scale.ctx.class_def is not None:
                raise DeclineFix("the step is in a method or at module level, away from `amp.initialize`")
            callers = callers_of(facts, step_fn, how="bare")  # not ``model.train()``
            if len(callers) != 1 or callers[0].ctx.function is not init_fn or facts.line_of(callers[0].node) < facts.line_of(init.node):
                raise DeclineFix(f"`{step_fn.name.value}` is not called once, after `amp.initialize`, from the same function")
            params = step_fn.params
            if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None or params.kwonly_params or params.posonly_params:
                raise DeclineFix(f"`{step_fn.name.value}` takes *args, **kwargs or keyword-only parameters")
            step_function, step_call = step_fn, callers[0].node

        # The scaler must exist wherever the step runs, the plain path of ``if args.amp:`` too.
        used_at = scale.ctx if step_call is None else callers[0].ctx
        conditions = extra_conditions(init.ctx, used_at)
        disabled_before = conditions[0].test if conditions else None
        if disabled_before is not None and _is_elif(facts.module, disabled_before):
            raise DeclineFix("`amp.initialize` runs in an `elif` arm the step does not; migrate by hand")

        imports = tuple(
            site.node_statement for site in self._removable_imports(facts)
        )
        return MigrateToTorchAmp(
            initialize=init_statement,
            initialize_code=tuple(codes),
            scale_loss=with_node,
            backward_code=f"{SCALER}.scale({loss_text}).backward()",
            optimizer_step=step_statement,
            optimizer=step_optimizer,
            forward=forward,
            autocast_code=f"{torch}.autocast({step_device}, dtype={torch}.float16, enabled={SCALER}.is_enabled())",
            imports=imports,
            step_function=step_function,
            step_call=step_call,
            disabled_before=disabled_before,
            disabled_code=f"{SCALER} = {torch}.amp.GradScaler({device}, enabled=False)" if disabled_before else "",
        )

    @staticmethod
    def _removable_imports(facts: ScriptFacts) -> list:
        out = []
        for site in facts.imports:
            if not site.qualname.startswith("apex") or site.ctx is not facts.module_frame or site.in_import_error_fallback:
                continue
            if site.qualname not in ("apex", "apex.amp"):
                continue
            uses = [r for r in facts.references if r.dotted.split(".")[0] == site.local
                    and r.qualname not in (INITIALIZE, SCALE_LOSS, "apex.amp")]
            if site.qualname == "apex":
                uses = [r for r in uses if not (r.qualname or "").startswith("apex.amp")]
            if uses:
                continue
            statement = _import_statement(facts, site.node)
            if statement is not None:
                out.append(_ImportSite(statement))
        return out


@dataclass(frozen=True)
class _ImportSite:
    node_statement: cst.SimpleStatementLine


def _is_elif(module: cst.Module, node: cst.If) -> bool:
    """Whether ``node`` is the ``elif`` of another ``if`` (no statement of its own to insert before)."""
    return any(parent.orelse is node for parent in nodes_of(module, cst.If))


def _import_statement(facts: ScriptFacts, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
    for item in facts.module.body:
        if isinstance(item, cst.SimpleStatementLine) and len(item.body) == 1 and item.body[0] is node:
            names = node.names if not isinstance(node.names, cst.ImportStar) else None
            if names is not None and len(names) == 1:
                return item
    return None


class ApexAmpFix(Codemod):
    rule = "TC209"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        editor = _MigrationEditor()
        for finding in findings:
            plan: MigrateToTorchAmp = finding.fix.plan
            editor.replace_with(plan.initialize, [
                parse_statement(code, module).with_changes(leading_lines=plan.initialize.leading_lines if i == 0 else [])
                for i, code in enumerate(plan.initialize_code)
            ])
            backward = parse_statement(plan.backward_code, module).with_changes(leading_lines=plan.scale_loss.leading_lines)
            editor.replace_with(plan.scale_loss, [backward])
            editor.replace_with(plan.optimizer_step, [
                parse_statement(f"{SCALER}.step({plan.optimizer})", module).with_changes(
                    leading_lines=plan.optimizer_step.leading_lines),
                parse_statement(f"{SCALER}.update()", module),
            ])
            if plan.forward:
                first, rest = plan.forward[0], plan.forward[1:]
                wrapped = cst.With(
                    items=[cst.WithItem(parse_expression(plan.autocast_code, module))],
                    body=cst.IndentedBlock(body=[first.with_changes(leading_lines=[]), *rest]),
                    leading_lines=first.leading_lines,
                )
                editor.replace_with(first, [wrapped])
                for statement in rest:
                    editor.remove(statement)
            if plan.disabled_before is not None:
                editor.insert_before(plan.disabled_before, [parse_statement(plan.disabled_code, module)])
            for statement in plan.imports:
                editor.remove(statement)
            if plan.step_function is not None:
                editor.pass_scaler[id(plan.step_function)] = "function"
                editor.pass_scaler[id(plan.step_call)] = "call"
        return module.visit(editor)


class _MigrationEditor(StatementEditor):
    def __init__(self) -> None:
        super().__init__()
        self.pass_scaler: dict[int, str] = {}

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self.pass_scaler.get(id(original_node)) != "function":
            return updated_node
        params = list(updated_node.params.params)
        has_defaults = any(p.default is not None for p in params)
        new = cst.Param(cst.Name(SCALER), default=cst.Name("None") if has_defaults else None,
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")) if has_defaults else cst.MaybeSentinel.DEFAULT)
        if params:
            params[-1] = params[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated_node.with_changes(params=updated_node.params.with_changes(params=[*params, new]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.pass_scaler.get(id(original_node)) != "call":
            return updated_node
        args = list(updated_node.args)
        new = cst.Arg(cst.Name(SCALER), keyword=cst.Name(SCALER),
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated_node.with_changes(args=[*args, new])
