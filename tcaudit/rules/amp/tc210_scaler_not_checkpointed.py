"""TC210 scaler-not-checkpointed: a checkpoint saves the optimizer's state but not the GradScaler's.

A resumed fp16 run then starts the loss scale again at 65536 (GradScaler's default) instead of the
value the run had settled on, and skips steps (inf/NaN gradients) halving it back down; with a
growth interval of 2000 steps the scale is also wrong in the other direction for a long time.

Fix (safe): add ``"scaler": scaler.state_dict()`` to the saved dict literal, and where the file loads
the same checkpoint into the optimizer, ``scaler.load_state_dict(ckpt["scaler"])`` guarded by
``if "scaler" in ckpt:`` so checkpoints written before the fix still load. A scaler that exists only
on some paths (created under ``if args.amp:``, or ``None`` without AMP) is saved and loaded under
that test (``scaler.state_dict() if args.amp else None``); declined where the test cannot be repeated
at the save (``self.scaler`` set in one arm of ``__init__`` on a parameter of ``__init__``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext, StatementEditor, parse_expression, parse_statement
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import CallSite, Frame, ScriptFacts
from tcaudit.script.guards import binding_conditions, condition_code, exclusive
from tcaudit.source.syntax import evaluated_value, full_name, keyword

SAVE = frozenset({"torch.save"})
KEY = "scaler"


@dataclass(frozen=True, eq=False)
class SaveScalerState(FixPlan):
    kind = "checkpoint-scaler"
    saved: cst.Dict  # the dict literal passed to torch.save
    after: cst.DictElement  # the optimizer's element; the scaler's goes right after it
    value: str  # ``scaler.state_dict()``
    loads: tuple[cst.SimpleStatementLine, ...]  # ``optimizer.load_state_dict(ckpt["optimizer"])`` statements
    load_code: tuple[str, ...]  # the guarded scaler load inserted after each


class ScalerNotCheckpointed(ScriptRule):
    id = "TC210"
    triggers = (r"Scaler",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if not facts.scalers or all(self._disabled(facts, context, scaler) for scaler in facts.scalers):
            return
        for call in facts.calls_to(*SAVE):
            saved = call.arg("obj", 0)
            if saved is None:
                continue
            literal = self._literal(facts, saved, call)
            if literal is None:
                continue
            optimizer = self._optimizer_element(facts, literal)
            if optimizer is None or self._holds_scaler(facts, literal):
                continue
            element, optimizer_name, key = optimizer
            scaler = sorted(facts.scalers)[0]
            yield self.finding(
                facts, call.node,
                f"the checkpoint saves `{optimizer_name}`'s state but not `{scaler}`'s",
                explanation="A resumed fp16 run restarts the loss scale at 65536 and skips steps until it has "
                f"come down again; save `{scaler}.state_dict()` too.",
                fix=self.planned_fix(
                    FixClass.SAFE, f'save and restore `{scaler}.state_dict()` as "{KEY}"',
                    lambda: self._plan(facts, call, saved, literal, element, optimizer_name, key, scaler),
                ),
            )

    @staticmethod
    def _disabled(facts: ScriptFacts, context: RuleContext, scaler: str) -> bool:
        """Whether every GradScaler bound to ``scaler`` is created with ``enabled=`` false for the target
        GPU and the script's defaults (``GradScaler(enabled=(dtype == "float16"))`` with ``dtype =
        "bfloat16"``, or bfloat16 where the GPU has it): a no-op whose state holds nothing to save."""
        values = context.values(facts)
        for binding in facts.bindings_of(scaler):
            for value in facts.binding_values(binding.value):
                if not isinstance(value, cst.Call):
                    continue
                qual = facts.qualname(value.func) or full_name(value.func) or ""
                if not qual.endswith("GradScaler"):
                    continue
                enabled = keyword(value, "enabled")
                if enabled is None:
                    return False
                held = values.of(facts, enabled.value, binding.ctx.function)
                if held is None or any(bool(v.value) for v in held):
                    return False
        return True

    def _plan(self, facts: ScriptFacts, call: CallSite, saved, literal: cst.Dict, element: cst.DictElement,
              optimizer_name: str, key: str | None, scaler: str) -> SaveScalerState:
        if len(facts.scalers) > 1:
            raise DeclineFix(f"several GradScalers ({', '.join(sorted(facts.scalers))}); which one this checkpoint belongs to is not clear")
        if literal is not saved:
            raise DeclineFix("the saved dict is built elsewhere, not written as a literal in the `torch.save` call")
        if any(isinstance(e, cst.DictElement) and _string(e.key) == KEY for e in literal.elements):
            raise DeclineFix(f'the checkpoint already has a "{KEY}" entry')
        self._check_visible(facts, scaler, call.ctx, facts.line_of(call.node), "saved")
        nullable = self._nullable(facts, scaler)
        exists = self._existence_test(facts, scaler, call.ctx, "saved")
        tests = [t for t in (exists, f"{scaler} is not None" if nullable else None) if t]
        value = f"{scaler}.state_dict()" + (f" if {' and '.join(tests)} else None" if tests else "")
        loads: list[cst.SimpleStatementLine] = []
        codes: list[str] = []
        if key is not None:
            for load in facts.method_calls("load_state_dict"):
                if load.receiver_name != optimizer_name or not load.node.args:
                    continue
                source = load.node.args[0].value
                if not (isinstance(source, cst.Subscript) and len(source.slice) == 1
                        and isinstance(source.slice[0].slice, cst.Index) and _string(source.slice[0].slice.value) == key):
                    continue
                statement = load.statement.node if load.statement is not None else None
                if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
                    raise DeclineFix(f"the optimizer state is loaded inside a larger statement (line {facts.line_of(load.node)})")
                self._check_visible(facts, scaler, load.ctx, facts.line_of(load.node), "loaded")
                exists = self._existence_test(facts, scaler, load.ctx, "loaded")
                checkpoint = facts.code(source.value)
                # A checkpoint saved where the scaler was missing holds None for it.
                saved_none = f'{checkpoint}["{KEY}"] is not None' if tests else None
                guard = " and ".join(
                    t for t in (f'"{KEY}" in {checkpoint}', saved_none, exists, f"{scaler} is not None" if nullable else None)
                    if t
                )
                loads.append(statement)
                codes.append(f'if {guard}:\n    {scaler}.load_state_dict({checkpoint}["{KEY}"])\n')
        return SaveScalerState(literal, element, value, tuple(loads), tuple(codes))

    @staticmethod
    def _literal(facts: ScriptFacts, saved: cst.BaseExpression, call: CallSite) -> cst.Dict | None:
        if isinstance(saved, cst.Dict):
            return saved
        if isinstance(saved, cst.Name):
            bindings = facts.bindings_of(saved.value)
            if any(b.is_item_write for b in bindings):
                return None  # ``ckpt["scaler"] = ...`` may add it after the literal
            if len(bindings) == 1 and isinstance(bindings[0].value, cst.Dict):
                return bindings[0].value  # reported, but the fix edits only a literal in the call
            # A name rebound through the file (nanoGPT's ``checkpoint = torch.load(...)``, ``= None``,
            # then ``= {...}`` right before the save): the dict is the binding just before the save
            # in the same function.
            line = facts.line_of(call.node)
            before = [b for b in bindings if b.ctx.function is call.ctx.function and facts.line_of(b.value) < line]
            if before:
                nearest = max(before, key=lambda b: facts.line_of(b.value))
                if isinstance(nearest.value, cst.Dict):
                    return nearest.value
        return None

    @staticmethod
    def _optimizer_element(facts: ScriptFacts, literal: cst.Dict) -> tuple[cst.DictElement, str, str | None] | None:
        for element in literal.elements:
            if not isinstance(element, cst.DictElement):
                continue
            value = element.value
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "state_dict":
                owner = full_name(value.func.value)
                if facts.is_optimizer_name(owner) and owner not in facts.scalers:
                    return element, owner, _string(element.key)
        return None

    @staticmethod
    def _holds_scaler(facts: ScriptFacts, literal: cst.Dict) -> bool:
        for element in literal.elements:
            if isinstance(element, cst.StarredDictElement):
                return True  # ``**extra`` may hold it
            key = (_string(element.key) or "").lower()
            if "scaler" in key or "amp" in key:
                return True
            text = facts.code(element.value)
            if any(scaler in text for scaler in facts.scalers) or "scaler" in text.lower():
                return True
        return False

    @staticmethod
    def _check_visible(facts: ScriptFacts, scaler: str, ctx: Frame, line: int, what: str) -> None:
        bindings = facts.bindings_of(scaler)
        function = ctx.function
        if scaler.startswith("self."):
            if any(b.ctx.class_def is ctx.class_def for b in bindings):
                return
            raise DeclineFix(f"`{scaler}` belongs to another class than the code where the checkpoint is {what}")
        same = [b for b in bindings if b.ctx.function is function]
        if same:
            if any(facts.line_of(b.value) < line for b in same):
                return
            raise DeclineFix(f"`{scaler}` is created after the checkpoint is {what} (line {line})")
        if any(b.ctx.function is None for b in bindings):
            if function is not None or any(facts.line_of(b.value) < line for b in bindings if b.ctx.function is None):
                return
            raise DeclineFix(f"`{scaler}` is created after the checkpoint is {what} (line {line})")
        where = f"`{function.name.value}`" if function is not None else "module level"
        raise DeclineFix(f"the checkpoint is {what} in {where}, where `{scaler}` is not visible; pass the scaler there first")

    @staticmethod
    def _existence_test(facts: ScriptFacts, scaler: str, ctx: Frame, what: str) -> str | None:
        """The condition under which ``scaler`` exists where the checkpoint is saved or loaded (None:
        on every path there). A scaler created only under ``if args.amp:`` does not exist on the
        plain path: touching it there is a NameError, or an AttributeError for ``self.scaler``."""
        bindings = [b for b in facts.bindings_of(scaler) if b.ctx.function is ctx.function or b.ctx.function is None
                    or scaler.startswith("self.")]
        conditions = binding_conditions(facts.module, [b.ctx for b in bindings], ctx)
        if conditions == []:
            return None
        if conditions is None:
            raise DeclineFix(f"`{scaler}` is created under several different conditions; which of them hold where "
                             f"the checkpoint is {what} is not clear")
        line = facts.line_of(conditions[0].test)
        if any(exclusive(b.ctx, ctx) for b in bindings):
            raise DeclineFix(f"`{scaler}` does not exist where the checkpoint is {what}: it is created on the other "
                             f"arm of the `if` on line {line}")
        local = any(b.ctx.function is not None and b.ctx.function is not ctx.function for b in bindings)
        test = None if local else condition_code(facts.module, conditions)
        if test is None:
            raise DeclineFix(f"`{scaler}` exists only under the `if` on line {line}, a condition that cannot be tested "
                             f"where the checkpoint is {what}; save its state under that condition by hand")
        return test

    @staticmethod
    def _nullable(facts: ScriptFacts, scaler: str) -> bool:
        for binding in facts.bindings_of(scaler):
            for value in facts.binding_values(binding.value):
                if isinstance(value, cst.Name) and value.value == "None":
                    return True
        return False


def _string(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = evaluated_value(node)
        return value if isinstance(value, str) else None
    return None


class ScalerNotCheckpointedFix(Codemod):
    rule = "TC210"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        plans: list[SaveScalerState] = [f.fix.plan for f in findings]
        editor = _CheckpointEditor({id(p.saved): p for p in plans}, module)
        loaded: set[int] = set()
        for plan in plans:
            for statement, code in zip(plan.loads, plan.load_code):
                if id(statement) not in loaded:  # two saves of one checkpoint share its load
                    loaded.add(id(statement))
                    editor.insert_after(statement, [parse_statement(code, module)])
        return module.visit(editor)


class _CheckpointEditor(StatementEditor):
    """Inserts the scaler loads after their statements and the scaler's entry into the saved dicts."""

    def __init__(self, plans: dict[int, SaveScalerState], module: cst.Module) -> None:
        super().__init__()
        self.plans = plans
        self.module = module

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        plan = self.plans.get(id(original_node))
        if plan is None:
            return updated_node
        index = next(i for i, e in enumerate(original_node.elements) if e is plan.after)
        elements = list(updated_node.elements)
        # Separate like the dict's other elements do (", " or a comma and a new line).
        separator = next(
            (e.comma for e in elements[:-1] if isinstance(e.comma, cst.Comma)),
            cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
        )
        new = cst.DictElement(
            key=cst.SimpleString(f'"{KEY}"'),
            value=parse_expression(plan.value, self.module),
            comma=elements[index].comma,
            whitespace_before_colon=elements[index].whitespace_before_colon,
            whitespace_after_colon=elements[index].whitespace_after_colon,
        )
        elements[index] = elements[index].with_changes(comma=separator)
        elements.insert(index + 1, new)
        return updated_node.with_changes(elements=elements)
