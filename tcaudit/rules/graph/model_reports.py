"""How the TC1 model rules group, locate and word what they report: ops reported at one line become
one finding, module paths become a short list, shares become percentages, and which batched GEMMs are
an attention's (TC106's, not the GEMM rules')."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from tcaudit.model.facts import ModuleFact, OpFact, Site

if TYPE_CHECKING:
    from tcaudit.model.cost import Cost
    from tcaudit.rules.base import ModelContext


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
