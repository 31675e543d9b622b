"""TC107 rnn-size-unaligned and TC108 fp8-candidate (issue 33), and the capture of RNNs as ``rnn`` ops.

The rules are judged on hand-written facts (no torch); the capture on real models in this process on
fake tensors, once per model (module-scoped), the fx fast path against torch.export."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.engine import report
from tcaudit.model import ModelAuditResult
from tcaudit.model.facts import CaptureInfo, ModelFacts, ModuleFact, OpFact, Site, rnn_gate_gemms
from tcaudit.rules.registry import discover_model_rules

FILE = "/project/train.py"


@pytest.fixture(autouse=True)
def packaged_cost_table(monkeypatch, tmp_path):
    """A cost table calibrated on this machine (~/.cache/tcaudit) must not change these numbers."""
    monkeypatch.delenv("TCAUDIT_COST_TABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


# -- hand-written facts ----------------------------------------------------------------------------


def rnn(path="rnn", mode="LSTM", input_size=250, hidden=500, batch=64, seq=100, layers=1, bidirectional=False,
        proj=0, weight_dtype="float32", line=12, **marks) -> tuple[ModuleFact, OpFact]:
    gates = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1}[mode]
    info = {"mode": mode, "gates": gates, "input_size": input_size, "hidden_size": hidden, "proj_size": proj,
            "num_layers": layers, "bidirectional": bidirectional, "batch": batch, "seq": seq,
            "tokens": (batch or 1) * (seq or 1), "weight_dtype": weight_dtype, **marks}
    flops = sum(2.0 * info["tokens"] * n * k for n, k in rnn_gate_gemms(info))
    kind = {"LSTM": "LSTM", "GRU": "GRU", "RNN_TANH": "RNN"}[mode]
    module = ModuleFact(path, kind, True, Site(FILE, line, 20, line, 60),
                        {"role": "rnn", "mode": mode, "input_size": input_size, "hidden_size": hidden})
    op = OpFact(0, "rnn", kind, path, kind, 0, None, [[batch, seq, input_size], [batch, seq, hidden]], flops,
                Site(FILE, 30, 9), info)
    return module, op


def linear(path: str, k: int, n: int, m: int, dtype: str | None = "bfloat16", line: int = 10) -> tuple:
    module = ModuleFact(path, "Linear", True, Site(FILE, line, 14, line, 40),
                        {"role": "linear", "in_features": k, "out_features": n, "bias": True})
    op = OpFact(0, "gemm", "linear", path, "Linear", 0, dtype, [[m, k], [n, k], [m, n]], 2.0 * m * n * k,
                Site(FILE, 40, 9), {"batch": 1, "m": m, "n": n, "k": k})
    return module, op


def facts_of(*pairs, kind="factory", assumed=False, **kwargs) -> ModelFacts:
    modules = {"": ModuleFact("", "Net", False, Site(FILE, 50, 9, 50, 14), {})}
    ops = []
    for module, op in pairs:
        modules[module.path] = module
        op.index = len(ops)
        ops.append(op)
    facts = ModelFacts(
        target={"kind": kind, "path": FILE, "label": "Net()", "construction": {"line": 50, "column": 9}},
        model_class="Net",
        modules=modules,
        ops=ops,
        capture=CaptureInfo(method="export", graphs=1),
        total_flops=sum(op.flops for op in ops),
        input={"shapes": [[64, 100, 250]], "origin": "batch 64 (the script)", "assumed": assumed},
    )
    for key, value in kwargs.items():
        setattr(facts, key, value)
    return facts


def run(facts: ModelFacts, rule: str, sources=(), **settings) -> list:
    result = ModelAuditResult()
    rules = [cls() for rule_id, cls in discover_model_rules().items() if rule_id == rule]
    report([facts], rules, Settings(select=(rule,), **settings), list(sources), result)
    assert not result.errors, result.errors
    return result.findings


# -- TC107 -----------------------------------------------------------------------------------------


def test_an_lstm_of_250_by_500_in_bf16_is_reported_at_its_construction():
    [finding] = run(facts_of(rnn()), "TC107")
    assert finding.message == "`rnn` (LSTM 250→500, bf16) has hidden_size 500 and input_size 250, not multiples " \
                              "of 8; pad to 512 and 256"
    assert finding.severity == Severity.INFO and (finding.location.line, finding.location.column) == (12, 20)
    assert finding.details["unaligned"] == {"hidden_size": 500, "input_size": 250}
    assert finding.details["suggested"] == {"hidden_size": 512, "input_size": 256}
    assert "(H200, torch 2.11: an LSTM 250→500 ran 4,880 µs a step in bf16, 256→512 2,009 µs" in finding.explanation
    assert "GRU 5,564 µs, 6,051 µs padded (0.92×, slower)" in finding.explanation
    assert 0 < finding.details["est_time_lost"] < 1 and finding.details["penalty"] == 2.43
    assert len(finding.message) <= 120


def test_the_figures_are_the_target_gpus_only():
    [finding] = run(facts_of(rnn()), "TC107", gpu="a100")
    assert "H200" not in finding.explanation and "(A100: not measured on this GPU)" in finding.explanation


def test_only_the_input_size_off_is_not_reported():
    """LSTM 300→1000 against 304→1024 measured 1.04×, a GRU 0.92× (slower padded)."""
    assert run(facts_of(rnn(input_size=300, hidden=1024)), "TC107") == []
    assert run(facts_of(rnn(mode="GRU", input_size=300, hidden=1000)), "TC107") == []


def test_an_rnn_reading_the_models_input_names_its_hidden_size_only():
    [finding] = run(facts_of(rnn(input_size=39, hidden=500, model_input=True)), "TC107")
    assert finding.details["unaligned"] == {"hidden_size": 500}
    assert finding.message.endswith("has hidden_size 500, not a multiple of 8; pad to 512")


def test_an_rnn_whose_states_are_the_models_output_is_the_tasks():
    assert run(facts_of(rnn(model_output=True)), "TC107") == []


def test_a_small_rnn_is_launch_bound_and_silent():
    """LSTM 100→100 at batch 64 ran the same as 104→104: each step's 10 MFLOP waits on the one before."""
    assert run(facts_of(rnn(input_size=100, hidden=100)), "TC107") == []
    # The same sizes at a batch of 1024: 164 MFLOP a step, no longer hidden.
    assert len(run(facts_of(rnn(input_size=100, hidden=100, batch=1024)), "TC107")) == 1
    # A short sequence whose whole RNN runs within one launch (the cost table's threshold).
    assert run(facts_of(rnn(seq=2)), "TC107") == []


def test_an_assumed_batch_is_judged_at_a_large_one():
    """At the script's own batch of 8, each step is 24 MFLOP (hidden); guessed, it is judged at 512 rows."""
    assert run(facts_of(rnn(batch=8)), "TC107") == []
    assert len(run(facts_of(rnn(batch=8), assumed=True), "TC107")) == 1
    # 100→100 is hidden even at 512 rows (82 MFLOP a step).
    assert run(facts_of(rnn(input_size=100, hidden=100, batch=8), assumed=True), "TC107") == []


def test_precision_decides():
    fp32 = facts_of(rnn(), autocast=False, compute_dtype="float32", param_dtype="float32")
    assert run(fp32, "TC107") == []
    half = facts_of(rnn(weight_dtype="float16"), autocast=False, compute_dtype="float16", param_dtype="float16")
    [finding] = run(half, "TC107")
    assert "fp16" in finding.message and finding.details["dtype"] == "float16"


def test_a_packed_sequence_has_no_batch_to_judge():
    module, op = rnn()
    op.info.update(batch=None, seq=None)
    assert run(facts_of((module, op)), "TC107") == []


def test_identical_rnns_built_by_one_line_are_one_finding():
    first, second = rnn("layers.0.rnn"), rnn("layers.1.rnn")
    [finding] = run(facts_of(first, second), "TC107")
    assert finding.details["count"] == 2 and "and 1 more like it" in finding.message


# -- TC108 -----------------------------------------------------------------------------------------


def mlp(m=8192, dim=4096, hidden=16384, dtype="bfloat16", **kwargs) -> ModelFacts:
    return facts_of(linear("up", dim, hidden, m, dtype, line=8), linear("down", hidden, dim, m, dtype, line=9),
                    **kwargs)


def test_a_model_of_large_bf16_gemms_is_one_fp8_finding_at_its_construction():
    [finding] = run(mlp(), "TC108")
    assert finding.message == ("≥4096³ bf16 GEMMs do 100% of GEMM FLOPs: FP8 ran them 1.69-1.85× faster (H200); "
                               "needs TE/torchao.float8 fused casts")
    assert len(finding.message) <= 120 and finding.severity == Severity.INFO and finding.fix is None
    assert finding.location.line == 50
    assert finding.details["largest"] == {"module": "up", "m": 8192, "n": 16384, "k": 4096, "line": 8}
    assert "1.69× the bf16 rate at 4096³" in finding.explanation and "1.13× at 16384³" in finding.explanation
    assert "TransformerEngine" in finding.explanation and "convert_to_float8_training" in finding.explanation


@pytest.mark.parametrize("gpu,fires", [("auto", True), ("sm_90", True), ("h100", True), ("b200", True),
                                       ("l4", False), ("rtx4090", False), ("a100", False), ("t4", False)])
def test_hopper_and_newer_only(gpu, fires):
    findings = run(mlp(), "TC108", gpu=gpu)
    assert bool(findings) == fires
    if gpu == "b200":
        assert "not measured on B200" in findings[0].message and "H200" not in findings[0].explanation


def test_sizes_where_fp8_did_not_pay_are_silent():
    assert run(mlp(dim=2048, hidden=8192), "TC108") == []  # K=2048 for `up`, N=2048 for `down`
    assert run(mlp(m=2048), "TC108") == []  # a small batch: M=2048
    assert run(mlp(m=8192, hidden=4096, dim=1024), "TC108") == []


def test_the_large_gemms_must_do_most_of_the_gemm_flops():
    large = linear("big", 4096, 4096, 4096, line=8)  # 137 GFLOP
    small = linear("proj", 1024, 1024, 81920, line=9)  # 172 GFLOP
    assert run(facts_of(large, small), "TC108") == []
    assert len(run(facts_of(large, linear("proj", 1024, 1024, 40960, line=9)), "TC108")) == 1


def test_an_assumed_batch_or_fp32_gemms_are_silent():
    assert run(mlp(assumed=True), "TC108") == []
    assert run(mlp(dtype="float32"), "TC108") == []  # TC111 / TC201 first


def test_a_script_already_in_fp8_or_in_fp32_is_silent(tmp_path):
    from tcaudit.source.parsing import read_source

    body = "import torch\nmodel = Net().cuda()\n"
    cases = {
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    pass\n": True,
        "model = model.to(torch.bfloat16)\n": True,
        "import transformer_engine.pytorch as te\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n    pass\n": False,
        "from torchao.float8 import convert_to_float8_training\nconvert_to_float8_training(model)\n"
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    pass\n": False,
        "y = torch._scaled_mm(a, b, scale_a=s, scale_b=s, out_dtype=torch.bfloat16)\n": False,
        "loss = model(x).sum()\n": False,  # no autocast, no half model: TC201
    }
    for index, (tail, fires) in enumerate(cases.items()):
        path = tmp_path / f"train{index}.py"
        path.write_text(body + tail, encoding="utf-8")
        facts = mlp(kind="script")
        facts.target["path"] = str(path)
        assert bool(run(facts, "TC108", sources=[read_source(path)])) == fires, tail


def test_a_factory_model_needs_no_script_text():
    assert len(run(mlp(kind="factory"), "TC108")) == 1


def test_a_model_in_fp8_already_is_silent():
    facts = mlp()
    facts.ops[0].dtype = "float8_e4m3fn"
    assert run(facts, "TC108") == []


# -- the capture of RNNs (torch, in this process) ----------------------------------------------------

RECURRENT = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(250, 500, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = nn.GRU(1000, 100, batch_first=True)
            self.rnn = nn.RNN(100, 30, nonlinearity="relu", batch_first=True)
            self.projected = nn.LSTM(30, 64, proj_size=20, batch_first=True)
            self.head = nn.Linear(20, 10)

        def forward(self, x):
            y, _ = self.lstm(x)
            y, _ = self.gru(y)
            y, _ = self.rnn(y)
            y, _ = self.projected(y)
            return self.head(y)
''')


def _capture(model_path: Path, fast: bool) -> ModelFacts:
    import importlib.util

    from torch._subclasses.fake_tensor import FakeTensorMode

    from tcaudit.model import capture as cap
    from tcaudit.model.build import UserFiles, skip_fake_initialisation

    spec = importlib.util.spec_from_file_location("recurrent_fixture", model_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, skip_fake_initialisation():
        model = module.Recurrent()
    facts = ModelFacts(target={"kind": "factory", "label": "Recurrent"})
    hints = {"input_shapes": [[64, 100, 250]], "input_dtype": "float32"}
    trace_fx = cap.trace_fx
    if not fast:
        def no_fx(*args, **kwargs):
            raise RuntimeError("fast path off")

        cap.trace_fx = no_fx
    try:
        cap.audit_model(model, facts, hints, "bfloat16", fake_mode, UserFiles([str(model_path.parent)]))
    finally:
        cap.trace_fx = trace_fx
    return facts


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("recurrent")
    path = folder / "recurrent.py"
    path.write_text(RECURRENT, encoding="utf-8")
    return _capture(path, fast=True), _capture(path, fast=False)


def _keys(facts: ModelFacts) -> list[tuple]:
    local = {"weight", "after", "users", "input_is_graph_input", "input_is_parameter"}
    return sorted((op.kind, op.module or "", op.dtype, sorted((k, v) for k, v in op.info.items() if k not in local),
                   op.flops, op.shapes if op.kind == "rnn" else None, op.site.line if op.site else None)
                  for op in facts.ops)


@pytest.mark.slow
def test_rnns_are_captured_the_same_by_the_fast_path_and_by_export(captured):
    fast, full = captured
    assert fast.capture.method == "fx" and fast.capture.fast_path == "", fast.capture
    assert full.capture.method == "export", full.capture
    assert _keys(fast) == _keys(full)
    assert fast.total_flops == full.total_flops


@pytest.mark.slow
def test_rnn_facts(captured):
    fast, _ = captured
    ops = {op.module: op for op in fast.ops}
    lstm = ops["lstm"]
    assert (lstm.kind, lstm.dtype, lstm.shapes) == ("rnn", None, [[64, 100, 250], [64, 100, 1000]])
    assert {k: lstm.info[k] for k in ("mode", "gates", "input_size", "hidden_size", "proj_size", "num_layers",
                                      "bidirectional", "batch", "seq", "tokens", "weight_dtype")} == {
        "mode": "LSTM", "gates": 4, "input_size": 250, "hidden_size": 500, "proj_size": 0, "num_layers": 2,
        "bidirectional": True, "batch": 64, "seq": 100, "tokens": 6400, "weight_dtype": "float32"}
    # 2 × tokens × gates·hidden × (input + hidden) per layer and direction: layer 0 reads 250, layer 1 1000.
    assert lstm.flops == 2 * (2 * 6400 * 2000 * 750) + 2 * (2 * 6400 * 2000 * 1500)
    assert lstm.info["model_input"] is True and "model_output" not in lstm.info
    assert "model_input" not in ops["gru"].info  # it reads the LSTM's states
    assert ops["gru"].flops == 2 * 6400 * 300 * 1100 and ops["rnn"].info["mode"] == "RNN_RELU"
    projected = ops["projected"].info
    assert (projected["hidden_size"], projected["proj_size"]) == (64, 20)
    assert ops["projected"].flops == 2 * 6400 * 256 * (30 + 20) + 2 * 6400 * 64 * 20
    assert ops["lstm"].site.line == 16 and fast.modules["lstm"].attrs["hidden_size"] == 500
    # The GEMM marks are the ones the walk gave before RNNs were recorded.
    assert ops["head"].info.get("model_output") is True


@pytest.mark.slow
def test_the_captured_model_reports_its_lstm_and_stays_quiet_elsewhere(captured):
    fast, _ = captured
    found = run(fast, "TC107")
    assert [(f.details["module"], f.details["unaligned"]) for f in found] == [("lstm", {"hidden_size": 500})]
    assert run(fast, "TC108") == []
