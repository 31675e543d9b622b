"""TC202 fix: ``torch.cuda.amp.X`` → ``torch.amp.X`` with the device type passed explicitly."""

from __future__ import annotations

from typing import Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, FixContext
from tcaudit.script.tc202_deprecated_amp_api import deprecated_module

# Old positional parameters of torch.cuda.amp.autocast, which torch.amp.autocast orders differently.
_AUTOCAST_OLD_POSITIONAL = ("enabled", "dtype", "cache_enabled")


def _device_of(qualname: str) -> str:
    return (deprecated_module(qualname) or "torch.cuda.amp").split(".")[1]


class _Rewriter(cst.CSTTransformer):
    def __init__(self, facts, flagged_imports: set[int]) -> None:
        super().__init__()
        self.facts = facts
        self.flagged_imports = flagged_imports
        self.calls: dict[int, str] = {}  # call node → deprecated qualname of its callee
        self.decorators: dict[int, str] = {}
        self.attributes: set[int] = set()
        for call in facts.calls:
            if deprecated_module(call.qualname) and not self._in_shim(call.ctx):
                self.calls[id(call.node)] = call.qualname
        for fn, _ in facts.functions:
            for dec in fn.decorators:
                qual = facts.qualname(dec.decorator)
                if qual and deprecated_module(qual) and qual.split(".")[-1] in ("custom_fwd", "custom_bwd"):
                    self.decorators[id(dec)] = qual
        local_deprecated = {s.local for s in facts.imports if deprecated_module(s.qualname) and not s.in_import_error_fallback}
        for ref in facts.references:
            if deprecated_module(ref.qualname) and ref.dotted.split(".")[0] not in local_deprecated:
                if isinstance(ref.node, cst.Attribute) and not self._in_shim(ref.ctx):
                    self.attributes.add(id(ref.node))

    @staticmethod
    def _in_shim(ctx) -> bool:
        return any(frame.kind == "except" for frame in ctx.chain())

    # imports -------------------------------------------------------------------------------------
    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        if id(original_node) not in self.flagged_imports or original_node.module is None:
            return updated_node
        module = get_full_name_for_node(original_node.module) or ""
        for old in ("torch.cuda.amp", "torch.cpu.amp"):
            if module == old or module.startswith(old + "."):
                new = "torch.amp" + module[len(old):]
                return updated_node.with_changes(module=cst.parse_expression(new))
        if module in ("torch.cuda", "torch.cpu"):
            return updated_node.with_changes(module=cst.Name("torch"))
        return updated_node

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        if id(original_node) not in self.flagged_imports:
            return updated_node
        names = []
        for alias in updated_node.names:
            full = get_full_name_for_node(alias.name) or ""
            for old in ("torch.cuda.amp", "torch.cpu.amp"):
                if full == old or full.startswith(old + "."):
                    alias = alias.with_changes(name=cst.parse_expression("torch.amp" + full[len(old):]))
            names.append(alias)
        return updated_node.with_changes(names=names)

    # names ---------------------------------------------------------------------------------------
    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if id(original_node) not in self.attributes:
            return updated_node
        dotted = get_full_name_for_node(original_node) or ""
        for old in (".cuda.amp", ".cpu.amp"):
            if old in dotted:
                return cst.parse_expression(dotted.replace(old, ".amp", 1))
        return updated_node

    # calls ---------------------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        qual = self.calls.get(id(original_node))
        if qual is None:
            return updated_node
        name = qual.split(".")[-1]
        device = cst.SimpleString(f'"{_device_of(qual)}"')
        args = list(updated_node.args)
        if any(a.keyword is not None and a.keyword.value in ("device_type", "device") for a in args):
            return updated_node
        if name == "autocast":
            positional = [a for a in args if a.keyword is None and not a.star]
            rest = [a for a in args if a.keyword is not None or a.star]
            converted = [
                a.with_changes(keyword=cst.Name(_AUTOCAST_OLD_POSITIONAL[i]), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
                for i, a in enumerate(positional[: len(_AUTOCAST_OLD_POSITIONAL)])
            ]
            new_args = [cst.Arg(device)] + converted + rest
        elif name == "GradScaler":
            new_args = [cst.Arg(device)] + args
        elif name in ("custom_fwd", "custom_bwd"):
            new_args = args + [cst.Arg(device, keyword=cst.Name("device_type"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))]
        else:
            return updated_node
        fixed = []
        for index, arg in enumerate(new_args):
            last = index == len(new_args) - 1
            comma = arg.comma if not last else cst.MaybeSentinel.DEFAULT
            if not last and arg.comma is cst.MaybeSentinel.DEFAULT:
                comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            fixed.append(arg.with_changes(comma=comma))
        return updated_node.with_changes(args=fixed)

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        qual = self.decorators.get(id(original_node))
        if qual is None or isinstance(original_node.decorator, cst.Call):
            return updated_node
        device = _device_of(qual)
        return updated_node.with_changes(
            decorator=cst.Call(func=updated_node.decorator, args=[cst.Arg(
                cst.SimpleString(f'"{device}"'), keyword=cst.Name("device_type"),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                      whitespace_after=cst.SimpleWhitespace("")))])
        )


class DeprecatedAmpApiFix(Codemod):
    rule = "TC202"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        flagged = {
            id(site.node)
            for site in facts.imports
            if deprecated_module(site.qualname) and not site.in_import_error_fallback
        }
        return module.visit(_Rewriter(facts, flagged))
