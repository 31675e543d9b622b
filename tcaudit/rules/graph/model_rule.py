"""The base class of the TC1 model rules, and what they share.

A model rule reads one model's :class:`~tcaudit.model.facts.ModelFacts` (plain data from the audit
child) and yields findings. It never imports torch. Each rule lives in its module in this wing
(``tcaudit/rules/graph/tcNNN_*.py``, beside the rule's script half where it has one) and its
rules/TCNNN.toml entry; the one registry (:func:`tcaudit.rules.registry.discover_model_rules`) finds
them, so the catalog and the implementations cannot drift. The engine runs them on the facts the
model audit returns (:func:`tcaudit.engine.run_model_audit`).
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator

from tcaudit.catalog import RuleSpec, load_catalog
from tcaudit.costs import cost_note
from tcaudit.findings import Finding, Location, Severity
from tcaudit.model.cost import CostModel, Cost
from tcaudit.model.facts import ModelFacts, ModuleFact, OpFact, Site

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.source.parsing import SourceFile

MINOR_SHARE = 0.01  # below 1% of the model's FLOPs (or time) a finding is info, whatever its rule


@dataclass
class ModelContext:
    """What a rule may use besides the facts: settings, the cost model, and the scanned files."""

    settings: "Settings"
    facts: ModelFacts
    cost: CostModel
    sources: dict[str, "SourceFile"] = field(default_factory=dict)  # resolved absolute path → file
    # The script that builds this model never puts work on CUDA: no Tensor Core runs these layers where it
    # runs, so the alignment and precision advice is info, not a warning.
    cpu_only: bool = False

    def cost(self, spec: RuleSpec, key: str) -> str:
        """The figure ``spec``'s rule quotes under ``key`` for the target GPU, naming the GPU
        (:func:`tcaudit.costs.cost_note`)."""
        return cost_note(spec, self.settings.target, key)

    def display_path(self, path: str) -> str:
        source = self.sources.get(os.path.realpath(path))
        if source is not None:
            return source.display_path
        try:
            return os.path.relpath(path).replace(os.sep, "/") if not os.path.relpath(path).startswith("..") else path
        except ValueError:
            return path

    def line_text(self, path: str, line: int) -> str:
        source = self.sources.get(os.path.realpath(path))
        if source is not None:
            return source.line_text(line)
        return linecache.getline(path, line).rstrip("\n")

    def target_site(self) -> Site:
        """Where the model itself was constructed (or named, for a configured factory)."""
        target = self.facts.target
        construction = target.get("construction") or {}
        if self.facts.construction is not None and target.get("kind") == "factory":
            return self.facts.construction
        return Site(
            target.get("path", ""),
            int(construction.get("line", 1)),
            int(construction.get("column", 1)),
            int(construction.get("end_line", construction.get("line", 1))),
            int(construction.get("end_column", 0)),
        )

    def module_site(self, path: str | None) -> Site | None:
        """The construction line of a module, or of its nearest ancestor that has one."""
        while path is not None:
            module = self.facts.module(path)
            if module is not None and module.site is not None:
                return module.site
            if not path:
                break
            path = path.rpartition(".")[0]
        return None

    def op_site(self, op: OpFact) -> Site:
        """Where to report an op: the construction of the torch.nn layer that ran it; for code in the
        user's own forward (a matmul, a cast), the line that ran it."""
        module = self.facts.module(op.module)
        if module is not None and module.builtin and module.site is not None:
            return module.site
        if op.site is not None:
            return op.site
        return self.module_site(op.module) or self.target_site()


class ModelRule:
    """A check over one model's facts."""

    id: ClassVar[str]

    def __init__(self) -> None:
        self.spec: RuleSpec = load_catalog()[self.id]

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        raise NotImplementedError

    def severity_for(self, cost: Cost | None) -> Severity:
        """The catalog severity, lowered to info when the layer is under 1% of the model's FLOPs or
        runs within a kernel launch, fixed or not (a launch-bound step gains nothing from padding it)."""
        if cost is not None and cost.launch_bound:
            return Severity.INFO
        if cost is not None:
            share = cost.flop_share if cost.flop_share is not None else cost.time_share
            if share < MINOR_SHARE:
                return Severity.INFO
        return self.spec.severity

    def finding(
        self,
        context: ModelContext,
        site: Site,
        message: str,
        *,
        cost: Cost | None = None,
        severity: Severity | None = None,
        details: dict[str, Any] | None = None,
        explanation: str = "",
    ) -> Finding:
        path = context.display_path(site.path)
        end_line = site.end_line or site.line
        end_column = site.end_column if site.end_column else len(context.line_text(site.path, end_line)) + 1
        data: dict[str, Any] = {"model": context.facts.model_class or context.facts.target.get("label", "")}
        if details:
            data.update(details)
        if cost is not None:
            data.update(cost.details())
            data["cost_source"] = context.cost.source
        severity = severity if severity is not None else self.severity_for(cost)
        if context.cpu_only:
            severity = Severity.INFO
            data["script_uses_cuda"] = False
            explanation = " ".join(filter(None, (
                explanation, "Info: the script that builds this model never uses CUDA, so no GPU runs it there.")))
        return Finding(
            rule=self.id,
            name=self.spec.name,
            severity=severity,
            location=Location(path, site.line, site.column, end_line, max(end_column, 1)),
            message=message,
            details=data,
            source_line=context.line_text(site.path, site.line),
            scope=context.facts.model_class,
            explanation=explanation,
        )


def group_by_site(context: ModelContext, ops: Iterable[OpFact], key_extra=lambda op: ()) -> list[tuple[Site, list[OpFact]]]:
    """Ops reported at the same line with the same numbers become one finding (48 identical blocks
    built by one line are one problem with 48× the cost)."""
    groups: dict[tuple, tuple[Site, list[OpFact]]] = {}
    for op in ops:
        site = context.op_site(op)
        key = (site.path, site.line, site.column, key_extra(op))
        if key not in groups:
            groups[key] = (site, [])
        groups[key][1].append(op)
    return list(groups.values())


def describe_modules(ops: list[OpFact] | list[ModuleFact]) -> tuple[str, dict[str, Any]]:
    """``fc2`` or ``h.0.mlp.fc`` and 47 more, plus the details entries for them."""
    paths: list[str] = []
    for item in ops:
        path = item.module if isinstance(item, OpFact) else item.path
        if path is not None and path not in paths:
            paths.append(path)
    if not paths:
        return "the model's forward", {"module": ""}
    shown = f"`{paths[0]}`" if paths[0] else "the model's own forward"
    if len(paths) > 1:
        shown += f" and {len(paths) - 1} more like it"
    details: dict[str, Any] = {"module": paths[0]}
    if len(paths) > 1:
        details["modules"] = paths if len(paths) <= 64 else paths[:64]
        details["count"] = len(paths)
    return shown, details


ATTENTION_CORE = {"bmm", "baddbmm", "matmul", "__matmul__", "einsum"}


def attention_core(op: OpFact) -> bool:
    """Batched GEMMs inside nn.MultiheadAttention are its attention, judged by head dim (TC106), not by
    the GEMM rules (TC101, TC105)."""
    return op.module_type == "MultiheadAttention" and op.op in ATTENTION_CORE


def percent(share: float | None) -> str:
    if share is None:
        return "?"
    if share >= 0.1:
        return f"{share * 100:.0f}%"
    if share >= 0.001:
        return f"{share * 100:.1f}%"
    return "<0.1%"


def impact_text(cost: Cost) -> str:
    parts = []
    if cost.basis == "parameters":
        return f"{percent(cost.flop_share)} of the model's GEMM/conv weights"
    if cost.flop_share is not None:
        parts.append(f"{percent(cost.flop_share)} of the model's FLOPs")
    if cost.time_share > 0:
        share = percent(cost.time_share)
        parts.append(f"{share if share.startswith('<') else '~' + share} of the step")
    if cost.launch_bound:
        parts.append("launch-bound: even unpadded it runs within the time an eager step takes to launch it,"
                     " so padding gains nothing measurable")
    return "; ".join(parts)
