"""TC316 requires-grad-typo: ``p.require_grad = False`` and other misspellings of ``requires_grad``.

A tensor or module accepts any new attribute, so ``for p in model.parameters(): p.require_grad = False``
sets an attribute nobody reads: nothing is frozen, the full backward runs and every parameter trains.
The method form ``model.require_grad_(False)`` raises AttributeError instead.

Reported: an assignment to one of a few common misspellings of ``requires_grad`` (as an attribute of
anything) and a call of the misspelt ``requires_grad_`` method, in a file that imports torch. Not
reported where the file makes the name its own: a class attribute or dataclass field, ``self.<name> =``
in a class, a keyword argument or parameter of that name, a read of the attribute, a string spelling
it, or a function of that name.

Fix (numerics: it changes which parameters train): the right name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.walk import walk

TYPOS = ("require_grad", "requires_grads", "require_grads", "requires_gard", "requieres_grad", "reqires_grad")
METHOD_TYPOS = tuple(f"{typo}_" for typo in TYPOS)


@dataclass(frozen=True, eq=False)
class RenameAttribute(FixPlan):
    kind = "rename-attribute"
    attribute: cst.Attribute
    name: str  # the attribute's right name


class _Typos(cst.CSTVisitor):
    """The misspelt attributes a file assigns or calls, and the names the file makes its own."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[cst.Attribute] = []
        self.called: list[cst.Attribute] = []
        self.owned: set[str] = set()
        self._stores: set[int] = set()
        self._funcs: set[int] = set()
        self._frames: list[str] = []  # "class" / "def", innermost last

    def _targets(self, target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._targets(element.value)
        elif isinstance(target, cst.Attribute) and target.attr.value in TYPOS:
            self._stores.add(id(target))
            if isinstance(target.value, cst.Name) and target.value.value == "self" and "class" in self._frames:
                self.owned.add(target.attr.value)  # an attribute of the user's own class
            else:
                self.assigned.append(target)
        elif isinstance(target, cst.Name) and target.value in TYPOS and self._frames[-1:] == ["class"]:
            self.owned.add(target.value)  # a class attribute or dataclass field

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._frames.append("class")

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._frames.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._frames.append("def")
        if node.name.value in TYPOS + METHOD_TYPOS:
            self.owned.add(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._frames.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._targets(target.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Attribute) and node.target.attr.value in TYPOS:
            self.owned.add(node.target.attr.value)  # ``x.require_grad |= ...`` reads it first: the user's own

    def visit_Param(self, node: cst.Param) -> None:
        if node.name.value in TYPOS:
            self.owned.add(node.name.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value in TYPOS:
            self.owned.add(node.keyword.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in METHOD_TYPOS:
            self._funcs.add(id(func))
            self.called.append(func)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = node.attr.value
        if name in TYPOS and id(node) not in self._stores:
            self.owned.add(name)  # read back somewhere: the script treats the name as its own
        elif name in METHOD_TYPOS and id(node) not in self._funcs:
            self.owned.add(name)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        text = node.value.strip("rbuRBU").strip("'\"")
        if text in TYPOS + METHOD_TYPOS:
            self.owned.add(text)


class RequiresGradTypo(ScriptRule):
    id = "TC316"
    triggers = (r"req\w*_g(?:rad|ard)",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        if "torch" not in facts.imported_roots():
            return
        typos = _Typos()
        walk(facts.module, typos)
        for attribute in typos.assigned:
            name = attribute.attr.value
            if name in typos.owned:
                continue
            yield self.finding(
                facts,
                attribute,
                f"`.{name} = ...` misspells `requires_grad`: it sets a new attribute; no gradient setting changes",
                explanation="Tensors and modules accept any new attribute, so the assignment succeeds and nothing "
                "reads it: every parameter still requires grad, the full backward runs and the 'frozen' "
                "parameters train. The attribute is `requires_grad`.",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "rename to requires_grad",
                    lambda attribute=attribute: RenameAttribute(attribute, "requires_grad"),
                ),
            )
        for attribute in typos.called:
            name = attribute.attr.value
            if name in typos.owned:
                continue
            yield self.finding(
                facts,
                attribute,
                f"`.{name}(...)` misspells `requires_grad_`: a tensor or module raises AttributeError",
                explanation="`requires_grad_(flag)` sets requires_grad on a tensor or on every parameter of a "
                "module; the misspelt method does not exist, so the call fails when it runs.",
                fix=self.planned_fix(
                    FixClass.NUMERICS, "rename to requires_grad_",
                    lambda attribute=attribute: RenameAttribute(attribute, "requires_grad_"),
                ),
            )


# -- the fix ------------------------------------------------------------------------------------


class RequiresGradTypoFix(Codemod):
    rule = "TC316"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return module.visit(_Rename({finding.fix.plan.attribute: finding.fix.plan.name for finding in findings}))


class _Rename(cst.CSTTransformer):
    def __init__(self, names: dict[cst.Attribute, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        name = self.names.get(original_node)
        return updated_node if name is None else updated_node.with_changes(attr=cst.Name(name))
