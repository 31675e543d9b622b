"""The fx fast path of the model capture against torch.export, in this process on fake tensors.

The audit traces a model with torch.fx and runs the graph on fake tensors when nothing casts doubt
on the trace, and falls back to torch.export otherwise (tcaudit/model/capture.py). These tests hold
the fast path to the same facts as export, and check that each doubt sends the model to export.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tcaudit.model import capture as cap  # noqa: E402
from tcaudit.model.build import UserFiles, skip_fake_initialisation  # noqa: E402
from tcaudit.model.facts import ModelFacts  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def hidden_linear(x, weight):
    """A helper that torch.fx.wrap makes one opaque node: its GEMM is invisible to the trace."""
    return F.linear(x, weight)


torch.fx.wrap("hidden_linear")


# -- models ---------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 30, 3, padding=1, bias=True)
        self.bn = nn.BatchNorm2d(30)
        self.body = nn.Sequential(nn.Conv2d(30, 64, 3, stride=2), nn.BatchNorm2d(64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.body(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    """nn.MultiheadAttention three ways: self-attention with the default need_weights, without
    weights (scaled_dot_product_attention), and cross-attention with separate key/value sizes."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 96)
        self.attn = nn.MultiheadAttention(96, 8, batch_first=True)
        self.fast = nn.MultiheadAttention(96, 8, batch_first=True)
        self.cross = nn.MultiheadAttention(96, 8, kdim=40, vdim=40, batch_first=True)
        self.kv = nn.Linear(96, 40)
        self.head = nn.Linear(96, 1000)

    def forward(self, idx):
        h = self.emb(idx)
        h, _ = self.attn(h, h, h)
        h, _ = self.fast(h, h, h, need_weights=False)
        memory = self.kv(h[:, :16])
        h, _ = self.cross(h, memory, memory, need_weights=False)
        return self.head(h)


class EinsumAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.out = nn.Linear(64, 64)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, 4, 16).unbind(2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(16)
        y = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
        return self.out(y.reshape(b, t, 64))


class OptionalMask(nn.Module):
    """`if mask is None` decides on the default the audit's call leaves in place."""

    def __init__(self):
        super().__init__()
        self.plain = nn.Linear(64, 64)
        self.masked = nn.Linear(64, 64)

    def forward(self, x, mask=None):
        if mask is None:
            return self.plain(x)
        return self.masked(x) * mask


class AutocastInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x):
        with torch.autocast("cuda", enabled=False):
            x = self.a(x.float())
        return self.b(x)


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.a.register_forward_hook(lambda module, args, out: out.float())

    def forward(self, x):
        return self.b(self.a(x))


class IsInstanceBranch(nn.Module):
    """A proxy is not a torch.Tensor: the trace takes the other branch than a real call (b, not a)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 60)

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            return self.a(x)
        return self.b(x)


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(60, 64))
        self.head = nn.Linear(60, 8)

    def forward(self, x):
        return self.head(hidden_linear(x, self.weight))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(64, 1)
        self.small = nn.Linear(64, 64)
        self.large = nn.Linear(64, 2050)

    def forward(self, x):
        if self.gate(x).mean() > 0:
            return self.large(x)
        return self.small(x)


# -- helpers --------------------------------------------------------------------------------------


def audit(model_class, shapes, dtype="float32", fast=True, monkeypatch=None) -> ModelFacts:
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, skip_fake_initialisation():
        model = model_class()
    if not fast:
        def no_fx(*args, **kwargs):
            raise RuntimeError("fast path off")

        monkeypatch.setattr(cap, "trace_fx", no_fx)
    facts = ModelFacts(target={"kind": "factory", "label": model_class.__name__})
    hints = {"input_shapes": shapes, "input_dtype": dtype}
    cap.audit_model(model, facts, hints, "bfloat16", fake_mode, UserFiles([str(HERE)]))
    if not fast:
        monkeypatch.undo()
    return facts


def op_keys(facts: ModelFacts) -> list[tuple]:
    """What the rules read of each op (the op's name differs: `Linear` module vs `linear` ATen op)."""
    local = {"weight", "after", "users", "input_is_graph_input", "input_is_parameter"}
    return sorted(
        (op.kind, op.module or "", op.dtype, sorted((k, v) for k, v in op.info.items() if k not in local), op.flops,
         op.site.line if op.site else None)
        for op in facts.ops
    )


# -- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_class,shapes,dtype",
    [
        (ConvNet, [[8, 3, 32, 32]], "float32"),
        (Attention, [[4, 64]], "int64"),
        (EinsumAttention, [[4, 32, 64]], "float32"),
        (OptionalMask, [[4, 64]], "float32"),
    ],
)
def test_fast_path_gives_the_facts_export_gives(model_class, shapes, dtype, monkeypatch):
    fast = audit(model_class, shapes, dtype)
    full = audit(model_class, shapes, dtype, fast=False, monkeypatch=monkeypatch)
    assert fast.capture.method == "fx" and fast.capture.fast_path == "", fast.capture
    assert full.capture.method == "export", full.capture
    assert op_keys(fast) == op_keys(full)
    assert fast.total_flops == full.total_flops > 0
    assert fast.activation_bytes == pytest.approx(full.activation_bytes, rel=0.1)


def test_multihead_attention_is_expanded_as_export_records_it():
    facts = audit(Attention, [[4, 64]], "int64")
    by_module = {}
    for op in facts.ops:
        by_module.setdefault(op.module, []).append((op.kind, op.op, op.info.get("n"), op.info.get("k")))
    # need_weights (the default): one packed in-projection, two bmm's, the out-projection
    assert by_module["attn"] == [("gemm", "linear", 288, 96), ("gemm", "bmm", 64, 12), ("gemm", "bmm", 12, 64),
                                 ("gemm", "linear", 96, 96)]
    assert [kind for kind, *_ in by_module["fast"]] == ["gemm", "sdpa", "gemm"]
    # separate key/value sizes: three in-projections over the 16-token memory
    cross = [(n, k) for kind, _, n, k in by_module["cross"] if kind == "gemm"]
    assert cross == [(96, 96), (96, 40), (96, 40), (96, 96)]


@pytest.mark.parametrize(
    "model_class,why",
    [
        (AutocastInside, "enters torch.autocast"),
        (Hooked, "forward hooks (a)"),
        (IsInstanceBranch, "does not use parameter(s) a.weight, a.bias, a real forward does"),
        (Wrapped, "calls `hidden_linear`"),
    ],
)
def test_a_doubtful_trace_goes_to_export(model_class, why, monkeypatch):
    facts = audit(model_class, [[4, 64]])
    assert facts.capture.method == "export"
    assert facts.capture.fast_path.startswith("fx: ") and why in facts.capture.fast_path
    assert facts.capture.failures == []  # the fast path is not a failure the report mentions
    assert op_keys(facts) == op_keys(audit(model_class, [[4, 64]], fast=False, monkeypatch=monkeypatch))


def test_doubtful_trace_is_the_last_resort(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("refused")

    monkeypatch.setattr(cap, "capture_export", refuse)
    monkeypatch.setattr(cap, "capture_dynamo", refuse)
    facts = audit(Wrapped, [[4, 64]])
    assert facts.capture.method == "fx"
    assert facts.capture.failures == ["export: RuntimeError: refused", "dynamo: RuntimeError: refused"]
    assert any("used torch.fx's symbolic trace although" in note for note in facts.capture.notes)


def test_data_dependent_control_flow_skips_the_fast_path_quietly():
    facts = audit(DataDependent, [[4, 64]])
    assert facts.capture.method == "dynamo"
    assert facts.capture.fast_path.startswith("fx: TraceError")
    assert [f.split(":")[0] for f in facts.capture.failures] == ["export"]


def test_the_fast_path_failing_everywhere_is_listed_last(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("refused")

    monkeypatch.setattr(cap, "capture_export", refuse)
    monkeypatch.setattr(cap, "capture_dynamo", refuse)
    facts = audit(DataDependent, [[4, 64]])
    assert facts.capture.method == "parameters"
    assert [f.split(":")[0] for f in facts.capture.failures] == ["export", "dynamo", "fx"]


def test_wrong_input_shape_is_probed_by_the_model_itself():
    """The first candidate has 4 channels: the fast path's shape propagation fails, a plain forward
    rejects it too and accepts the next, and the fast path runs with that one."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, skip_fake_initialisation():
        model = ConvNet()
    candidates = [cap.InputCandidate([[8, 4, 32, 32]], ["float32"], "wrong channels"),
                  cap.InputCandidate([[8, 3, 32, 32]], ["float32"], "right")]
    outcome = cap.capture(model, candidates, fake_mode, True, "bfloat16", UserFiles([str(HERE)]))
    assert outcome.info.method == "fx" and outcome.candidate.origin == "right"


def test_initialisation_is_skipped_only_on_fake_tensors():
    from torch.nn import init

    original = init._no_grad_trunc_normal_
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    real = torch.zeros(4, 4)
    with fake_mode, skip_fake_initialisation():
        fake = torch.empty(16, 16)
        # trunc_normal_ asks `mask.any()` of the data: without the skip a fake tensor cannot answer
        assert init.trunc_normal_(fake, std=0.02) is fake
        assert init.kaiming_uniform_(fake, a=math.sqrt(5)) is fake
        with pytest.raises(ValueError):
            init.kaiming_uniform_(torch.empty(16))  # nn.init's own argument checks still run
    with skip_fake_initialisation():
        init.normal_(real)
    assert real.abs().sum() > 0  # real tensors are initialised as ever
    assert init._no_grad_trunc_normal_ is original


def test_batch_norm_passes_through_only_what_it_would_accept():
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        bn = nn.BatchNorm2d(8)
        x = torch.empty(4, 8, 5, 5)

        class MyNorm(nn.BatchNorm2d):
            pass

        assert cap.batch_norm_passes_through(bn, x)
        assert not cap.batch_norm_passes_through(bn, torch.empty(4, 6, 5, 5))  # the real call raises
        assert not cap.batch_norm_passes_through(bn, torch.empty(1, 8, 1, 1))  # one value per channel
        assert not cap.batch_norm_passes_through(MyNorm(8), x)  # a subclass may override forward
        assert not cap.batch_norm_passes_through(nn.BatchNorm1d(8), x)
