"""TC202 deprecated-amp-api: ``torch.cuda.amp.*`` / ``torch.cpu.amp.*`` → ``torch.amp.*``."""

from __future__ import annotations

from typing import Iterator

from tcaudit.findings import Finding, Fix, FixClass
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.rule import RuleContext, ScriptRule

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
