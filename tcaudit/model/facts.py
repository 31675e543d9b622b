"""What the audit child learns about one model, as plain data (no torch).

The child process builds the model, captures its graph and normalises every node that matters (GEMMs,
convolutions, attention, embeddings, norms, casts) into :class:`OpFact` records; the module tree
becomes :class:`ModuleFact` records. Both travel to the parent as JSON, where the TC1 rules read them.
Keeping the rules on this side means the scanner never imports torch and every rule can be tested
on hand-written facts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Bytes per element of the dtypes a GEMM can run in. Names follow torch's (``torch.bfloat16`` → ``bfloat16``).
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "int64": 8,
    "int32": 4,
    "bool": 1,
}
SHORT_DTYPE = {
    "float64": "fp64",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8": "int8",
}


def short_dtype(dtype: str | None) -> str:
    return SHORT_DTYPE.get(dtype or "", dtype or "?")


@dataclass(frozen=True)
class Site:
    """A place in a user's file: absolute path, 1-based line and character column, end inclusive."""

    path: str
    line: int
    column: int = 1
    end_line: int = 0
    end_column: int = 0

    def to_json(self) -> list:
        return [self.path, self.line, self.column, self.end_line or self.line, self.end_column]

    @classmethod
    def from_json(cls, data: Any) -> "Site | None":
        if not data:
            return None
        path, line, column, end_line, end_column = data
        return cls(path, int(line), int(column), int(end_line), int(end_column))


@dataclass
class ModuleFact:
    """One ``nn.Module`` of the built model."""

    path: str  # "" for the root, "layer4.2.conv3" below it
    type: str  # class name
    builtin: bool  # defined in torch.nn (its construction line is the interesting place, not its source)
    site: Site | None = None  # where the user's code constructed it
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpFact:
    """One node of a captured graph that a rule may care about.

    ``kind`` is one of ``gemm``, ``conv``, ``sdpa``, ``embedding``, ``norm``, ``cast`` and ``rnn``;
    ``info`` holds the kind's numbers: GEMM ``m``/``n``/``k``/``batch``; conv ``c_in``/``c_out``/``groups``/
    ``bias``/``stem``; SDPA ``head_dim``/``head_dim_v``/``heads``; embedding ``rows``/``dim``; norm
    ``after`` (index of the op feeding it); cast ``src``/``dst``/``explicit``/``input_is_graph_input``/
    ``after``/``users``; rnn (an ``nn.LSTM``/``GRU``/``RNN``) ``mode``/``gates``/``input_size``/
    ``hidden_size``/``proj_size``/``num_layers``/``bidirectional``/``batch``/``seq`` (None when packed)/
    ``tokens``/``weight_dtype``.
    """

    index: int
    kind: str
    op: str  # normalised operator name: linear, matmul, bmm, conv2d, scaled_dot_product_attention, ...
    module: str | None  # path of the innermost module running it
    module_type: str | None
    graph: int
    dtype: str | None  # the dtype it computes in (under the simulated precision)
    shapes: list[list[int]] = field(default_factory=list)  # input shapes, then the output shape last
    flops: float = 0.0  # forward FLOPs (torch.utils.flop_counter formulas)
    site: Site | None = None  # the user's line that ran it (from the graph's stack trace)
    info: dict[str, Any] = field(default_factory=dict)


def rnn_gate_gemms(info: dict[str, Any]) -> list[tuple[int, int]]:
    """(N, K) of the gate GEMM of each layer and direction: N = gates × hidden, K = the layer's input
    width plus the recurrent width (the projection's, with ``proj_size``)."""
    recurrent = info["proj_size"] or info["hidden_size"]
    directions = 2 if info["bidirectional"] else 1
    out = []
    for layer in range(info["num_layers"]):
        width = info["input_size"] if layer == 0 else directions * recurrent
        out += [(info["gates"] * info["hidden_size"], width + recurrent)] * directions
    return out


@dataclass
class CaptureInfo:
    method: str = "none"  # export | dynamo | fx | parameters
    graphs: int = 0
    failures: list[str] = field(default_factory=list)  # "export: reason", ...
    notes: list[str] = field(default_factory=list)
    fast_path: str = ""  # why the fx fast path was not taken ("fx: reason"); empty when it was


@dataclass
class ModelFacts:
    """Everything the rules know about one audited model, or why it could not be audited."""

    target: dict[str, Any]  # the discovery record: label, path, line, column, ...
    status: str = "ok"  # ok | failed | skipped | budget (not run: the scan's model budget was spent)
    reason: str = ""
    model_class: str = ""
    param_count: int = 0
    param_dtype: str = "float32"
    input: dict[str, Any] = field(default_factory=dict)  # shapes, dtype, origin
    compute_dtype: str = "bfloat16"  # what autocast (or the model's own dtype) makes GEMMs run in
    autocast: bool = True
    capture: CaptureInfo = field(default_factory=CaptureInfo)
    total_flops: float = 0.0
    activation_bytes: float = 0.0  # bytes written by the graph's non-view ops (memory-bound baseline)
    modules: dict[str, ModuleFact] = field(default_factory=dict)
    ops: list[OpFact] = field(default_factory=list)
    construction: Site | None = None  # the model's construction expression
    timings: dict[str, float] = field(default_factory=dict)
    # The user's files the build imported (sibling modules, the factory's module): a cached result
    # stays valid while none of them changes.
    depends_on: list[str] = field(default_factory=list)

    # -- queries the rules share -------------------------------------------------------------
    def ops_of(self, *kinds: str) -> list[OpFact]:
        return [op for op in self.ops if op.kind in kinds]

    def module(self, path: str | None) -> ModuleFact | None:
        if path is None:
            return None
        return self.modules.get(path)

    def reached_modules(self) -> set[str]:
        """Modules (and their ancestors) that ran at least one recorded op."""
        reached: set[str] = set()
        for op in self.ops:
            path = op.module
            while path:
                reached.add(path)
                path = path.rpartition(".")[0]
        if self.ops:
            reached.add("")  # the root ran its forward (a lone nn.Linear trained as the model has no other path)
        return reached

    def unreached(self, *roles: str) -> list[ModuleFact]:
        """Layers of these roles (``linear``, ``conv``, ``embedding``, ``mha``, ``norm``) that no
        captured graph ran, or all of them when nothing was captured: checked from their parameters."""
        if self.status != "ok":
            return []
        if self.capture.method == "parameters":
            return [m for m in self.modules.values() if m.attrs.get("role") in roles]
        reached = self.reached_modules()
        return [m for m in self.modules.values() if m.attrs.get("role") in roles and m.path not in reached]

    def last_layer_path(self) -> str | None:
        """The last Linear or conv the model registers (``nn.Sequential(..., nn.Linear(1568, 10))``,
        ``self.out = nn.Linear(256, 2)`` after the LSTM): read as the output layer where no captured
        graph shows it, so its output width (the task's classes) is not questioned."""
        layers = [m.path for m in self.modules.values() if m.attrs.get("role") in ("linear", "conv")]
        return layers[-1] if len(layers) > 1 else None  # one layer alone says nothing of its place

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = {
            "target": self.target,
            "status": self.status,
            "reason": self.reason,
            "model_class": self.model_class,
            "param_count": self.param_count,
            "param_dtype": self.param_dtype,
            "input": self.input,
            "compute_dtype": self.compute_dtype,
            "autocast": self.autocast,
            "capture": asdict(self.capture),
            "total_flops": self.total_flops,
            "activation_bytes": self.activation_bytes,
            "modules": [
                {**asdict(m), "site": m.site.to_json() if m.site else None} for m in self.modules.values()
            ],
            "ops": [{**asdict(op), "site": op.site.to_json() if op.site else None} for op in self.ops],
            "construction": self.construction.to_json() if self.construction else None,
            "timings": self.timings,
            "depends_on": self.depends_on,
        }
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ModelFacts":
        modules = {}
        for raw in data.get("modules", []):
            raw = dict(raw)
            raw["site"] = Site.from_json(raw.get("site"))
            modules[raw["path"]] = ModuleFact(**raw)
        ops = []
        for raw in data.get("ops", []):
            raw = dict(raw)
            raw["site"] = Site.from_json(raw.get("site"))
            ops.append(OpFact(**raw))
        return cls(
            target=data.get("target", {}),
            status=data.get("status", "ok"),
            reason=data.get("reason", ""),
            model_class=data.get("model_class", ""),
            param_count=int(data.get("param_count", 0)),
            param_dtype=data.get("param_dtype", "float32"),
            input=data.get("input", {}),
            compute_dtype=data.get("compute_dtype", "bfloat16"),
            autocast=bool(data.get("autocast", True)),
            capture=CaptureInfo(**data.get("capture", {})),
            total_flops=float(data.get("total_flops", 0.0)),
            activation_bytes=float(data.get("activation_bytes", 0.0)),
            modules=modules,
            ops=ops,
            construction=Site.from_json(data.get("construction")),
            timings=data.get("timings", {}),
            depends_on=list(data.get("depends_on", [])),
        )

    @classmethod
    def failed(cls, target: dict[str, Any], reason: str, status: str = "failed") -> "ModelFacts":
        return cls(target=target, status=status, reason=reason)
