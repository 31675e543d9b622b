"""TC202 deprecated-amp-api: ``torch.cuda.amp.*`` / ``torch.cpu.amp.*`` → ``torch.amp.*``."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.base import RuleContext, ScriptRule
from typing import Sequence
import libcst as cst
from libcst.helpers import get_full_name_for_node
from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod

DEPRECATED_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
# The public names those modules re-export from torch.amp and that warn when used.
DEPRECATED_NAMES = frozenset(
    {"autocast", "GradScaler", "custom_fwd", "custom_bwd", "autocast_mode.autocast", "grad_scaler.GradScaler"}
)


def deprecated_module(qualname: str | None) -> str | None:
    """The deprecated module of a deprecated name (or of the module itself), else None."""
    if not qualname:
        return None
    for module in DEPRECATED_MODULES:
        if qualname == module:
            return module
        if qualname.startswith(module + "."):
            rest = qualname[len(module) + 1:]
            if rest in DEPRECATED_NAMES or rest.split(".")[0] in ("autocast", "GradScaler"):
                return module
    return None


def replacement(qualname: str) -> tuple[str, str]:
    """(new qualified name, device type) for a deprecated name."""
    module = deprecated_module(qualname) or ""
    device = module.split(".")[1]
    rest = qualname[len(module):]
    return f"torch.amp{rest}", device


class DeprecatedAmpApi(ScriptRule):
    id = "TC202"
    triggers = (r"\bamp\b",)

    def check(self, facts: ScriptFacts, context: RuleContext) -> Iterator[Finding]:
        flagged_imports: set[int] = set()
        deprecated_locals: set[str] = set()
        for site in facts.imports:
            module = deprecated_module(site.qualname)
            if module is None:
                continue
            deprecated_locals.add(site.local)
            if site.in_import_error_fallback or id(site.node) in flagged_imports:
                continue  # a compatibility shim for old torch is deliberate
            flagged_imports.add(id(site.node))
            names = sorted(s.qualname for s in facts.imports if s.node is site.node)
            new = ", ".join(replacement(q)[0] for q in names)
            yield self.finding(
                facts,
                site.node,
                f"`{', '.join(names)}` is deprecated; import from torch.amp instead ({new}) and pass "
                f'the device type ("{replacement(names[0])[1]}") to autocast and GradScaler',
                fix=Fix(
                    FixClass.SAFE,
                    "import from torch.amp and pass the device type at each call",
                    anchor={"kind": "replace-import", "names": names},
                ),
            )
        for ref in facts.references:
            module = deprecated_module(ref.qualname)
            if module is None or ref.dotted.split(".")[0] in deprecated_locals:
                continue
            if ref.qualname == module:
                continue  # the bare module (``torch.cuda.amp``) without a member is harmless
            if facts.module_frame is not ref.ctx and any(
                frame.kind == "except" for frame in ref.ctx.chain()
            ):
                continue
            new, device = replacement(ref.qualname)
            yield self.finding(
                facts,
                ref.node,
                f"`{ref.dotted}` is deprecated; use `{new}` with device type \"{device}\"",
                fix=Fix(
                    FixClass.SAFE,
                    f'replace with {new}("{device}", ...)' if new.endswith("autocast") else f"replace with {new}",
                    anchor={"kind": "replace-name", "old": ref.qualname, "new": new, "device": device},
                ),
            )


# -- the fix ------------------------------------------------------------------------------------

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
