"""TC108 fp8-candidate: on Hopper and newer, a bf16/fp16 model whose GEMMs are large enough that FP8
training pays (information; never a fix)."""

from __future__ import annotations

import os
import re
from typing import Iterator

from tcaudit import gpus
from tcaudit.costs import measured
from tcaudit.findings import Finding
from tcaudit.model.channel import read_project_file
from tcaudit.model.facts import ModelFacts, OpFact, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import percent

HALF = {"bfloat16", "float16"}
FP8 = {"float8_e4m3fn", "float8_e5m2"}
# Measured on one NVIDIA H200, torch 2.11.0+cu130 (benchmarks/results/h200/small_layers.json, "fp8"): an
# e4m3 torch._scaled_mm against a bf16 GEMM ran 0.73× at 1024³, 0.97× at 2048³ and 1.69× at 4096³.
MIN_DIM = 4096
MIN_SHARE = 0.5  # of the model's GEMM FLOPs: below it the rest of the step keeps most of the time
MIN_ARCH = 90  # Hopper: the GPU the figures were measured on, and what TransformerEngine's FP8 targets
# The file already trains in FP8, or casts to it by hand.
USES_FP8 = re.compile(r"transformer_engine|torchao|_scaled_mm|float8_e4m3|float8_e5m2|Float8|fp8_autocast")
# The script trains in half precision (autocast, a half model, a trainer's precision flag); without any of
# these the GEMMs run in fp32 and TC201 comes first.
USES_HALF = re.compile(r"autocast|bfloat16|float16|\.half\(|\bbf16|\bfp16|\bamp\b")


def large(op: OpFact) -> bool:
    info = op.info
    return min(info["m"], info["n"], info["k"]) >= MIN_DIM


def target_arch(context: ModelContext) -> int | None:
    """The target GPU's architecture number (90 for ``sm_90``); with ``gpu = "auto"`` and none
    detected, that of the GPU the cost table was measured on, as the rest of the model audit assumes."""
    arch = context.settings.target.arch
    if arch == gpus.AUTO:
        arch = context.cost_model.gpu_key
    try:
        return gpus.arch_number(arch)
    except ValueError:
        return None


def read_text(context: ModelContext, path: str) -> str:
    source = context.sources.get(os.path.realpath(path))
    if source is not None:
        return source.text
    raw = read_project_file(path)  # never a FIFO or a device a result could name
    return raw.decode("utf-8", "replace") if raw is not None else ""


class Fp8Candidate(ModelRule):
    id = "TC108"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        arch = target_arch(context)
        if arch is None or arch < MIN_ARCH:
            return
        if facts.input.get("assumed", True):
            return  # M is batch × tokens: with a guessed batch or sequence the sizes are the audit's, not the script's
        cost = context.cost_model
        gemms = [op for op in facts.ops_of("gemm") if op.flops > 0]
        total = sum(op.flops for op in gemms)
        if not total or any(op.dtype in FP8 for op in facts.ops):
            return
        big = [op for op in gemms if large(op) and cost.dtype(op) in HALF]
        share = sum(op.flops for op in big) / total
        if share < MIN_SHARE:
            return
        files = [facts.target.get("path", ""), *facts.depends_on]
        texts = [read_text(context, path) for path in files if path]
        if any(USES_FP8.search(text) for text in texts):
            return
        if facts.target.get("kind") == "script" and not any(USES_HALF.search(text) for text in texts):
            return  # the script trains in fp32: autocast first (TC201)
        yield self._report(context, facts, big, share)

    def _report(self, context: ModelContext, facts: ModelFacts, big: list[OpFact], share: float) -> Finding:
        largest = max(big, key=lambda op: op.flops)
        dtype = short_dtype(context.cost_model.dtype(largest))
        gpu = context.settings.gpu
        info = largest.info
        entry = measured(self.spec, context.settings.target)
        if entry and "speedup" in entry:
            figure = f"FP8 ran them {entry['speedup']} faster ({entry.get('gpu', gpu)})"
        else:
            target = context.settings.target.gpu
            figure = f"FP8 may run them faster (not measured on {target.name if target else gpu})"
        message = (f"≥{MIN_DIM}³ {dtype} GEMMs do {percent(share)} of GEMM FLOPs: {figure}; "
                   "needs TE/torchao.float8 fused casts")
        faster = context.cost(self.spec, "gemm")
        naive = context.cost(self.spec, "naive")
        explanation = (
            f"FP8 Tensor Cores run GEMMs this large faster than {dtype}{faster}, but quantizing both operands in "
            f"separate kernels every step eats most of the gain{naive}: train with TransformerEngine (`te.Linear` "
            "under `te.fp8_autocast`) or torchao.float8 (`convert_to_float8_training`), whose casts are fused, "
            f"and compare the loss curve with {dtype}'s"
        )
        site = context.op_site(largest)
        details = {
            "flop_share_large_gemms": round(share, 4),
            "gemms": len(big),
            "dtype": context.cost_model.dtype(largest),
            "largest": {"module": largest.module or "", "m": info["m"], "n": info["n"], "k": info["k"],
                        "line": site.line},
            "min_dim": MIN_DIM,
        }
        if facts.total_flops:
            details["flop_share"] = round(sum(op.flops for op in big) / facts.total_flops, 4)
        return self.finding(context, context.target_site(), message, details=details, explanation=explanation + ".")
