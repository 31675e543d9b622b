"""TC107 rnn-size-unaligned: an nn.LSTM / nn.GRU / nn.RNN in fp16/bf16 whose hidden size is not a
multiple of 8 (information: the gain was measured for some sizes only)."""

from __future__ import annotations

import dataclasses
from typing import Iterator

from tcaudit.findings import Finding
from tcaudit.model.cost import LARGE_BATCH, Cost, CostModel, alignment_elements, suggest
from tcaudit.model.facts import ModelFacts, OpFact, rnn_gate_gemms, short_dtype
from tcaudit.rules.base import ModelContext, ModelRule
from tcaudit.rules.graph.model_reports import describe_modules, group_by_site, impact_text

HALF = {"bfloat16", "float16"}
# Measured on one NVIDIA H200, torch 2.11.0+cu130 (benchmarks/results/h200/small_layers.json, "rnn": one
# layer, batch 64, 100 steps, forward + backward under bf16 autocast): LSTM 250→500 ran 4,880 µs, 256→512
# 2,009 µs. The one measured case of an unaligned hidden size; what estimates a finding's time lost.
MEASURED_PENALTY = 4880.0 / 2009.0
# One time step's gate GEMM (per layer and direction) that the unaligned recurrent kernel finishes within
# the time a step takes at any size, so padding it gains nothing: on the H200 above an LSTM 100→100 took
# ~7.2 µs a step and pass (2,169 µs for 100 steps × 3 passes; 104→104 the same, 2,103 µs) and the
# unaligned 250→500 one ran at 11.8 TFLOP/s: 7.2 µs × 11.8 TFLOP/s ≈ 85 MFLOP.
STEP_HIDDEN_FLOPS = 85e6
MODES = {"LSTM": "LSTM", "GRU": "GRU", "RNN_TANH": "RNN", "RNN_RELU": "RNN"}


def rnn_dtype(op: OpFact, facts: ModelFacts) -> str:
    """What the RNN computes in on the GPU: a half model's own dtype; under autocast, autocast's (CUDA
    autocast casts the whole cuDNN RNN to it); else its weights' (fp32: no Tensor Core question)."""
    weights = op.info.get("weight_dtype")
    if weights in HALF:
        return weights
    if facts.autocast and facts.compute_dtype in HALF:
        return facts.compute_dtype
    return weights or facts.compute_dtype


def unaligned_sizes(op: OpFact, dtype: str, cost: CostModel) -> list[tuple[str, int]]:
    """``[("hidden_size", 500), ("input_size", 250)]``: the sizes to pad, or nothing. Only an unaligned
    hidden size is reported (with only the input size off, 300→1000, padding measured 1.04× for an LSTM
    and 0.92× for a GRU); the input size joins it unless the data sets it (the RNN reads the model's
    input), and a hidden size the model returns as is (its output) is the task's."""
    info = op.info
    hidden = info["hidden_size"]
    if cost.aligned(hidden, dtype) or (info.get("model_output") and not info.get("proj_size")):
        return []
    out = [("hidden_size", hidden)]
    if not cost.aligned(info["input_size"], dtype) and not info.get("model_input"):
        out.append(("input_size", info["input_size"]))
    return out


def step_flops(op: OpFact) -> float:
    """The largest gate GEMM of one time step (one layer, one direction): 2 × batch × N × K."""
    batch = op.info["batch"]
    return max(2.0 * batch * n * k for n, k in rnn_gate_gemms(op.info))


def launch_bound(op: OpFact, cost: CostModel) -> bool:
    """The RNN gains nothing measurable from padding: the whole op runs within a launch, or each time
    step's GEMM within the time a step takes anyway (with an assumed batch, judged at LARGE_BATCH rows
    as :meth:`CostModel.within_launch` does)."""
    if cost.within_launch([op], MEASURED_PENALTY):
        return True
    per_step = step_flops(op)
    if cost.facts.input.get("assumed", True):
        per_step *= max(1.0, LARGE_BATCH / max(1, op.info["batch"]))
    return per_step <= STEP_HIDDEN_FLOPS


def slowdown_cost(ops: list[OpFact], cost: CostModel) -> Cost:
    """The time the RNNs lose at the measured slowdown. The cost model's current time has no penalty for
    an RNN (it times one at its ideal rate): the slowdown is added to it, so the share stays a share."""
    estimate = cost.compute_cost(ops, MEASURED_PENALTY)
    current = cost.current_time + estimate.lost_s
    estimate.time_share = estimate.lost_s / current if current else 0.0
    return estimate


def same_layer(op: OpFact) -> tuple:
    """RNNs built by one line with the same sizes are one finding."""
    return op.info["mode"], op.info["input_size"], op.info["hidden_size"], op.dtype


class RnnSizeUnaligned(ModelRule):
    id = "TC107"

    def check(self, facts: ModelFacts, context: ModelContext) -> Iterator[Finding]:
        cost = context.cost_model
        flagged: list[OpFact] = []
        for op in facts.ops_of("rnn"):
            if not op.info.get("batch") or op.flops <= 0:
                continue  # a packed sequence: its batch, and so its step, is not known
            dtype = rnn_dtype(op, facts)
            if dtype not in HALF or not unaligned_sizes(op, dtype, cost):
                continue
            # The cost model rates the op at its compute dtype: give it the one it runs in.
            op = dataclasses.replace(op, dtype=dtype)
            if not launch_bound(op, cost):
                flagged.append(op)
        for site, ops in group_by_site(context, flagged, same_layer):
            yield self._report(context, site, ops)

    def _report(self, context: ModelContext, site, ops: list[OpFact]) -> Finding:
        cost = context.cost_model
        first = ops[0]
        info, dtype = first.info, first.dtype
        bad = unaligned_sizes(first, dtype, cost)
        suggested = {name: suggest(size, dtype) for name, size in bad}
        estimate = slowdown_cost(ops, cost)
        shown, module_details = describe_modules(ops)
        mode = MODES.get(info["mode"], info["mode"])
        sizes = " and ".join(f"{name} {size}" for name, size in bad)
        targets = " and ".join(str(suggested[name]) for name, _ in bad)
        align = alignment_elements(dtype)
        multiple = "not a multiple" if len(bad) == 1 else "not multiples"
        message = (f"{shown} ({mode} {info['input_size']}→{info['hidden_size']}, {short_dtype(dtype)}) has {sizes}, "
                   f"{multiple} of {align}; pad to {targets}")
        measured = context.cost(self.spec, "unaligned_hidden")
        input_only = context.cost(self.spec, "input_only")
        explanation = (
            f"cuDNN's recurrent kernels take their fast Tensor Core path when the sizes are multiples of {align} "
            f"in {short_dtype(dtype)}{measured}. The gain depends on the sizes{input_only}: time a step before "
            "and after padding"
        )
        impact = impact_text(estimate)
        if impact:
            explanation += f" [{impact}]"
        details = {
            **module_details,
            "mode": info["mode"],
            "input_size": info["input_size"],
            "hidden_size": info["hidden_size"],
            "proj_size": info.get("proj_size", 0),
            "num_layers": info["num_layers"],
            "bidirectional": info["bidirectional"],
            "batch": info["batch"],
            "seq": info.get("seq"),
            "dtype": dtype,
            "step_flops": step_flops(first),
            "unaligned": dict(bad),
            "suggested": suggested,
        }
        return self.finding(context, site, message, cost=estimate, details=details, explanation=explanation + ".")
