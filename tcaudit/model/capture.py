"""Child side: choose an input, capture the graph, and turn its nodes into :class:`OpFact` records.

Capture order (SPEC "Model audit"): ``torch.export`` (non-strict) first; when it fails, a Dynamo capture
with a recording backend, where graph breaks give several graphs and data-dependent values between
them are replaced by placeholders; then ``torch.fx.symbolic_trace`` with shape propagation; and when
no input shape is known or nothing could be captured, parameter-only checks on module attributes.

Before all of them comes a fast path that gives the same facts at a fraction of the cost: when the
model traces with ``torch.fx`` (no data-dependent control flow) and nothing casts doubt on that trace
(no autocast region or hook inside the forward, every parameter used), the traced graph is run on
fake tensors node by node and taken as is. For ResNet50 that is ~0.2 s of CPU against ~1 s for
``torch.export``, with the same ops, shapes, dtypes and FLOPs. Everything else takes the order above.

Every capture runs under CPU autocast at the configured precision (when the model is in fp32), so
each node's recorded value carries the dtype it will really compute in: autocast's own casts never
appear as graph nodes, while the user's ``.float()``/``.half()``/``.to(dtype)`` do.

FLOPs are counted per node with the formulas ``torch.utils.flop_counter.FlopCounterMode`` applies
(``conv_flop_count``, ``sdpa_flop_count``, 2·M·N·K for its mm/addmm/bmm entries), read off the
captured graph's fake shapes, so attributing them to layers costs no extra forward pass.
"""

from __future__ import annotations

import inspect
import math
import re
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn

from tcaudit.model.build import UserFiles, site_of_module
from tcaudit.model.facts import DTYPE_BYTES, CaptureInfo, ModelFacts, ModuleFact, OpFact, Site, rnn_gate_gemms

GEMM_OPS = {"linear", "matmul", "__matmul__", "mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "einsum"}
CONV_OPS = {
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
}
SDPA_OPS = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
EMBEDDING_OPS = {"embedding", "embedding_bag"}
# The recurrent ATen ops (``aten.lstm.input``/``.data``, ``torch._VF.gru``), by the mode nn.RNNBase names.
RNN_OPS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU"}
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
NORM_OPS = {
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "cudnn_batch_norm",
}
CAST_METHODS = {"float", "half", "double", "bfloat16", "to", "type", "type_as", "_to_copy"}

ROLE_TYPES: list[tuple[str, tuple[type, ...]]] = [
    ("mha", (nn.MultiheadAttention,)),
    ("linear", (nn.Linear, nn.Bilinear)),
    ("conv", (nn.modules.conv._ConvNd,)),
    ("embedding", (nn.Embedding, nn.EmbeddingBag)),
    ("norm", (nn.modules.batchnorm._BatchNorm,)),
    ("rnn", (nn.RNNBase,)),
]

_SHAPE_ERROR = re.compile(
    r"shape|size mismatch|sizes? of tensors|mat1 and mat2|channels|expected input|expected .*input|"
    r"invalid for input of size|dimension|out of range|out of bounds|must match the size|Given groups|"
    r"padded input size|too small|not enough values|too many values|kernel size|reduction dim|"
    r"cannot be multiplied|does not match|broadcast",
    re.IGNORECASE,
)
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    return str(dtype).replace("torch.", "")


# -- the model's modules -------------------------------------------------------------------------


def role_of(module: nn.Module) -> str | None:
    for role, types in ROLE_TYPES:
        if isinstance(module, types):
            return role
    return None


def describe_modules(model: nn.Module) -> dict[str, ModuleFact]:
    embedding_weights = {
        id(m.weight): path for path, m in nn.Module.named_modules(model) if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
    }
    facts: dict[str, ModuleFact] = {}
    sequential_next: dict[str, str] = {}
    for path, module in nn.Module.named_modules(model):
        if isinstance(module, nn.Sequential):
            names = [name for name, _ in nn.Module.named_children(module)]
            for here, after in zip(names, names[1:]):
                sequential_next[f"{path}.{here}" if path else here] = f"{path}.{after}" if path else after
    for path, module in nn.Module.named_modules(model):
        role = role_of(module)
        attrs: dict[str, Any] = {"role": role} if role else {}
        if isinstance(module, nn.Linear):
            attrs.update(in_features=module.in_features, out_features=module.out_features, bias=module.bias is not None)
            tied = embedding_weights.get(id(module.weight))
            if tied is not None:
                attrs["tied_to"] = tied
        elif isinstance(module, nn.modules.conv._ConvNd):
            attrs.update(
                in_channels=module.in_channels,
                out_channels=module.out_channels,
                kernel_size=list(module.kernel_size),
                groups=module.groups,
                bias=module.bias is not None,
                transposed=bool(module.transposed),
                dims=len(module.kernel_size),
            )
        elif isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            attrs.update(num_embeddings=module.num_embeddings, embedding_dim=module.embedding_dim)
        elif isinstance(module, nn.MultiheadAttention):
            attrs.update(embed_dim=module.embed_dim, num_heads=module.num_heads, head_dim=module.head_dim)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            attrs.update(num_features=module.num_features)
        elif isinstance(module, nn.RNNBase):
            attrs.update(mode=module.mode, input_size=module.input_size, hidden_size=module.hidden_size,
                         proj_size=module.proj_size, num_layers=module.num_layers,
                         bidirectional=bool(module.bidirectional))
        if path in sequential_next:
            attrs["next"] = sequential_next[path]
        cls = type(module)
        facts[path] = ModuleFact(
            path=path,
            type=cls.__name__,
            builtin=cls.__module__.startswith("torch.nn"),
            site=site_of_module(module),
            attrs=attrs,
        )
    return facts


def parameter_summary(model: nn.Module) -> tuple[int, str]:
    count = 0
    dtypes: dict[str, int] = {}
    for p in nn.Module.parameters(model):
        count += p.numel()
        if p.is_floating_point():
            name = dtype_name(p.dtype) or "float32"
            dtypes[name] = dtypes.get(name, 0) + p.numel()
    dtype = max(dtypes, key=dtypes.get) if dtypes else "float32"
    return count, dtype


# -- inputs -------------------------------------------------------------------------------------

_SEQ_ATTRS = ("block_size", "max_seq_len", "n_positions", "max_position_embeddings", "seq_len", "context_length",
              "n_ctx", "max_len", "seq_length")
_CONFIG_ATTRS = ("config", "cfg", "conf", "params", "args", "hparams", "model_args")


@dataclass
class InputCandidate:
    shapes: list[list[int]]
    dtypes: list[str]
    origin: str
    assumed: bool = False  # some dimension is the audit's guess, not the script's

    def describe(self) -> str:
        parts = [f"({', '.join(map(str, s))}) {d}" for s, d in zip(self.shapes, self.dtypes)]
        return ", ".join(parts)


def _sequence_length_from_model(model: nn.Module) -> tuple[int | None, str]:
    for holder_name in ("", *_CONFIG_ATTRS):
        holder = model if not holder_name else getattr(model, holder_name, None)
        if holder is None:
            continue
        for attr in _SEQ_ATTRS:
            value = holder.get(attr) if isinstance(holder, dict) else getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                where = f"model.{holder_name}.{attr}" if holder_name else f"model.{attr}"
                return value, where
    return None, ""


def _position_rows(model: nn.Module) -> int | None:
    for path, module in nn.Module.named_modules(model):
        leaf = path.rpartition(".")[2].lower()
        if isinstance(module, nn.Embedding) and ("pos" in leaf or leaf in {"wpe"}):
            return module.num_embeddings
    return None


def required_inputs(model: nn.Module) -> int | None:
    """How many positional inputs ``forward`` requires (None: it takes ``*args``)."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return 1
    required = 0
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            return None
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and param.default is param.empty:
            required += 1
    return required


def input_candidates(model: nn.Module, hints: dict[str, Any], float_dtype: str) -> tuple[list[InputCandidate], str]:
    """Inputs to try, best guess first, and a note when none can be guessed."""
    candidates, note = _input_candidates(model, hints, float_dtype)
    for candidate in candidates:
        candidate.assumed = "assumed" in candidate.origin or "a common size" in candidate.origin
    return candidates, note


def _input_candidates(model: nn.Module, hints: dict[str, Any], float_dtype: str) -> tuple[list[InputCandidate], str]:
    explicit = hints.get("input_shapes")
    first = next(
        ((path, m) for path, m in nn.Module.named_modules(model) if role_of(m) in {"linear", "conv", "embedding", "mha", "rnn"}),
        (None, None),
    )[1]
    if explicit:
        dtype = hints.get("input_dtype") or ("int64" if isinstance(first, (nn.Embedding, nn.EmbeddingBag)) else float_dtype)
        return [InputCandidate([list(s) for s in explicit], [dtype] * len(explicit), "given")], ""
    needed = required_inputs(model)
    if needed == 0 and isinstance(getattr(model, "main_input_name", None), str):
        needed = 1  # transformers: forward(input_ids=None, ...) takes its main input first
    if needed is not None and needed != 1:
        return [], f"forward() takes {needed} inputs; give the input shapes with [[tool.tcaudit.models]] or --input"
    if first is None:
        return [], "no Linear, Conv, Embedding or attention layer to infer the input from"
    batch = hints.get("batch_size")
    batch_origin = hints.get("batch_origin") or ""
    if not isinstance(batch, int) or batch <= 0:
        batch, batch_origin = 8, "assumed"
    origins = [f"batch {batch} ({batch_origin})"]
    if isinstance(first, (nn.Embedding, nn.EmbeddingBag)):
        seq, seq_origin = hints.get("seq_len"), hints.get("seq_origin") or ""
        if not isinstance(seq, int) or seq <= 0:
            seq, seq_origin = _sequence_length_from_model(model)
        rows = _position_rows(model)
        if seq is None:
            seq, seq_origin = (rows, "the position embedding's rows") if rows else (256, "assumed")
        if rows and seq > rows:
            seq, seq_origin = rows, "the position embedding's rows"
        origins.append(f"sequence {seq} ({seq_origin})")
        return [InputCandidate([[batch, seq]], ["int64"], ", ".join(origins))], ""
    if isinstance(first, nn.modules.conv._ConvNd):
        channels = first.in_channels
        dims = len(first.kernel_size)
        sizes: list[tuple[int, str]] = []
        if first.transposed:
            sizes.append((1, "a generator's latent input"))  # DCGAN-style: (B, nz, 1, 1)
        if hints.get("image_size"):
            sizes.append((int(hints["image_size"]), hints.get("image_origin") or "the script"))
        for size in (224, 32, 28, 64, 96, 128, 256, 299, 512):
            sizes.append((size, "a common size"))
        out, seen = [], set()
        for size, where in sizes:
            if size in seen:
                continue
            seen.add(size)
            if dims == 2:
                shape = [batch, channels, size, size]
            elif dims == 1:
                shape = [batch, channels, size * 4]
            else:
                shape = [batch, channels, 16, size // 2, size // 2]
            out.append(InputCandidate([shape], [float_dtype], ", ".join([*origins, f"size {size} ({where})"])))
        return out, ""
    if isinstance(first, nn.MultiheadAttention):
        seq = hints.get("seq_len") or 128
        shape = [batch, seq, first.embed_dim] if first.batch_first else [seq, batch, first.embed_dim]
        return [InputCandidate([shape], [float_dtype], ", ".join([*origins, f"sequence {seq}"]))], ""
    if isinstance(first, nn.RNNBase):
        seq = hints.get("seq_len") or 128
        shape = [batch, seq, first.input_size] if first.batch_first else [seq, batch, first.input_size]
        return [InputCandidate([shape], [float_dtype], ", ".join([*origins, f"sequence {seq}"]))], ""
    # A Linear first: flat features, tokens of features, or an image the model flattens itself.
    width = first.in_features if isinstance(first, nn.Linear) else first.in1_features
    out = [InputCandidate([[batch, width]], [float_dtype], ", ".join([*origins, f"{width} features"]))]
    seq, seq_origin = hints.get("seq_len"), hints.get("seq_origin") or "the script"
    if not isinstance(seq, int) or seq <= 0:
        seq, seq_origin = 128, "assumed"
    out.append(InputCandidate([[batch, seq, width]], [float_dtype],
                              ", ".join([*origins, f"sequence {seq} ({seq_origin})", f"{width} features"])))
    if hints.get("image_size"):
        size, channels = int(hints["image_size"]), int(hints.get("channels") or 3)
        out.append(InputCandidate([[batch, channels, size, size]], [float_dtype], ", ".join(origins)))
    return out, ""


def make_inputs(candidate: InputCandidate, fake_mode) -> tuple:
    with fake_mode:
        tensors = []
        for shape, dtype in zip(candidate.shapes, candidate.dtypes):
            torch_dtype = getattr(torch, dtype)
            if torch_dtype.is_floating_point:
                tensors.append(torch.empty(shape, dtype=torch_dtype))
            else:
                tensors.append(torch.zeros(shape, dtype=torch_dtype))
    return tuple(tensors)


def is_shape_error(exc: BaseException) -> bool:
    if isinstance(exc, (IndexError,)):
        return True
    if not isinstance(exc, (RuntimeError, ValueError, TypeError, AssertionError)):
        return False
    return bool(_SHAPE_ERROR.search(str(exc)[:2000]))


def short_error(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return message if len(message) <= limit else message[: limit - 3] + "..."


# -- capture ------------------------------------------------------------------------------------


@dataclass
class Graph:
    module: Any  # torch.fx.GraphModule
    method: str
    parameter_inputs: set[str] = field(default_factory=set)  # placeholders that are parameters/buffers


@contextmanager
def simulated_precision(enabled: bool, dtype: str) -> Iterator[None]:
    if enabled:
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            yield
    else:
        yield


@contextmanager
def placeholder_scalars(record: list[str], user_files: UserFiles) -> Iterator[None]:
    """Let eager code between Dynamo graphs read data-dependent values of fake tensors.

    A fake tensor has no data, so ``if x.sum() > 0`` cannot be decided; the audit follows the branch
    a zero/False value takes and says so in a note. Only active for the Dynamo capture.
    """
    import sys

    from torch._subclasses.fake_tensor import FakeTensor

    def where() -> None:
        frame = sys._getframe(2)
        while frame is not None and not user_files(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            import linecache

            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            text = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} (`{code}`)"
            if text not in record:
                record.append(text)

    def as_bool(self):
        where()
        return False

    def as_item(self):
        where()
        return False if self.dtype == torch.bool else (0 if not self.is_floating_point() else 0.0)

    def as_int(self):
        where()
        return 0

    def as_float(self):
        where()
        return 0.0

    patched = {"__bool__": as_bool, "item": as_item, "__int__": as_int, "__float__": as_float}
    saved = {name: FakeTensor.__dict__.get(name) for name in patched}
    for name, fn in patched.items():
        setattr(FakeTensor, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(FakeTensor, name)
            else:
                setattr(FakeTensor, name, fn)


def capture_export(model, inputs, autocast: bool, dtype: str) -> list[Graph]:
    from tcaudit.model.build import cpu_only_patches

    with simulated_precision(autocast, dtype), cpu_only_patches():
        program = torch.export.export(model, inputs, strict=False)
    signature = program.graph_signature
    lifted = set(signature.inputs_to_parameters) | set(signature.inputs_to_buffers)
    lifted |= set(getattr(signature, "inputs_to_lifted_tensor_constants", {}) or {})
    return [Graph(program.graph_module, "export", lifted)]


def capture_dynamo(model, inputs, autocast: bool, dtype: str, fake_mode, user_files: UserFiles,
                   notes: list[str]) -> list[Graph]:
    import torch._dynamo

    from tcaudit.model.build import cpu_only_patches

    graphs: list[Graph] = []

    def backend(gm, example_inputs):
        lifted = {n.name for n in gm.graph.nodes if n.op == "placeholder"
                  and ("_parameters_" in n.name or "_buffers_" in n.name)}
        graphs.append(Graph(gm, "dynamo", lifted))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    followed: list[str] = []
    try:
        with fake_mode, simulated_precision(autocast, dtype), cpu_only_patches(), placeholder_scalars(followed, user_files):
            compiled(*inputs)
    finally:
        torch._dynamo.reset()
    if not graphs:
        raise RuntimeError("Dynamo captured no graph")
    if followed:
        notes.append(
            "data-dependent control flow was followed with placeholder values (False/0) at "
            + "; ".join(followed[:3])
            + ": layers on the other branch are checked from their parameters"
        )
    if len(graphs) > 1:
        notes.append(f"Dynamo captured {len(graphs)} graphs (graph breaks)")
    return graphs


class _AuditTracer(torch.fx.Tracer):
    """symbolic_trace's tracer, except that a torch.nn module with submodules is traced through
    (``TransformerEncoderLayer`` would otherwise hide its Linears in one opaque node); only
    ``nn.MultiheadAttention`` (expanded by :func:`_expand_mha`) and the RNNs stay whole."""

    def __init__(self) -> None:
        super().__init__()
        self.record_stack_traces = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if not super().is_leaf_module(m, module_qualified_name):
            return False
        if isinstance(m, (nn.MultiheadAttention, nn.RNNBase)):
            return True
        return next(iter(nn.Module.children(m)), None) is None


@dataclass
class FxTrace:
    """A symbolic trace of the model, and why its graph may not be the model's real forward."""

    module: Any  # torch.fx.GraphModule
    doubt: str = ""  # non-empty: export decides; the trace is only a last resort
    unused: list[str] = field(default_factory=list)  # parameters the graph never reads (to be confirmed)


def _default_arguments(model: nn.Module, given: int) -> dict[str, Any]:
    """The forward's defaulted parameters past the ``given`` inputs: the audit calls ``model(*inputs)``,
    so they keep their defaults, and the trace may decide on them (``if mask is None``)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    concrete: dict[str, Any] = {}
    positional = 0
    for param in parameters:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) and positional < given:
            positional += 1
            continue
        default = param.default
        if default is not param.empty and (default is None or isinstance(default, (bool, int, float, str))):
            concrete[param.name] = default
    return concrete


def trace_fx(model: nn.Module, fake_mode, inputs: int = 1) -> FxTrace:
    """``torch.fx`` symbolic trace (needs no input; raises what the tracer raises).

    The trace records torch calls, not Python: anything the forward decides in Python is decided
    once, at trace time, with proxies. Control flow on tensors makes the tracer raise; the cases
    where it silently differs from a real forward are checked here and set ``doubt``: autocast
    regions entered by the forward (not recorded) and module hooks (skipped by the tracer). Parameters
    the graph never uses are listed in ``unused``: a branch may have gone the other way (e.g. on
    ``isinstance(x, torch.Tensor)``, which is False for a proxy); :func:`confirm_unused` decides.
    """
    from torch.amp import autocast_mode
    from torch.nn.modules import module as module_mod

    from tcaudit.model.build import cpu_only_patches

    entered: list[str] = []
    original_enter = autocast_mode.autocast.__enter__

    def enter(self):  # noqa: ANN001 - replaces autocast.__enter__ while tracing
        entered.append(str(getattr(self, "device", "")))
        return original_enter(self)

    tracer = _AuditTracer()
    autocast_mode.autocast.__enter__ = enter
    try:
        with fake_mode, cpu_only_patches():
            graph = tracer.trace(model, concrete_args=_default_arguments(model, inputs) or None)
    finally:
        autocast_mode.autocast.__enter__ = original_enter
    gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    trace = FxTrace(gm)
    hooked = [
        path or type(model).__name__ for path, m in nn.Module.named_modules(model)
        if m._forward_hooks or m._forward_pre_hooks
    ]
    global_hooks = any(getattr(module_mod, name, None)
                       for name in ("_global_forward_hooks", "_global_forward_pre_hooks"))
    if entered:
        trace.doubt = "the forward enters torch.autocast, whose regions symbolic_trace does not record"
    elif hooked or global_hooks:
        trace.doubt = f"forward hooks ({', '.join(hooked[:3]) or 'global'}), which symbolic_trace skips"
    else:
        trace.unused = unused_parameters(model, gm)
    return trace


def confirm_unused(trace: FxTrace, model: nn.Module, inputs: tuple, fake_mode, autocast: bool, dtype: str) -> None:
    """Parameters the trace never reads are fine when a real (fake) forward does not read them either
    (an optional branch, an unused head); otherwise the trace went another way and is in doubt.
    Costs one plain forward, only for models whose trace leaves parameters out."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from tcaudit.model.build import cpu_only_patches

    unused = set(trace.unused)
    watched = {id(p): name for name, p in nn.Module.named_parameters(model) if name in unused}
    read: set[str] = set()
    failure = ""

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for leaf in tree_leaves((args, kwargs)):
                name = watched.get(id(leaf))
                if name is not None:
                    read.add(name)
            return func(*args, **(kwargs or {}))

    try:
        with fake_mode, torch.no_grad(), simulated_precision(autocast, dtype), cpu_only_patches(), Watch():
            model(*inputs)
    except Exception as exc:  # noqa: BLE001 - cannot confirm: export decides
        failure = short_error(exc, 80)
    if read or failure:
        names = trace.unused
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        why = f"a forward to confirm it failed ({failure})" if failure else "a real forward does"
        trace.doubt = f"the traced graph does not use parameter(s) {', '.join(names[:3])}{more}, {why}"
    trace.unused = []


def unused_parameters(model: nn.Module, gm) -> list[str]:
    """Names of the model's parameters that no node of the traced graph reads."""
    reached: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            reached.update(id(p) for p in nn.Module.parameters(gm.get_submodule(node.target)))
        elif node.op == "get_attr":
            attr: Any = gm
            try:
                for part in str(node.target).split("."):
                    attr = getattr(attr, part)
            except AttributeError:
                continue
            if isinstance(attr, nn.Module):
                reached.update(id(p) for p in nn.Module.parameters(attr))
            elif isinstance(attr, torch.Tensor):
                reached.add(id(attr))
    return [name for name, p in nn.Module.named_parameters(model) if id(p) not in reached]


def capture_fx(trace: FxTrace, inputs, autocast: bool, dtype: str, fake_mode) -> list[Graph]:
    """Run the traced graph node by node on fake inputs (shape propagation), keeping each node's
    fake value in ``meta["val"]`` as export and Dynamo do. The parameters are fake already, so this
    is a plain ``Interpreter`` (``ShapeProp(fake_mode=...)`` would deep-copy the model first)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tcaudit.model.build import cpu_only_patches

    heavy: dict[Any, set[str]] = {}
    current: list[Any] = [None]

    class Observer(TorchDispatchMode):
        """Notes which node dispatches GEMMs, convolutions, attention, lookups or batch norms."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            packet = getattr(func, "_overloadpacket", None)
            name = getattr(packet, "__name__", "")
            if name in _HEAVY_KINDS and current[0] is not None:
                heavy.setdefault(current[0], set()).add(name)
            return func(*args, **(kwargs or {}))

    class Recording(torch.fx.Interpreter):
        def run_node(self, n):
            current[0] = n
            result = super().run_node(n)
            n.meta["val"] = result
            return result

        def call_module(self, target, args, kwargs):
            module = self.fetch_attr(target)
            if not kwargs and len(args) == 1 and batch_norm_passes_through(module, args[0]):
                return torch.empty_like(args[0])
            return super().call_module(target, args, kwargs)

    gm = trace.module
    with fake_mode, torch.no_grad(), simulated_precision(autocast, dtype), cpu_only_patches(), Observer():
        Recording(gm, garbage_collect_values=True).run(*inputs)
    hidden = hidden_compute(gm, heavy)
    if hidden and not trace.doubt:
        more = f" and {len(hidden) - 3} more" if len(hidden) > 3 else ""
        trace.doubt = f"the traced graph calls {', '.join(hidden[:3])}{more}, whose inner ops it cannot see"
    return [Graph(gm, "fx")]


# ATen ops (as dispatched under a node) → the node kinds that account for them. A node that
# dispatches one of them and is of none of its kinds hides compute the rules would have read from an
# export graph (a function wrapped with torch.fx.wrap, F.multi_head_attention_forward, ...).
_GEMM_ATEN = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation")
_HEAVY_KINDS: dict[str, set[str]] = {
    **{name: {"gemm", "mha", "sdpa"} for name in _GEMM_ATEN},
    **{name: {"conv"} for name in ("convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution",
                                   "conv2d", "conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                                   "conv_transpose3d")},
    **{name: {"sdpa", "mha"} for name in SDPA_OPS},
    **{name: {"embedding"} for name in ("embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only")},
    **{name: {"norm"} for name in NORM_OPS},
}


def hidden_compute(gm, heavy: dict[Any, set[str]]) -> list[str]:
    """Nodes that ran heavy ATen ops their kind does not account for, as ``name (ops)``."""
    hidden = []
    for node, names in heavy.items():
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.RNNBase):
            continue  # export keeps an RNN as one op too
        kind = node_kind(node, gm, op_name(node, gm)[0])
        if any(kind not in _HEAVY_KINDS[name] for name in names):
            target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
            text = f"`{target}` ({', '.join(sorted(names))})"
            if text not in hidden:
                hidden.append(text)
    return hidden


_BATCH_NORM_DIMS = {nn.BatchNorm1d: (2, 3), nn.BatchNorm2d: (4,), nn.BatchNorm3d: (5,)}
_BATCH_NORM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def batch_norm_passes_through(module: nn.Module, x: Any) -> bool:
    """Whether a BatchNorm's output can be taken as ``empty_like(x)`` without running it.

    A batch norm's output has its input's shape, dtype and strides (under autocast too: batch_norm
    is on neither of its lists). On fake tensors in training mode, running it means a decomposition
    per new input shape (15–20 ms each, half of ResNet50's shape propagation), for nothing the audit
    reads. Only the plain torch.nn classes are passed through, with the input checks they make.
    """
    dims = _BATCH_NORM_DIMS.get(type(module))  # exact classes: a subclass may override forward
    if dims is None:
        return False
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(x, FakeTensor) or x.dim() not in dims or x.dtype not in _BATCH_NORM_DTYPES:
        return False
    if x.shape[1] != module.num_features:
        return False  # the real call raises the shape error the input probing needs
    for tensor in (module.weight, module.bias, module.running_mean, module.running_var):
        if tensor is not None and tensor.dtype not in (x.dtype, torch.float32):
            return False
    if module.training or module.running_mean is None:
        size = x.shape
        if math.prod(size) // size[1] <= 1:
            return False  # "Expected more than 1 value per channel when training": let it raise
    return True


@dataclass
class CaptureOutcome:
    graphs: list[Graph]
    candidate: InputCandidate | None
    info: CaptureInfo


def first_runnable(model, candidates: list[InputCandidate], fake_mode, autocast: bool, dtype: str,
                   tried: list[str]) -> InputCandidate | None:
    """The first candidate a plain fake forward accepts (much cheaper than a failed export). Errors
    that are not about shapes (data-dependent branches) do not rule a candidate out."""
    from tcaudit.model.build import cpu_only_patches

    for candidate in candidates:
        try:
            with fake_mode, torch.no_grad(), simulated_precision(autocast, dtype), cpu_only_patches():
                model(*make_inputs(candidate, fake_mode))
        except Exception as exc:  # noqa: BLE001
            if is_shape_error(exc):
                tried.append(f"{candidate.describe()}: {short_error(exc, 100)}")
                continue
        return candidate
    return None


def capture(model, candidates: list[InputCandidate], fake_mode, autocast: bool, dtype: str,
            user_files: UserFiles) -> CaptureOutcome:
    """The graph of one forward with the best-guess input.

    Fast path: ``torch.fx`` symbolic trace plus shape propagation on fake tensors, when the model
    traces and nothing casts doubt on the trace (see :func:`trace_fx`); for ResNet50 it costs a
    fifth of an export and gives the same ops, shapes, dtypes and FLOPs. Otherwise ``torch.export``
    (non-strict), then Dynamo, and the doubtful fx trace as the last resort. When the model rejects
    the input's shape, the other candidates are probed with a plain fake forward and the capture
    retried.
    """
    info = CaptureInfo()
    if not candidates:
        info.method = "parameters"
        return CaptureOutcome([], None, info)
    fast_failure = ""
    trace: FxTrace | None = None
    try:
        trace = trace_fx(model, fake_mode, len(candidates[0].shapes))
    except Exception as exc:  # noqa: BLE001 - data-dependent control flow and the like: export decides
        fast_failure = f"fx: {short_error(exc)}"
    if trace is not None and trace.unused and not trace.doubt:
        confirm_unused(trace, model, make_inputs(candidates[0], fake_mode), fake_mode, autocast, dtype)
    methods: list[tuple[str, bool, Any]] = []
    if trace is not None and not trace.doubt:
        methods.append(("fx", True, lambda inputs: capture_fx(trace, inputs, autocast, dtype, fake_mode)))
    methods.append(("export", False, lambda inputs: capture_export(model, inputs, autocast, dtype)))
    methods.append(("dynamo", False, lambda inputs: capture_dynamo(model, inputs, autocast, dtype, fake_mode,
                                                                   user_files, info.notes)))
    if trace is not None and trace.doubt:
        fast_failure = f"fx: {trace.doubt}"
        methods.append(("fx", False, lambda inputs: capture_fx(trace, inputs, autocast, dtype, fake_mode)))
    candidate = candidates[0]
    probed = False
    fallback: tuple[list[Graph], InputCandidate] | None = None
    for name, fast, run in methods:
        while True:
            try:
                graphs = run(make_inputs(candidate, fake_mode))
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to try the next way
                if is_shape_error(exc) and not probed:
                    probed = True
                    # The fast path's graph may be what is wrong: let the model itself judge the
                    # first candidate too.
                    tried = [] if fast else [f"{candidate.describe()}: {short_error(exc, 100)}"]
                    other = first_runnable(model, candidates if fast else candidates[1:], fake_mode, autocast,
                                           dtype, tried)
                    if other is None:
                        info.method = "parameters"
                        info.notes.append("no input shape worked (tried " + "; ".join(tried[:3]) + ")")
                        return CaptureOutcome([], None, info)
                    if other is not candidate:
                        candidate = other
                        continue
                if fast:
                    fast_failure = f"fx: {short_error(exc)}"
                else:
                    info.failures.append(f"{name}: {short_error(exc)}")
                break
            if fast and trace is not None and trace.doubt:
                # Running the graph showed it hides compute: export decides; keep this as the last resort.
                fast_failure = f"fx: {trace.doubt}"
                fallback = (graphs, candidate)
                break
            info.method = name
            info.graphs = len(graphs)
            if name == "fx" and not fast:
                info.notes.append(f"used torch.fx's symbolic trace although {trace.doubt}")
            else:
                info.fast_path = "" if fast else fast_failure
            return CaptureOutcome(graphs, candidate, info)
    if fallback is not None:
        graphs, candidate = fallback
        info.method, info.graphs = "fx", len(graphs)
        info.notes.append(f"used torch.fx's symbolic trace although {trace.doubt}")
        return CaptureOutcome(graphs, candidate, info)
    if fast_failure and not (trace is not None and trace.doubt):
        info.failures.append(fast_failure)
    info.method = "parameters"
    return CaptureOutcome([], None, info)


# -- normalising graph nodes into facts ----------------------------------------------------------


def node_value(node) -> Any:
    meta = node.meta
    for key in ("val", "example_value"):
        if key in meta:
            return meta[key]
    return None


def arg_value(arg) -> Any:
    if isinstance(arg, torch.fx.Node):
        return node_value(arg)
    if isinstance(arg, (list, tuple)) and any(isinstance(a, torch.fx.Node) for a in arg):
        return [arg_value(a) for a in arg]  # export's einsum(equation, [a, b]), cat([...]), ...
    return arg


def op_name(node, gm) -> tuple[str, str]:
    """(normalised operator name, overload) of a node."""
    target = node.target
    if node.op == "call_method":
        return str(target), ""
    if node.op == "call_module":
        return type(gm.get_submodule(target)).__name__, ""
    if node.op != "call_function":
        return "", ""
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__, getattr(target, "_overloadname", "")
    name = getattr(target, "__name__", None) or str(target)
    return name, ""


_PATH_PIECE = re.compile(r"\._modules\['([^']+)'\]|\['([^']+)'\]|\[(\d+)\]|\.([A-Za-z0-9_]+)")


def normalise_module_path(raw: str) -> str:
    """``L['self'].layer1[0]._modules['conv1']`` (Dynamo) → ``layer1.0.conv1``; export paths pass through."""
    if not raw.startswith(("L[", "self")):
        return raw
    rest = re.sub(r"^(L\['[^']+'\]|self)", "", raw)
    parts = []
    for match in _PATH_PIECE.finditer(rest):
        parts.append(next(g for g in match.groups() if g is not None))
    return ".".join(parts)


def node_module(node, gm) -> tuple[str | None, str | None]:
    if node.op == "call_module":
        return str(node.target), type(gm.get_submodule(node.target)).__name__
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None, None
    path, cls = list(stack.values())[-1]
    type_name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1].rstrip("'>")
    return normalise_module_path(str(path)), type_name


def node_site(node, user_files: UserFiles) -> Site | None:
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    best = None
    for match in _STACK_FRAME.finditer(trace):
        filename, line = match.group(1), int(match.group(2))
        if user_files(filename):
            best = (filename, line)
    if best is None:
        return None
    import linecache

    text = linecache.getline(best[0], best[1])
    column = len(text) - len(text.lstrip()) + 1 if text.strip() else 1
    return Site(best[0], best[1], column, best[1], len(text.rstrip("\n")) + 1 if text else 0)


def _shape(value) -> list[int] | None:
    if isinstance(value, torch.Tensor):
        try:
            return [int(d) for d in value.shape]
        except (TypeError, ValueError):  # symbolic sizes
            return None
    return None


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


class _GemmRecorder:
    """Runs one op on fake values and records the mm/bmm shapes it decomposes into (for einsum)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.calls: list[tuple[int, int, int, int]] = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func._overloadpacket.__name__
                if name in {"mm", "bmm", "addmm", "baddbmm"}:
                    a, b = (args[0], args[1]) if name in {"mm", "bmm"} else (args[1], args[2])
                    if a.dim() == 3:
                        recorder.calls.append((a.shape[0], a.shape[1], b.shape[2], a.shape[2]))
                    else:
                        recorder.calls.append((1, a.shape[0], b.shape[1], a.shape[1]))
                return out

        self.mode = Mode


def gemm_dims(name: str, node, gm, values: list[Any], out: Any) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM node, or None when its operands are not plain tensors."""
    try:
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            x = values[0]
            k = module.in_features
            return 1, _numel(list(x.shape)) // k, module.out_features, k
        if name == "linear":
            x, w = values[0], values[1]
            k = int(w.shape[-1])
            return 1, _numel(list(x.shape)) // k, int(w.shape[0]), k
        if name in {"mm"}:
            a, b = values[0], values[1]
            return 1, int(a.shape[0]), int(b.shape[1]), int(a.shape[1])
        if name in {"addmm", "_addmm_activation"}:
            a, b = values[1], values[2]
            return 1, int(a.shape[0]), int(b.shape[1]), int(a.shape[1])
        if name == "bmm":
            a, b = values[0], values[1]
            return int(a.shape[0]), int(a.shape[1]), int(b.shape[2]), int(a.shape[2])
        if name in {"baddbmm", "addbmm"}:
            a, b = values[1], values[2]
            return int(a.shape[0]), int(a.shape[1]), int(b.shape[2]), int(a.shape[2])
        if name in {"matmul", "__matmul__"}:
            a, b = values[0], values[1]
            k = int(a.shape[-1])
            m = int(a.shape[-2]) if a.dim() >= 2 else 1
            n = int(b.shape[-1]) if b.dim() >= 2 else 1
            total = _numel(list(out.shape)) if isinstance(out, torch.Tensor) else m * n
            return max(1, total // max(1, m * n)), m, n, k
        if name == "einsum":
            equation = values[0]
            operands = values[1] if len(values) == 2 and isinstance(values[1], (list, tuple)) else values[1:]
            from torch._subclasses.fake_tensor import FakeTensor

            fake_mode = next((t.fake_mode for t in operands if isinstance(t, FakeTensor)), None)
            recorder = _GemmRecorder()
            with (fake_mode or nullcontext()):
                # Shapes are all this replay needs; autocast, which the capture ran under, is off here.
                operands = [t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in operands]
                with recorder.mode():
                    torch.einsum(equation, *operands)
            if not recorder.calls:
                return None
            return max(recorder.calls, key=lambda c: c[0] * c[1] * c[2] * c[3])
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return None
    return None


def _explicit_cast(name: str, overload: str, node, values: list[Any]) -> bool:
    if name in {"float", "half", "double", "bfloat16", "type_as"}:
        return True
    if name == "_to_copy":
        return node.kwargs.get("dtype") is not None
    if name == "to" and overload:
        if overload == "dtype":
            return True
        if overload == "dtype_layout":
            return node.kwargs.get("dtype") is not None
        return overload == "other"
    if name in {"to", "type"}:
        rest = list(values[1:]) + list(node.kwargs.values())
        return any(isinstance(v, (torch.dtype, str)) and not _looks_like_device(v) for v in rest) or any(
            isinstance(v, torch.Tensor) for v in rest
        )
    return False


def _looks_like_device(value) -> bool:
    return isinstance(value, str) and (value.startswith(("cuda", "cpu", "mps", "xpu", "meta")))


VIEW_OPS = {
    "view", "_unsafe_view", "reshape", "transpose", "permute", "expand", "t", "slice", "select", "squeeze",
    "unsqueeze", "split", "split_with_sizes", "chunk", "getitem", "alias", "detach", "flatten", "unflatten",
    "narrow", "as_strided", "contiguous", "size", "dim", "_assert_tensor_metadata", "getattr", "unbind",
}


def normalise(graphs: list[Graph], user_files: UserFiles, notes: list[str] | None = None) -> tuple[list[OpFact], float]:
    """The ops the rules care about, and the bytes all non-view ops write (the memory baseline)."""
    ops: list[OpFact] = []
    written = [0.0]
    unreadable: list[str] = []
    for index, graph in enumerate(graphs):
        _normalise_graph(graph.module, graph, index, ops, user_files, set(), written, unreadable,
                         mark_output=index == len(graphs) - 1)
    if unreadable and notes is not None:
        notes.append(f"{len(unreadable)} graph node(s) could not be read and were left out: {', '.join(unreadable[:3])}")
    return ops, written[0]


def _output_bytes(value) -> float:
    if isinstance(value, torch.Tensor):
        try:
            return float(value.numel() * value.element_size())
        except (TypeError, RuntimeError):
            return 0.0
    if isinstance(value, (tuple, list)):
        return sum(_output_bytes(v) for v in value)
    return 0.0


_ROLE_KINDS = {"linear": "gemm", "conv": "conv", "embedding": "embedding", "norm": "norm", "mha": "mha",
               "rnn": "rnn"}


def node_kind(node, gm, name: str) -> str | None:
    """What a graph node is to the rules: gemm, conv, sdpa, embedding, norm, mha, cast, or None."""
    if node.op == "call_module":
        return _ROLE_KINDS.get(role_of(gm.get_submodule(node.target)) or "")
    if name in GEMM_OPS:
        return "gemm"
    if name in CONV_OPS:
        return "conv"
    if name in SDPA_OPS:
        return "sdpa"
    if name in EMBEDDING_OPS:
        return "embedding"
    if name in NORM_OPS:
        return "norm"
    if name in RNN_OPS and node.op == "call_function":
        return "rnn"
    if name in CAST_METHODS:
        return "cast"
    return None


def _normalise_graph(gm, graph: Graph, graph_index: int, ops: list[OpFact], user_files: UserFiles,
                     seen: set[int], written: list[float], unreadable: list[str], mark_output: bool = False) -> None:
    if id(gm) in seen:
        return
    seen.add(id(gm))
    produced: dict[Any, int] = {}  # node → op index, for casts and norms
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            try:
                attr = gm
                for part in str(node.target).split("."):
                    attr = getattr(attr, part)
            except AttributeError:
                continue
            if isinstance(attr, torch.fx.GraphModule):
                _normalise_graph(attr, graph, graph_index, ops, user_files, seen, written, unreadable)
            continue
        if node.op not in {"call_function", "call_method", "call_module"}:
            continue
        name, overload = op_name(node, gm)
        if name not in VIEW_OPS and not name.startswith("wrap_with"):
            written[0] += _output_bytes(node_value(node))
        kind = node_kind(node, gm, name)
        if kind is None:
            continue
        values = [arg_value(a) for a in node.args]
        out = node_value(node)
        if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            out = out[0]
        module_path, module_type = node_module(node, gm)
        if module_path is None and graph.method == "fx":
            # symbolic_trace keeps no stack for the root's own forward; export names it "".
            module_path, module_type = "", type(gm).__name__
        fact = OpFact(
            index=len(ops),
            kind=kind,
            op=name,
            module=module_path,
            module_type=module_type,
            graph=graph_index,
            dtype=dtype_name(out.dtype) if isinstance(out, torch.Tensor) else None,
            shapes=[s for s in (_shape(v) for v in values) if s is not None] + ([_shape(out)] if _shape(out) else []),
            site=node_site(node, user_files),
        )
        try:
            if not _fill(kind, name, overload, node, gm, values, out, fact, produced, graph):
                continue
        except (AttributeError, IndexError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            # IRs differ between torch versions and capture methods: one odd node must not sink the audit.
            unreadable.append(f"{node.name} ({name}: {type(exc).__name__})")
            continue
        if kind == "mha":
            expanded = _expand_mha(fact, gm.get_submodule(node.target), node, values, len(ops))
            ops.extend(expanded)
            # Its inner ops write too (export sees them): the projections, scores and softmax.
            counts = [op.info["batch"] * op.info["m"] * op.info["n"] if op.kind == "gemm" else _numel(op.shapes[0])
                      for op in expanded]
            scores = next((c for op, c in zip(expanded, counts) if op.op in {"bmm", "baddbmm"}), 0)
            written[0] += float((sum(counts) + scores) * DTYPE_BYTES.get(fact.dtype or "", 4))
            continue
        produced[node] = fact.index
        ops.append(fact)
    if mark_output:
        _mark_output_layers(gm, produced, ops)
        _mark_input_layers(gm, graph, produced, ops)
        _mark_recurrent_ends(gm, graph, produced, ops)


def _first_layers(start: list, step, produced: dict[Any, int], ops: list[OpFact], kinds: tuple[str, ...]):
    """Walk the graph from ``start`` along ``step`` (a node's inputs or its users), stopping at the
    first op of ``kinds`` on each path; yields (node, op) for each, with the nodes reached so far."""
    pending, visited = list(start), set()
    while pending and len(visited) < 10_000:
        node = pending.pop()
        if node in visited:
            continue
        visited.add(node)
        index = produced.get(node)
        if index is not None and ops[index].kind in kinds:
            yield node, ops[index], visited
            continue
        pending.extend(step(node))


def _mark_output_layers(gm, produced: dict[Any, int], ops: list[OpFact]) -> None:
    """Mark the GEMMs and convs whose result reaches the model's output through no other GEMM or conv
    (``return self.fc3(x)``, ``torch.sigmoid(self.head(x))``): their output width is the task's (classes,
    actions, a regression's 1), not a choice the alignment rules may question."""
    outputs = [arg for node in gm.graph.nodes if node.op == "output" for arg in node.all_input_nodes]
    for _, op, _ in _first_layers(outputs, lambda node: node.all_input_nodes, produced, ops, ("gemm", "conv")):
        op.info["model_output"] = True


def _mark_input_layers(gm, graph: Graph, produced: dict[Any, int], ops: list[OpFact]) -> None:
    """Mark the GEMMs and convs that read the model's input through no other GEMM, conv or embedding
    (``self.fc1(x)`` on 4 iris features): their input width is the data's, not a choice."""
    inputs = [node for node in gm.graph.nodes
              if node.op == "placeholder" and str(node.target) not in graph.parameter_inputs]
    for node, op, reached in _first_layers(inputs, _data_users, produced, ops, ("gemm", "conv", "embedding")):
        if op.kind != "embedding" and _reads_data(node, reached):
            op.info["model_input"] = True


def _mark_recurrent_ends(gm, graph: Graph, produced: dict[Any, int], ops: list[OpFact]) -> None:
    """Mark the RNNs that read the model's input through no GEMM, conv, embedding or other RNN (their
    input_size is the data's feature width) and those whose output reaches the model's output through
    none (their width is what the model returns). A walk of its own: the GEMM and conv marks above
    stay as they were before RNNs were recorded."""
    if not any(op.kind == "rnn" for op in ops):
        return
    inputs = [node for node in gm.graph.nodes
              if node.op == "placeholder" and str(node.target) not in graph.parameter_inputs]
    for node, op, reached in _first_layers(inputs, _data_users, produced, ops, ("gemm", "conv", "embedding", "rnn")):
        if op.kind == "rnn" and _reads_data(node, reached):
            op.info["model_input"] = True
    outputs = [arg for node in gm.graph.nodes if node.op == "output" for arg in node.all_input_nodes]
    for _, op, _ in _first_layers(outputs, lambda node: node.all_input_nodes, produced, ops, ("gemm", "conv", "rnn")):
        if op.kind == "rnn":
            op.info["model_output"] = True


def _data_users(node) -> list:
    return [user for user in node.users if not _is_shape_query(user)]


def _is_shape_query(node) -> bool:
    """``x.shape``, ``x.size()``, ``x.dim()``, ``sym_size``: what it yields is the input's shape, not its
    data, so a layer whose reshape reads it still reads another layer's activations."""
    target = node.target
    if node.op == "call_method":
        return target in {"size", "dim"}
    if node.op == "call_function":
        name = getattr(target, "__name__", str(target))
        if name == "getattr":
            return len(node.args) > 1 and node.args[1] in {"shape", "ndim"}
        return "sym_size" in name or "sym_numel" in name
    return False


def _reads_data(node, reached: set[Any]) -> bool:
    """The GEMM/conv's first operand (its activations, not its weight) is on a path from the input."""
    first = node.args[0] if node.args else None
    return first is not None and first in reached


def _fill(kind, name, overload, node, gm, values, out, fact: OpFact, produced, graph: Graph) -> bool:
    from torch.utils.flop_counter import conv_flop_count, sdpa_flop_count

    if kind == "gemm":
        dims = gemm_dims(name, node, gm, values, out)
        if dims is None:
            return False
        batch, m, n, k = dims
        fact.info = {"batch": batch, "m": m, "n": n, "k": k}
        fact.flops = 2.0 * batch * m * n * k
        if name in {"linear"} or node.op == "call_module":
            weight = gm.get_submodule(node.target).weight if node.op == "call_module" else node.args[1]
            fact.info["weight"] = weight.name if isinstance(weight, torch.fx.Node) else None
        return True
    if kind == "conv":
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            x, w, has_bias = values[0], module.weight, module.bias is not None
            transposed = bool(module.transposed)
        else:
            x, w = values[0], values[1]
            has_bias = len(values) > 2 and values[2] is not None
            if name in {"convolution", "_convolution"}:
                transposed = bool(values[6]) if len(values) > 6 else False
            else:
                transposed = "transpose" in name
        if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and isinstance(out, torch.Tensor)):
            return False
        c_in, c_out = int(x.shape[1]), int(out.shape[1])
        groups = (c_out // int(w.shape[1])) if transposed else (c_in // max(1, int(w.shape[1])))
        fact.info = {"c_in": c_in, "c_out": c_out, "groups": max(1, groups), "bias": has_bias,
                     "transposed": transposed, "kernel": [int(d) for d in w.shape[2:]],
                     "out_numel": _numel(list(out.shape))}
        fact.flops = float(conv_flop_count(list(x.shape), list(w.shape), list(out.shape), transposed))
        return True
    if kind == "sdpa":
        q, k, v = values[0], values[1], values[2]
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return False
        fact.info = {"head_dim": int(q.shape[-1]), "head_dim_v": int(v.shape[-1]),
                     "heads": int(q.shape[-3]) if q.dim() >= 3 else 1,
                     "q_len": int(q.shape[-2]), "kv_len": int(k.shape[-2])}
        q4 = [1] * (4 - q.dim()) + list(q.shape)
        k4 = [1] * (4 - k.dim()) + list(k.shape)
        v4 = [1] * (4 - v.dim()) + list(v.shape)
        fact.flops = float(sdpa_flop_count(q4, k4, v4))
        return True
    if kind == "embedding":
        if node.op == "call_module":
            weight = gm.get_submodule(node.target).weight
        else:
            weight = next((v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
        if not isinstance(weight, torch.Tensor):
            return False
        fact.info = {"rows": int(weight.shape[0]), "dim": int(weight.shape[1]) if weight.dim() > 1 else 1}
        fact.dtype = dtype_name(weight.dtype)
        return True
    if kind == "norm":
        source = node.args[0] if node.args else None
        fact.info = {"after": produced.get(source)}
        return True
    if kind == "cast":
        source = node.args[0] if node.args else None
        src = values[0] if values else None
        if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)):
            return False
        is_input = isinstance(source, torch.fx.Node) and source.op == "placeholder"
        fact.info = {
            "src": dtype_name(src.dtype),
            "dst": dtype_name(out.dtype),
            "explicit": _explicit_cast(name, overload, node, values),
            "input_is_graph_input": is_input,
            "input_is_parameter": is_input and source.name in graph.parameter_inputs,
            "after": produced.get(source),
            "users": sum(1 for user in node.users if "assert" not in str(user.target)),
            "numel": _numel(list(out.shape)),
        }
        fact.dtype = dtype_name(out.dtype)
        if fact.info["src"] == fact.info["dst"] and not fact.info["explicit"]:
            return False  # a device move or a copy, not a dtype cast
        return True
    if kind == "mha":
        return isinstance(values[0], torch.Tensor) if values else False
    if kind == "rnn":
        info = rnn_info(name, node, gm, values)
        if info is None:
            return False
        fact.info = info
        fact.flops = rnn_flops(info)
        # On the CPU the capture runs on, autocast lowers some RNN kernels and not others (mkldnn's LSTM,
        # not a projected one), and fx and export see different ones; on CUDA autocast casts the whole
        # cuDNN RNN to its dtype. None: it computes in the model's compute dtype (autocast's, else the
        # parameters'); ``weight_dtype`` tells a half model's RNN apart.
        fact.dtype = None
        fact.shapes = [s for s in (_shape(values[0]) if values else None, _shape(out)) if s is not None]
        return True
    return False


def rnn_info(name: str, node, gm, values: list[Any]) -> dict[str, Any] | None:
    """The sizes of an ``nn.LSTM``/``GRU``/``RNN`` run: the module itself for torch.fx's leaf, else the
    ATen op's arguments (``lstm.input(input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first)``; ``.data`` takes ``(data, batch_sizes, hx, params, ...)``, packed,
    without batch_first), read so that both give the same numbers: the weights' shapes."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        mode, weights = module.mode, list(module._flat_weights)
        num_layers, bidirectional, batch_first = module.num_layers, bool(module.bidirectional), module.batch_first
        x = values[0] if values else None
        packed = not isinstance(x, torch.Tensor)
        if packed:
            x = getattr(x, "data", None)  # a PackedSequence
    else:
        mode = RNN_OPS[name]
        at = next((i for i in range(1, len(values) - 5)
                   if isinstance(values[i], (list, tuple)) and isinstance(values[i + 1], bool)), None)
        if at is None:
            return None
        weights = list(values[at])
        num_layers, bidirectional = int(values[at + 2]), bool(values[at + 5])
        packed = len(values) < at + 7
        batch_first = False if packed else bool(values[at + 6])
        x = values[0]
    if not (isinstance(x, torch.Tensor) and weights and all(isinstance(w, torch.Tensor) for w in weights[:2])):
        return None
    gates = RNN_GATES[mode]
    input_size, hidden = int(weights[0].shape[1]), int(weights[0].shape[0]) // gates
    recurrent = int(weights[1].shape[1])
    shape = [int(d) for d in x.shape]
    if packed or x.dim() < 2:
        batch, seq = None, None
    elif x.dim() == 2:
        batch, seq = 1, shape[0]  # an unbatched sequence
    else:
        batch, seq = (shape[0], shape[1]) if batch_first else (shape[1], shape[0])
    return {
        "mode": mode, "gates": gates, "input_size": input_size, "hidden_size": hidden,
        "proj_size": recurrent if recurrent != hidden else 0, "num_layers": num_layers,
        "bidirectional": bidirectional, "batch": batch, "seq": seq, "tokens": _numel(shape[:-1]),
        "weight_dtype": dtype_name(weights[0].dtype),
    }


def rnn_flops(info: dict[str, Any]) -> float:
    """Forward FLOPs: 2 × tokens × N × K per layer and direction, plus the LSTM projection's GEMM."""
    tokens = info["tokens"]
    flops = sum(2.0 * tokens * n * k for n, k in rnn_gate_gemms(info))
    if info["proj_size"]:
        flops += len(rnn_gate_gemms(info)) * 2.0 * tokens * info["hidden_size"] * info["proj_size"]
    return flops


_MHA_PARAMS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
               "is_causal")


def _expand_mha(fact: OpFact, module: nn.MultiheadAttention, node, values: list[Any], start: int) -> list[OpFact]:
    """The ops an ``nn.MultiheadAttention`` leaf of symbolic_trace runs, as ``torch.export`` records
    them from ``F.multi_head_attention_forward`` (training mode): the in-projection (one packed GEMM
    for self-attention, q and kv for k is v, three otherwise, or the separate q/k/v weights), the
    attention core (two bmm's when ``need_weights``, the default, else scaled_dot_product_attention),
    and the out-projection; all attributed to the attention module itself."""
    from torch.utils.flop_counter import sdpa_flop_count

    bound: dict[str, Any] = {}
    for name, arg in zip(_MHA_PARAMS, node.args):
        bound[name] = arg
    bound.update({k: v for k, v in node.kwargs.items() if k in _MHA_PARAMS})
    query_node = bound.get("query")
    key_node = bound.get("key", query_node)
    value_node = bound.get("value", key_node)

    def value_of(arg):
        return arg_value(arg) if isinstance(arg, torch.fx.Node) else arg

    query, key = value_of(query_node), value_of(key_node)
    if not isinstance(key, torch.Tensor):
        key = query
    need_weights = bool(value_of(bound.get("need_weights", True)))
    masked = value_of(bound.get("attn_mask")) is not None or value_of(bound.get("key_padding_mask")) is not None
    q_shape, k_shape = list(query.shape), list(key.shape)
    batched = query.dim() == 3
    seq_axis = 1 if (module.batch_first and batched) else 0
    tgt_len, src_len = q_shape[seq_axis], k_shape[seq_axis]
    tokens_q, tokens_kv = _numel(q_shape[:-1]), _numel(k_shape[:-1])
    bsz = tokens_q // max(1, tgt_len)
    if module.bias_k is not None:
        src_len += 1
    if module.add_zero_attn:
        src_len += 1
    e, h = module.embed_dim, module.num_heads
    d = e // h
    base = dict(module=fact.module, module_type=fact.module_type, graph=fact.graph, site=fact.site, dtype=fact.dtype)
    out: list[OpFact] = []

    def gemm(op: str, batch: int, m: int, n: int, k: int, shape: list[int]) -> None:
        out.append(OpFact(index=start + len(out), kind="gemm", op=op, shapes=[shape], flops=2.0 * batch * m * n * k,
                          info={"batch": batch, "m": m, "n": n, "k": k}, **base))

    if not module._qkv_same_embed_dim:
        gemm("linear", 1, tokens_q, e, e, q_shape)
        gemm("linear", 1, tokens_kv, e, module.kdim, k_shape)
        gemm("linear", 1, tokens_kv, e, module.vdim, k_shape)
    elif key_node is value_node and query_node is key_node:
        gemm("linear", 1, tokens_q, 3 * e, e, q_shape)
    elif key_node is value_node:
        gemm("linear", 1, tokens_q, e, e, q_shape)
        gemm("linear", 1, tokens_kv, 2 * e, e, k_shape)
    else:
        gemm("linear", 1, tokens_q, e, e, q_shape)
        gemm("linear", 1, tokens_kv, e, e, k_shape)
        gemm("linear", 1, tokens_kv, e, e, k_shape)
    if need_weights:
        gemm("baddbmm" if masked else "bmm", bsz * h, tgt_len, src_len, d, q_shape)
        gemm("bmm", bsz * h, tgt_len, d, src_len, q_shape)
    else:
        q4, k4 = [bsz, h, tgt_len, d], [bsz, h, src_len, d]
        out.append(OpFact(index=start + len(out), kind="sdpa", op="scaled_dot_product_attention", shapes=[q4, k4, k4],
                          flops=float(sdpa_flop_count(q4, k4, k4)),
                          info={"head_dim": d, "head_dim_v": d, "heads": h, "q_len": tgt_len, "kv_len": src_len},
                          **base))
    gemm("linear", 1, tokens_q, e, e, q_shape)
    return out


# -- the whole audit of one built model ----------------------------------------------------------


def unwrap(model: Any) -> Any:
    """The model inside DataParallel, DistributedDataParallel and torch.compile's wrapper: the
    wrapper adds no layers, and its forward scatters or compiles, which a fake trace cannot follow."""
    for _ in range(8):
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            break
    return model


def training_mode(model: nn.Module) -> None:
    """What ``model.train()`` does, without calling ``train`` on the user's modules: a class may
    override it with a training step of its own (forward-forward's ``train(self, x_pos, x_neg)``), and
    ``nn.Module.train`` calls each child's ``train``. Every method the audit calls on the user's model
    is nn.Module's own, for the same reason."""
    for module in nn.Module.modules(model):
        module.training = True


def audit_model(model: nn.Module, facts: ModelFacts, hints: dict[str, Any], precision: str, fake_mode,
                user_files: UserFiles) -> ModelFacts:
    started = time.perf_counter()
    model = unwrap(model)
    if not isinstance(model, nn.Module):
        facts.status = "failed"
        facts.reason = f"the construction returned {type(model).__name__}, not an nn.Module"
        return facts
    training_mode(model)
    facts.model_class = type(model).__name__
    facts.modules = describe_modules(model)
    facts.param_count, facts.param_dtype = parameter_summary(model)
    forced = hints.get("model_dtype")
    if forced:
        nn.Module.to(model, getattr(torch, forced))
        facts.param_dtype = forced
    facts.autocast = facts.param_dtype == "float32"
    facts.compute_dtype = precision if facts.autocast else facts.param_dtype
    float_dtype = facts.param_dtype if facts.param_dtype in {"float16", "bfloat16", "float64"} else "float32"
    candidates, why_none = input_candidates(model, hints, float_dtype)
    outcome = capture(model, candidates, fake_mode, facts.autocast, precision, user_files)
    facts.capture = outcome.info
    if why_none:
        facts.capture.notes.append(why_none)
    if outcome.candidate is not None:
        facts.input = {
            "shapes": outcome.candidate.shapes,
            "dtypes": outcome.candidate.dtypes,
            "origin": outcome.candidate.origin,
            "assumed": outcome.candidate.assumed,
        }
    facts.timings["capture_s"] = round(time.perf_counter() - started, 3)
    facts.ops, facts.activation_bytes = normalise(outcome.graphs, user_files, facts.capture.notes)
    facts.total_flops = float(sum(op.flops for op in facts.ops))
    facts.timings["normalise_s"] = round(time.perf_counter() - started - facts.timings["capture_s"], 3)
    return facts
