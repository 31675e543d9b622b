"""Alignment rules and the cost model that turns a finding into an estimated time lost.

The numbers come from a cost table: the packaged ``cost_table.json`` (the H200 entry measured by
``tcaudit calibrate``, the rest from the team's H200 measurements with PyTorch 2.11, quoted in
BENCHMARKS.md), with the user's own table merged over it when there is
one: ``$TCAUDIT_COST_TABLE`` when set, else ``tcaudit calibrate``'s default output
(``$XDG_CACHE_HOME/tcaudit/cost_table.json``, ``~/.cache`` without XDG_CACHE_HOME). A GEMM's stride-1
dimensions (K and N) must be multiples of 16 bytes for the Tensor Core fast path: 8 elements in
fp16/bf16, 4 in fp32 (TF32), 16 in int8/fp8. An op's time is its FLOPs over the table's achieved rate
for its dtype, times the penalties that apply to it; a finding's ``est_time_lost`` is the time it adds
as a share of the model's estimated current time, so the numbers of different findings are
comparable and add up.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tcaudit import gpus
from tcaudit.model.facts import DTYPE_BYTES, ModelFacts, OpFact

COST_TABLE = Path(__file__).with_name("cost_table.json")
TABLE_ENV = "TCAUDIT_COST_TABLE"  # a cost table to merge over the packaged one (e.g. `tcaudit calibrate -o`)
PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
TRAINING_FACTOR = 3.0  # a training step costs about three forward passes
# An eager training step issues each op from Python: a GEMM or conv of fewer FLOPs than this runs,
# unaligned or not, within the host's time to launch it, so padding it gains nothing measurable. The
# table's ``launch.hidden_flops`` (measured by ``tcaudit calibrate``: 906 MFLOP on the H200) replaces
# this conservative default for a table without one.
DEFAULT_HIDDEN_FLOPS = 5e7
LARGE_BATCH = 512  # where the audit assumed a batch, launch-bound is judged as if the script used this one
LARGE_SEQUENCE = 1024  # and where it assumed a sequence length, as if the script used this one
# A step is launch-bound when twice its GEMM/conv work still averages within a launch per op: the
# margin keeps models near the line (a CIFAR ResNet18 at batch 256) out of the claim.
STEP_MARGIN = 2.0
_PENALTY_KEYS = (("gemm", "m_unaligned"), ("gemm", "not_multiple_of_64"), ("conv", "channels_unaligned"),
                 ("sdpa", "head_dim_unsupported"))


def default_user_table() -> Path:
    """Where ``tcaudit calibrate`` writes by default (``calibrate.DEFAULT_OUTPUT``), read at call time."""
    from tcaudit.cache import user_cache_dir

    return user_cache_dir() / "cost_table.json"


def user_table_path() -> tuple[Path | None, bool]:
    """The user's cost table to merge, and whether it was asked for (``$TCAUDIT_COST_TABLE``) rather
    than found at the default place. ``(None, False)``: no user table."""
    named = os.environ.get(TABLE_ENV, "").strip()
    if named:
        return Path(named).expanduser(), True
    default = default_user_table()
    return (default, False) if default.is_file() else (None, False)


def load_table(path: str | None = None) -> dict[str, Any]:
    """The cost table the audit uses: ``path`` alone when given; else the packaged table with the
    user's table (see :func:`user_table_path`) merged over it. Never raises for a bad user table: the
    packaged one is used and :func:`table_notes` says why. The result is shared: do not modify it."""
    if path is not None:
        return _read_json(str(path))
    return _resolved().table


def table_notes() -> list[str]:
    """What the scan should say about the cost table in use (a user table that is missing, unreadable
    or invalid, and so was not used)."""
    return list(_resolved().notes)


@dataclass(frozen=True)
class _Loaded:
    table: dict[str, Any]
    notes: tuple[str, ...] = ()


def _resolved() -> _Loaded:
    user, named = user_table_path()
    if user is None:
        return _merged(None, None, False)
    try:
        stat = user.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None
    return _merged(str(user), stamp, named)


@functools.lru_cache(maxsize=16)
def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@functools.lru_cache(maxsize=8)
def _merged(user: str | None, stamp: tuple[int, int] | None, named: bool) -> _Loaded:
    """The packaged table with ``user``'s GPU entries over it (``stamp`` keys the cache on the file's
    modification time and size)."""
    packaged = _read_json(str(COST_TABLE))
    if user is None:
        return _Loaded(packaged)
    where = f"{user} (from ${TABLE_ENV})" if named else user
    if stamp is None:
        return _Loaded(packaged, (f"cost table {where} not found; using the packaged table",))
    try:
        with open(user, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else f"{type(exc).__name__}: {exc}"
        return _Loaded(packaged, (f"cost table {where} is unreadable ({reason}); using the packaged table",))
    problem = table_problem(data)
    if problem:
        return _Loaded(packaged, (f"cost table {where} is invalid ({problem}); using the packaged table",))
    return _Loaded(merge_tables(packaged, data, user))


def merge_tables(packaged: dict[str, Any], user: dict[str, Any],
                 where: str = "the user's cost table") -> dict[str, Any]:
    """``user``'s GPU entries over ``packaged``'s.

    ``tcaudit calibrate`` writes the whole table, the packaged entries included, so a user table also
    holds copies of the packaged entries as they were when it ran. An entry of the user's replaces the
    packaged one when it is the user's own: a GPU the package has no entry for, or an entry with a
    ``calibrated`` block (what calibrate writes for the GPU it measured) other than the packaged
    entry's. Copies (no ``calibrated`` block, or the packaged one's) are left out, so that a newer
    package's numbers are not hidden by an older copy of them. The user's ``default_gpu`` becomes the
    default when its entry was taken; ``sources`` says where each GPU's numbers come from.
    """
    table = copy.deepcopy(packaged)
    gpus = table.setdefault("gpus", {})
    sources = {key: packaged.get("source", "cost table") for key in gpus}
    taken = set()
    for key, entry in user.get("gpus", {}).items():
        current = gpus.get(key)
        calibrated = entry.get("calibrated")
        if current is not None and (not calibrated or calibrated == current.get("calibrated")):
            continue
        gpus[key] = copy.deepcopy(entry)
        taken.add(key)
        if isinstance(calibrated, dict):
            sources[key] = (f"tcaudit calibrate on {entry.get('device', key)}, torch {calibrated.get('torch', '?')}, "
                            f"{calibrated.get('date', '?')} ({where})")
        else:
            sources[key] = f"{user.get('source', 'cost table')} ({where})"
    if user.get("default_gpu") in taken:
        table["default_gpu"] = user["default_gpu"]
    table["source"] = sources.get(table["default_gpu"], table.get("source", "cost table"))
    table["sources"] = sources
    return table


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def table_problem(data: Any) -> str:
    """What makes ``data`` unusable as a cost table (empty: nothing); every number the cost model reads
    must be there and positive."""
    if not isinstance(data, dict):
        return "not a JSON object"
    gpus = data.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        return "no `gpus` entries"
    if "default_gpu" in data and not isinstance(data["default_gpu"], str):
        return "`default_gpu` is not a string"
    for key, entry in gpus.items():
        if not isinstance(entry, dict):
            return f"gpus.{key} is not an object"
        rates = entry.get("rates")
        if not isinstance(rates, dict):
            return f"gpus.{key}.rates is missing"
        for name in ("bfloat16", "hbm_bytes_per_s"):
            if not _positive(rates.get(name)):
                return f"gpus.{key}.rates.{name} is not a positive number"
        for name, value in rates.items():
            if not _positive(value):
                return f"gpus.{key}.rates.{name} is not a positive number"
        gemm = entry.get("gemm")
        if not isinstance(gemm, dict):
            return f"gpus.{key}.gemm is missing"
        for side in ("k_unaligned", "n_unaligned"):
            table = gemm.get(side)
            if not isinstance(table, dict):
                return f"gpus.{key}.gemm.{side} is missing"
            for alignment in ("1", "2", "4", "8"):
                if not _positive(table.get(alignment)):
                    return f"gpus.{key}.gemm.{side}.{alignment} is not a positive number"
        for group, name in _PENALTY_KEYS:
            section = entry.get(group)
            if not isinstance(section, dict) or not _positive(section.get(name)):
                return f"gpus.{key}.{group}.{name} is not a positive number"
        if "alignment_bytes" in entry and not _positive(entry["alignment_bytes"]):
            return f"gpus.{key}.alignment_bytes is not a positive number"
    return ""


def _penalty(value: Any) -> float:
    """A measured slowdown; a ratio under 1 is timing noise around "no penalty"."""
    return max(1.0, float(value))


def itemsize(dtype: str | None) -> int:
    return DTYPE_BYTES.get(dtype or "", 2)


def alignment_elements(dtype: str | None, alignment_bytes: int = 16) -> int:
    return max(1, alignment_bytes // itemsize(dtype))


def byte_alignment(dim: int, dtype: str | None, cap: int = 16) -> int:
    """The largest power of two (up to ``cap``) dividing the dimension's size in bytes."""
    size = dim * itemsize(dtype)
    alignment = 1
    while alignment < cap and size % (alignment * 2) == 0:
        alignment *= 2
    return alignment


def is_aligned(dim: int, dtype: str | None, alignment_bytes: int = 16) -> bool:
    return (dim * itemsize(dtype)) % alignment_bytes == 0


def round_up(size: int, multiple: int) -> int:
    """``size`` rounded up to a multiple of ``multiple``."""
    return -(-size // multiple) * multiple


def suggest(dim: int, dtype: str | None, table: dict[str, Any] | None = None) -> int:
    """The padded size to recommend for a GEMM or convolution width, the one policy the model audit's
    messages and ``fix --pad-dims`` share: the next multiple of 64 for large dims, else of the
    alignment."""
    table = table or load_table()
    multiple = table.get("preferred_multiple", 64) if dim >= table.get("preferred_from", 256) else alignment_elements(dtype)
    return round_up(dim, multiple)


@dataclass
class Cost:
    """The estimated cost of one finding."""

    penalty: float  # × slower than fixed
    lost_s: float  # forward seconds lost on the reference GPU
    flop_share: float | None  # share of the model's forward FLOPs (None: not a compute op)
    time_share: float  # share of the model's estimated current step time
    basis: str = "graph"  # "parameters" when no graph ran the layer: shares are of GEMM/conv weights
    # The ops run shorter than the host takes to launch them, fixed or not: the penalty is hidden.
    launch_bound: bool = False

    def details(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "penalty": round(self.penalty, 2),
            "est_time_lost": round(self.time_share, 4),
            "est_time_lost_ms": round(self.lost_s * TRAINING_FACTOR * 1000, 4),
        }
        if self.flop_share is not None:
            data["flop_share"] = round(self.flop_share, 4)
        if self.basis != "graph":
            data["impact_basis"] = self.basis
            data.pop("est_time_lost_ms")
        if self.launch_bound:
            data["launch_bound"] = True
        return data


@dataclass
class CostModel:
    """Per-model cost estimates shared by the TC1 rules."""

    facts: ModelFacts
    precision: str = "auto"
    gpu: str = "auto"
    table: dict[str, Any] = field(default_factory=load_table)

    def __post_init__(self) -> None:
        default = self.table["default_gpu"]
        arch = gpus.target(self.gpu).arch  # ``a10`` -> ``sm_86``: the table is keyed by architecture
        self.gpu_key = arch if arch in self.table["gpus"] else default
        self.entry = self.table["gpus"][self.gpu_key]
        self.alignment_bytes = int(self.entry.get("alignment_bytes", self.table.get("alignment_bytes", 16)))
        self.source = self.table.get("sources", {}).get(self.gpu_key) or self.table.get("source", "cost table")
        if arch not in ("auto", self.gpu_key):
            self.source += f" (measured on {self.gpu_key}; no table for {self.gpu} yet)"
        self._total_params = sum(self._layer_params(m.attrs) for m in self.facts.modules.values())
        self.hidden_flops = float(self.entry.get("launch", {}).get("hidden_flops", DEFAULT_HIDDEN_FLOPS))
        self._ideal = sum(self.ideal_time(op) for op in self.facts.ops)
        extra = sum(self.ideal_time(op) * (self.op_penalty(op) - 1.0) for op in self.facts.ops)
        # Every non-view op writes its output once and a later op reads it: a memory-bound baseline.
        memory = 2.0 * self.facts.activation_bytes / float(self.entry["rates"]["hbm_bytes_per_s"])
        self._current = self._ideal + extra + memory

    @property
    def device_name(self) -> str:
        """The GPU this table's figures were measured on (``NVIDIA H200``), as messages name it."""
        return str(self.entry.get("device", self.gpu_key))

    # -- dtypes and alignment -------------------------------------------------------------
    def dtype(self, op: OpFact | None = None) -> str:
        if op is not None and op.dtype:
            return op.dtype
        return self.facts.compute_dtype

    def aligned(self, dim: int, dtype: str | None) -> bool:
        return is_aligned(dim, dtype, self.alignment_bytes)

    def rate(self, dtype: str | None) -> float:
        rates = self.entry["rates"]
        return float(rates.get(dtype or "", rates["bfloat16"]))

    # -- penalties ------------------------------------------------------------------------
    def gemm_kn_penalty(self, k: int, n: int, dtype: str | None) -> float:
        gemm = self.entry["gemm"]
        penalty = 1.0
        if not self.aligned(k, dtype):
            penalty = max(penalty, _penalty(gemm["k_unaligned"][str(byte_alignment(k, dtype))]))
        if not self.aligned(n, dtype):
            penalty = max(penalty, _penalty(gemm["n_unaligned"][str(byte_alignment(n, dtype))]))
        return penalty

    def gemm_m_penalty(self, m: int, dtype: str | None) -> float:
        return 1.0 if self.aligned(m, dtype) else _penalty(self.entry["gemm"]["m_unaligned"])

    def not_64_penalty(self) -> float:
        return _penalty(self.entry["gemm"]["not_multiple_of_64"])

    def conv_penalty(self) -> float:
        return _penalty(self.entry["conv"]["channels_unaligned"])

    def sdpa_penalty(self) -> float:
        return _penalty(self.entry["sdpa"]["head_dim_unsupported"])

    def op_penalty(self, op: OpFact) -> float:
        dtype = self.dtype(op)
        info = op.info
        if op.kind == "gemm":
            return self.gemm_kn_penalty(info["k"], info["n"], dtype) * self.gemm_m_penalty(info["m"], dtype)
        if op.kind == "conv":
            return self.conv_penalty() if self.conv_unaligned(info, dtype) else 1.0
        if op.kind == "sdpa":
            return self.sdpa_penalty() if self.head_dim_unsupported(info["head_dim"]) else 1.0
        return 1.0

    def conv_unaligned(self, info: dict[str, Any], dtype: str | None) -> list[str]:
        """Which of a conv's channel counts miss the alignment. Grouped and depthwise convs do not run
        as one implicit GEMM and are not counted."""
        if info.get("groups", 1) != 1:
            return []
        out = []
        for key in ("c_in", "c_out"):
            # 1-4 channels are image inputs and outputs (RGB, masks): normal, and the stem is TC103's.
            if info[key] > 4 and not self.aligned(info[key], dtype):
                out.append(key)
        return out

    @staticmethod
    def head_dim_unsupported(head_dim: int) -> bool:
        """Flash attention needs a head dim that is a multiple of 8 and at most 256."""
        return head_dim % 8 != 0 or head_dim > 256

    # -- times ----------------------------------------------------------------------------
    def ideal_time(self, op: OpFact) -> float:
        if op.flops <= 0:
            return 0.0
        return op.flops / self.rate(self.dtype(op))

    def within_launch(self, ops: list[OpFact], penalty: float) -> bool:
        """Whether every op, ``penalty`` × slower, still runs within the host's time to launch it (a
        128×20×400 GEMM's few nanoseconds of math wait on a launch of microseconds). With the script's
        own batch the ops are judged as captured; with an assumed one, as if the batch were
        :data:`LARGE_BATCH` (a 10-wide layer is within a launch at any batch a script uses)."""
        if not ops or penalty <= 1.0:
            return False
        scale = self.assumed_scale()
        if scale is None:
            return False
        # hidden_flops was measured with the unaligned GEMM's own penalty: compare the op's FLOPs alone.
        return all(op.flops * scale <= self.hidden_flops for op in ops)

    def assumed_scale(self) -> float | None:
        """How much larger the script's step may be than the captured one: 1 with the script's own
        input; with an assumed batch, as if it were :data:`LARGE_BATCH`; with an assumed sequence, as if
        it were :data:`LARGE_SEQUENCE` (an image size the audit picked from the common ones is the one
        the model accepts, or 224 for a model that takes any: no smaller than the script's in practice).
        None where the captured input has no batch to scale."""
        if not self.facts.input.get("assumed", True):
            return 1.0
        shapes = self.facts.input.get("shapes") or [[]]
        batch = shapes[0][0] if shapes[0] and isinstance(shapes[0][0], int) and shapes[0][0] > 0 else 0
        if not batch:
            return None
        origin = str(self.facts.input.get("origin") or "")
        if "origin" not in self.facts.input or re.match(r"batch \d+ \(assumed\)", origin):
            scale = max(1.0, LARGE_BATCH / batch)
        else:
            scale = 1.0
        sequence = re.search(r"sequence (\d+) \(assumed\)", origin)
        if sequence:
            scale *= max(1.0, LARGE_SEQUENCE / int(sequence.group(1)))
        return scale

    def layer_within_launch(self, attrs: dict[str, Any]) -> bool:
        """Whether a Linear known only from its parameters runs within a launch at any step a script
        uses: :data:`LARGE_BATCH` rows, times :data:`LARGE_SEQUENCE` positions in a model with
        embeddings, attention or RNNs (a PPO critic's 4→64 layer: 0.3 MFLOP against 0.9 GFLOP)."""
        if attrs.get("role") != "linear":
            return False
        sequences = any(m.attrs.get("role") in ("embedding", "mha", "rnn") for m in self.facts.modules.values())
        rows = LARGE_BATCH * (LARGE_SEQUENCE if sequences else 1)
        return 2.0 * rows * attrs["in_features"] * attrs["out_features"] <= self.hidden_flops

    def step_within_launch(self, ops: list[OpFact]) -> bool:
        """Whether the step's Tensor Core work, spread over its GEMM/conv/attention launches and twice
        as large (:data:`STEP_MARGIN`), averages within the time the host takes to launch one (an MNIST
        Net at batch 64: 1.5 GFLOP over four ops, 0.77 doubled, against 0.9 GFLOP per launch on an
        H200; a CIFAR ResNet18 at batch 256, 0.9 GFLOP per op, is not): precision, TF32 and memory
        format cannot shorten such a step measurably, whatever one of its ops does. Judged at the
        script's step size, or at :meth:`assumed_scale`'s where the audit guessed it."""
        scale = self.assumed_scale()
        if not ops or scale is None:
            return False
        return sum(op.flops for op in ops) * scale * STEP_MARGIN <= self.hidden_flops * len(ops)

    @property
    def current_time(self) -> float:
        return self._current

    def compute_cost(self, ops: list[OpFact], penalty: float) -> Cost:
        """Cost of ops that run ``penalty`` × slower than they would once fixed; ops whose slow
        version still runs within a launch lose nothing (the step is launch-bound there)."""
        hidden = self.within_launch(ops, penalty)
        lost = 0.0 if hidden else sum(self.ideal_time(op) for op in ops) * (penalty - 1.0)
        flops = sum(op.flops for op in ops)
        flop_share = flops / self.facts.total_flops if self.facts.total_flops else 0.0
        return Cost(penalty, lost, flop_share, lost / self._current if self._current else 0.0, launch_bound=hidden)

    def dtype_cost(self, ops: list[OpFact]) -> Cost:
        """Cost of ops that run in fp32/fp64 instead of the configured low precision."""
        target = self.facts.compute_dtype if self.facts.compute_dtype in ("bfloat16", "float16") else "bfloat16"
        lost = sum(op.flops / self.rate(self.dtype(op)) - op.flops / self.rate(target) for op in ops)
        flops = sum(op.flops for op in ops)
        slow = sum(op.flops / self.rate(self.dtype(op)) for op in ops)
        penalty = slow / (slow - lost) if slow > lost > 0 else 1.0
        flop_share = flops / self.facts.total_flops if self.facts.total_flops else 0.0
        return Cost(penalty, lost, flop_share, lost / self._current if self._current else 0.0)

    def memory_cost(self, bytes_moved: float) -> Cost:
        """Cost of extra memory-bound work (a cast, a bias add) that reads and writes ``bytes_moved``."""
        lost = bytes_moved / float(self.entry["rates"]["hbm_bytes_per_s"])
        share = lost / self._current if self._current else 0.0
        return Cost(1.0, lost, None, share)

    def parameter_cost(self, attrs: dict[str, Any], penalty: float) -> Cost:
        """No graph: a layer's share of the model's GEMM/conv parameters stands in for its FLOP share."""
        params = self._layer_params(attrs)
        share = params / self._total_params if self._total_params else 0.0
        return Cost(penalty, 0.0, share, share * (penalty - 1.0) / (1.0 + share * (penalty - 1.0)), "parameters")

    @staticmethod
    def _layer_params(attrs: dict[str, Any]) -> int:
        role = attrs.get("role")
        if role == "linear":
            return attrs["in_features"] * attrs["out_features"]
        if role == "conv":
            kernel = 1
            for k in attrs.get("kernel_size", [1]):
                kernel *= k
            return attrs["in_channels"] * attrs["out_channels"] * kernel // max(1, attrs.get("groups", 1))
        if role == "mha":
            return 4 * attrs["embed_dim"] * attrs["embed_dim"]
        return 0
