"""TC202 deprecated-amp-api: ``torch.cuda.amp.*`` / ``torch.cpu.amp.*`` → ``torch.amp.*``.

Detects imports from the deprecated device-specific AMP modules (a ``try/except ImportError``
compatibility shim is left alone) and references to their members written out in full.

Fix (safe): import from ``torch.amp`` instead and rewrite each reference, passing the device type
where the new API needs it: ``autocast("cuda", ...)`` (old positional ``enabled, dtype,
cache_enabled`` become keywords), ``GradScaler("cuda", ...)``, ``custom_fwd(device_type="cuda")``.
Each finding's plan holds the import statement or reference it rewrites and the calls and decorators
that go through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import libcst as cst

from tcaudit.findings import DeclineFix, Finding, FixClass, FixPlan
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod, RuleContext, ScriptRule
from tcaudit.script.facts import Frame, Reference, ScriptFacts
from tcaudit.source.syntax import full_name, nodes_of

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


@dataclass(frozen=True, eq=False)
class ReplaceImport(FixPlan):
    kind = "replace-import"
    names: tuple[str, ...]  # the deprecated names the statement imports
    statement: cst.Import | cst.ImportFrom
    # Calls and decorators through the imported names, each with the deprecated name it reaches.
    calls: tuple[tuple[cst.Call, str], ...]
    decorators: tuple[tuple[cst.Decorator, str], ...]


@dataclass(frozen=True, eq=False)
class ReplaceName(FixPlan):
    kind = "replace-name"
    old: str
    new: str
    device: str
    attribute: cst.Attribute  # ``torch.cuda.amp.X`` as written
    call: cst.Call | None  # the call whose callee it is
    decorator: cst.Decorator | None  # the decorator it is


def _in_shim(ctx: Frame) -> bool:
    return any(frame.kind == "except" for frame in ctx.chain())


class DeprecatedAmpApi(ScriptRule):
    id = "TC202"
    fixed_with = ("TC201",)  # the autocast and GradScaler steps TC201 writes
    # The word ``amp``, written literal first (its leading boundary checked behind it) so that the
    # regex engine scans for the literal.
    triggers = (r"amp\b(?<!\wamp)",)

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
                f"`{', '.join(names)}` is deprecated; import from torch.amp instead",
                explanation=f"Import {new} and pass the device type "
                f'("{replacement(names[0])[1]}") to autocast and GradScaler.',
                fix=self.planned_fix(
                    FixClass.SAFE,
                    "import from torch.amp and pass the device type at each call",
                    lambda site=site, names=names: _plan_import(facts, site.node, names),
                ),
            )
        for ref in facts.references:
            module = deprecated_module(ref.qualname)
            if module is None or ref.dotted.split(".")[0] in deprecated_locals:
                continue
            if ref.qualname == module:
                continue  # the bare module (``torch.cuda.amp``) without a member is harmless
            if facts.module_frame is not ref.ctx and _in_shim(ref.ctx):
                continue
            new, device = replacement(ref.qualname)
            yield self.finding(
                facts,
                ref.node,
                f"`{ref.dotted}` is deprecated; use `{new}` with device type \"{device}\"",
                fix=self.planned_fix(
                    FixClass.SAFE,
                    f'replace with {new}("{device}", ...)' if new.endswith("autocast") else f"replace with {new}",
                    lambda ref=ref, new=new, device=device: _plan_name(facts, ref, new, device),
                ),
            )


def _plan_import(facts: ScriptFacts, statement: cst.Import | cst.ImportFrom, names: list[str]) -> ReplaceImport:
    local_names = {s.local for s in facts.imports if s.node is statement}
    calls = tuple(
        (call.node, call.qualname) for call in facts.calls
        if deprecated_module(call.qualname) and not _in_shim(call.ctx)
        and (call.name or "").split(".")[0] in local_names
    )
    decorators = tuple(
        (dec, qual) for dec, qual in _custom_decorators(facts)
        if (full_name(dec.decorator) or "").split(".")[0] in local_names
    )
    rewritten = {id(call) for call, _ in calls} | {id(dec.decorator) for dec, _ in decorators}
    in_imports = {id(node) for site in facts.imports for node in nodes_of(site.node, (cst.Name, cst.Attribute))}
    for ref in facts.references:
        if ref.dotted.split(".")[0] not in local_names or _in_shim(ref.ctx) or id(ref.node) in in_imports:
            continue
        site = facts.call_of(ref.node)
        called = site is not None and id(site.node) in rewritten
        if not called and id(ref.node) not in rewritten:
            _refuse_bare_device_callable(ref.dotted, ref.qualname)
    return ReplaceImport(tuple(names), statement, calls, decorators)


def _plan_name(facts: ScriptFacts, ref: Reference, new: str, device: str) -> ReplaceName:
    if not isinstance(ref.node, cst.Attribute) or not any(old in ref.dotted for old in (".cuda.amp", ".cpu.amp")):
        raise DeclineFix(f"`{ref.dotted}` reaches {deprecated_module(ref.qualname)} through another name; "
                         "rewrite it by hand")
    site = facts.call_of(ref.node)
    call = site.node if site is not None else None
    decorator = None  # a callee is not a bare decorator: only a name never called may be one
    if call is None:
        decorator = next((dec for dec, _ in _custom_decorators(facts) if dec.decorator is ref.node), None)
    if call is None and decorator is None:
        _refuse_bare_device_callable(ref.dotted, ref.qualname)
    return ReplaceName(ref.qualname, new, device, ref.node, call, decorator)


def _refuse_bare_device_callable(written: str, qualname: str | None) -> None:
    """torch.amp's autocast and custom_fwd/custom_bwd need the device type: where the old one is used as
    a value (``return torch.cuda.amp.autocast``, ``ctx = autocast``) its callers would call the new one
    without it (a TypeError), and the device belongs at calls this fix does not see."""
    if (qualname or "").split(".")[-1] in ("autocast", "custom_fwd", "custom_bwd"):
        raise DeclineFix(
            f"`{written}` is used as a value, not called: `torch.amp` needs the device type wherever it is "
            f"called; rewrite it by hand (e.g. `functools.partial(torch.amp.{qualname.split('.')[-1]}, device_type=\"cuda\")`)"
        )


def _custom_decorators(facts: ScriptFacts) -> list[tuple[cst.Decorator, str]]:
    """``@custom_fwd`` / ``@custom_bwd`` of a deprecated module, written without a call."""
    out = []
    for fn, _ in facts.functions:
        for dec in fn.decorators:
            if isinstance(dec.decorator, cst.Call):
                continue  # ``@custom_fwd(cast_inputs=...)`` is a call: rewritten as one
            qual = facts.qualname(dec.decorator)
            if qual and deprecated_module(qual) and qual.split(".")[-1] in ("custom_fwd", "custom_bwd"):
                out.append((dec, qual))
    return out


# -- the fix ------------------------------------------------------------------------------------

# Old positional parameters of torch.cuda.amp.autocast, which torch.amp.autocast orders differently.
_AUTOCAST_OLD_POSITIONAL = ("enabled", "dtype", "cache_enabled")


def _device_of(qualname: str) -> str:
    return (deprecated_module(qualname) or "torch.cuda.amp").split(".")[1]


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))


class _Rewriter(cst.CSTTransformer):
    """The planned imports, attributes, calls and decorators, each found by identity."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__()
        self.imports: set[int] = set()
        self.attributes: set[int] = set()
        self.calls: dict[int, str] = {}  # call node → deprecated qualname of its callee
        self.decorators: dict[int, str] = {}
        for finding in findings:
            plan = finding.fix.plan
            if isinstance(plan, ReplaceImport):
                self.imports.add(id(plan.statement))
                self.calls.update((id(call), qual) for call, qual in plan.calls)
                self.decorators.update((id(dec), qual) for dec, qual in plan.decorators)
            elif isinstance(plan, ReplaceName):
                self.attributes.add(id(plan.attribute))
                if plan.call is not None:
                    self.calls[id(plan.call)] = plan.old
                if plan.decorator is not None:
                    self.decorators[id(plan.decorator)] = plan.old

    # imports -------------------------------------------------------------------------------------
    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        if id(original_node) not in self.imports or original_node.module is None:
            return updated_node
        module = full_name(original_node.module) or ""
        for old in DEPRECATED_MODULES:
            if module == old or module.startswith(old + "."):
                new = "torch.amp" + module[len(old):]
                return updated_node.with_changes(module=cst.parse_expression(new))
        if module in ("torch.cuda", "torch.cpu"):
            return updated_node.with_changes(module=cst.Name("torch"))
        return updated_node

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        if id(original_node) not in self.imports:
            return updated_node
        names = []
        for alias in updated_node.names:
            full = full_name(alias.name) or ""
            for old in DEPRECATED_MODULES:
                if full == old or full.startswith(old + "."):
                    alias = alias.with_changes(name=cst.parse_expression("torch.amp" + full[len(old):]))
            names.append(alias)
        return updated_node.with_changes(names=names)

    # names ---------------------------------------------------------------------------------------
    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if id(original_node) not in self.attributes:
            return updated_node
        dotted = full_name(original_node) or ""
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
            new_args = args + [_keyword("device_type", device)]
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
        device = cst.SimpleString(f'"{_device_of(qual)}"')
        return updated_node.with_changes(
            decorator=cst.Call(func=updated_node.decorator, args=[_keyword("device_type", device)])
        )


class DeprecatedAmpApiFix(Codemod):
    rule = "TC202"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return module.visit(_Rewriter(findings))
