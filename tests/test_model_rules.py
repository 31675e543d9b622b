"""The TC1 rules and the cost model on hand-written facts: no torch, no child process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tcaudit.catalog import load_catalog
from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.engine import report
from tcaudit.model import ModelAuditResult
from tcaudit.model.cost import CostModel, byte_alignment, is_aligned, load_table, suggest
from tcaudit.model.facts import CaptureInfo, ModelFacts, ModuleFact, OpFact, Site
from tcaudit.rules.registry import discover_model_rules

FILE = "/project/train.py"


@pytest.fixture(autouse=True)
def packaged_cost_table(monkeypatch, tmp_path):
    """A cost table calibrated on this machine (~/.cache/tcaudit) must not change these numbers."""
    monkeypatch.delenv("TCAUDIT_COST_TABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def linear(path: str, k: int, n: int, m: int = 8192, dtype: str = "bfloat16", line: int = 10, **info) -> tuple:
    module = ModuleFact(path, "Linear", True, Site(FILE, line, 14, line, 40),
                        {"role": "linear", "in_features": k, "out_features": n, "bias": True, **info})
    op = OpFact(0, "gemm", "linear", path, "Linear", 0, dtype, [[m, k], [n, k], [m, n]], 2.0 * m * n * k,
                Site(FILE, 99, 9), {"batch": 1, "m": m, "n": n, "k": k})
    return module, op


def facts_of(*pairs, **kwargs) -> ModelFacts:
    modules = {"": ModuleFact("", "Net", False, Site(FILE, 50, 9, 50, 14), {})}
    ops = []
    for module, op in pairs:
        if module is not None:
            modules[module.path] = module
        if op is not None:
            op.index = len(ops)
            ops.append(op)
    facts = ModelFacts(
        target={"kind": "script", "path": FILE, "label": "Net()", "construction": {"line": 50, "column": 9}},
        model_class="Net",
        modules=modules,
        ops=ops,
        capture=CaptureInfo(method="export", graphs=1),
        total_flops=sum(op.flops for op in ops),
        input={"shapes": [[8, 1024]], "origin": "batch 8 (the script)", "assumed": False},
    )
    for key, value in kwargs.items():
        setattr(facts, key, value)
    return facts


def run(facts: ModelFacts, select=("TC1",), **settings) -> list:
    result = ModelAuditResult()
    rules = [cls() for rule_id, cls in sorted(discover_model_rules().items())]
    settings = Settings(select=select, **settings)
    enabled = set(settings.enabled_rules())
    report([facts], [r for r in rules if r.id in enabled], settings, [], result)
    assert not result.errors, result.errors
    return result.findings


def test_every_model_rule_has_a_catalog_entry_that_needs_the_model():
    catalog = load_catalog()
    for rule_id in discover_model_rules():
        assert catalog[rule_id].needs == "model", rule_id
    assert {r for r in catalog if r.startswith("TC1")} == set(discover_model_rules())


@pytest.mark.parametrize(
    "dim,dtype,expected",
    [(50257, "bfloat16", 50304), (4095, "bfloat16", 4096), (30, "bfloat16", 32), (100, "float32", 100),
     (10, "bfloat16", 16), (2050, "float16", 2112), (17, "int8", 32)],
)
def test_suggested_sizes(dim, dtype, expected):
    assert suggest(dim, dtype) == expected


def test_alignment_is_sixteen_bytes_per_dtype():
    assert is_aligned(4100, "float32") and not is_aligned(4100, "bfloat16")  # TF32: 4 elements
    assert is_aligned(1000, "bfloat16") and not is_aligned(1000, "int8")  # int8/fp8: 16 elements
    assert byte_alignment(4095, "bfloat16") == 2 and byte_alignment(4100, "bfloat16") == 8


def test_cost_table_is_the_h200_calibration():
    table = load_table()
    assert table["source"].startswith("tcaudit calibrate on NVIDIA H200, torch 2.11.0+cu130, 2026-11-30")
    assert "H200 measurements with PyTorch 2.11" in table["source"]
    gemm = table["gpus"]["sm_90"]["gemm"]
    assert round(gemm["k_unaligned"]["2"], 2) == 5.95 and round(gemm["n_unaligned"]["2"], 2) == 5.89
    assert round(gemm["n_unaligned"]["8"], 2) == 2.95


def test_measured_penalties_under_one_count_as_none():
    """The H200's odd-M GEMM measured 0.998× (timing noise): no penalty, never a negative cost."""
    facts = facts_of(linear("fc", 1024, 1024, m=50))
    cost = CostModel(facts, "bf16")
    assert cost.entry["gemm"]["m_unaligned"] < 1
    assert cost.gemm_m_penalty(50, "bfloat16") == 1.0
    [finding] = run(facts, select=("TC105",))
    assert finding.details["est_time_lost"] == 0


def test_unaligned_gemm_with_its_impact():
    [finding] = run(facts_of(linear("fc", 4096, 4095), linear("out", 4096, 4096, line=11)), select=("TC101",))
    assert (finding.rule, finding.location.line, finding.severity) == ("TC101", 10, Severity.WARNING)
    assert finding.details["suggested"] == {"N": 4096}
    assert finding.details["penalty"] == 5.89  # N=4095 in bf16: 2-byte aligned, as the H200's N=50257 case
    assert finding.details["flop_share"] == pytest.approx(0.5, abs=0.01)
    assert 0 < finding.details["est_time_lost"] < 1 and finding.details["est_time_lost_ms"] > 0
    assert "~5.9× slower on NVIDIA H200" in finding.explanation and "slower" not in finding.message
    assert finding.message == "`fc` (Linear 4096→4095) runs a bf16 GEMM with N=4095, not a multiple of 8; pad N 4095→4096"


def test_a_small_head_is_info():
    findings = run(facts_of(linear("body", 4096, 4096), linear("head", 4096, 10, line=12)), select=("TC101",))
    [head] = findings
    assert head.details["module"] == "head" and head.severity == Severity.INFO


def test_fp32_gemms_need_only_four_element_alignment():
    facts = facts_of(linear("fc", 4096, 4100, dtype="float32"))
    assert run(facts, select=("TC101",)) == []
    [fp32] = run(facts, select=("TC111",))
    assert fp32.details["dtype"] == "float32" and fp32.details["precision"] == "bfloat16"
    # Short message (issue 29): what and where; why it stays fp32 and the figures in the explanation.
    assert fp32.message == "`fc` runs its linear in fp32, not the bf16 training uses"
    assert fp32.explanation.startswith("It stays fp32 because autocast does not reach it (") and "~2.1× slower" in fp32.explanation


def test_identical_layers_built_by_one_line_are_one_finding():
    pairs = [linear(f"h.{i}.fc", 1024, 1020) for i in range(12)]
    [finding] = run(facts_of(*pairs), select=("TC101",))
    assert finding.details["count"] == 12 and finding.details["modules"][:2] == ["h.0.fc", "h.1.fc"]
    assert "`h.0.fc` and 11 more like it" in finding.message


def test_vocab_is_tc104_not_tc101():
    embedding = ModuleFact("wte", "Embedding", True, Site(FILE, 20, 20),
                           {"role": "embedding", "num_embeddings": 50257, "embedding_dim": 768})
    lookup = OpFact(0, "embedding", "embedding", "wte", "Embedding", 0, "float32", [], 0.0, None,
                    {"rows": 50257, "dim": 768})
    head_module, head = linear("lm_head", 768, 50257, line=21, tied_to="wte")
    findings = run(facts_of((embedding, lookup), (head_module, head), linear("mlp", 768, 3072, line=22)))
    assert [(f.rule, f.location.line) for f in findings] == [("TC104", 21)]
    assert findings[0].details["tied"] is True and findings[0].details["suggested"] == 50304


def test_batch_unaligned_only_when_the_script_chose_it():
    facts = facts_of(linear("fc", 1024, 1024, m=50))
    [finding] = run(facts, select=("TC105",))
    assert finding.severity == Severity.INFO and finding.details["suggested"] == 56
    # Short message (issue 29): the input, the figure and the remedy are in the explanation.
    assert finding.message.startswith("the model's GEMMs run with M=50 rows, not a multiple of 8")
    assert len(finding.message) <= 120
    assert "batch 8 (the script)" in finding.explanation and "(e.g. M=56) avoids it" in finding.explanation
    facts.input["assumed"] = True
    assert run(facts, select=("TC105",)) == []


def test_batch_unaligned_not_reported_for_a_slice_of_an_aligned_batch():
    """nanoGPT traced without targets: the blocks run on 12 x 1024 rows, the head on the last position
    only (12 rows). The batch of 12 is not what makes any GEMM unaligned."""
    facts = facts_of(linear("h.0.mlp", 768, 3072, m=12 * 1024), linear("lm_head", 768, 256, m=12, line=12))
    assert run(facts, select=("TC105",)) == []
    facts = facts_of(linear("h.0.mlp", 768, 3072, m=8192), linear("lm_head", 768, 256, m=12, line=12))
    assert [f.details["m"] for f in run(facts, select=("TC105",))] == [12]


def test_round_trip_and_no_op_casts():
    module, gemm = linear("fc", 1024, 1024, m=8, dtype="float16")
    cast = dict(kind="cast", op="to", module="", module_type="Net", graph=0, shapes=[[8, 1024], [8, 1024]], flops=0.0)
    up = OpFact(0, dtype="float32", site=Site(FILE, 30, 9), info={
        "src": "float16", "dst": "float32", "explicit": True, "after": 0, "users": 1, "numel": 8192,
        "input_is_graph_input": False}, **cast)
    down = OpFact(0, dtype="float16", site=Site(FILE, 30, 9), info={
        "src": "float32", "dst": "float16", "explicit": True, "after": 1, "users": 1, "numel": 8192,
        "input_is_graph_input": False}, **cast)
    noop = OpFact(0, dtype="float16", site=Site(FILE, 31, 9), info={
        "src": "float16", "dst": "float16", "explicit": True, "after": None, "users": 1, "numel": 8192,
        "input_is_graph_input": False}, **cast)
    on_input = OpFact(0, dtype="float16", site=Site(FILE, 32, 9), info={
        "src": "float16", "dst": "float16", "explicit": True, "after": None, "users": 1, "numel": 8192,
        "input_is_graph_input": True}, **cast)
    facts = facts_of((module, gemm), (None, up), (None, down), (None, noop), (None, on_input),
                     compute_dtype="float16", autocast=False)
    findings = run(facts, select=("TC110",))
    assert [(f.location.line, f.severity) for f in findings] == [(30, Severity.WARNING), (31, Severity.INFO)]
    assert findings[0].details["dtypes"] == ["float16", "float32", "float16"]
    assert findings[0].message == "round-trip cast fp16 → fp32 → fp16 in the model's own forward; drop both casts"
    assert "gives back the same values" in findings[0].explanation
    assert findings[1].message == "cast to fp16 in the model's own forward does nothing: the tensor is already fp16"
    assert "at the configured precision" in findings[1].explanation


def test_conv_bias_before_batchnorm_from_the_graph_and_from_parameters():
    conv_module = ModuleFact("conv", "Conv2d", True, Site(FILE, 40, 21),
                             {"role": "conv", "in_channels": 64, "out_channels": 64, "kernel_size": [3, 3],
                              "groups": 1, "bias": True, "next": "bn"})
    bn_module = ModuleFact("bn", "BatchNorm2d", True, Site(FILE, 41, 19), {"role": "norm", "num_features": 64})
    conv = OpFact(0, "conv", "conv2d", "conv", "Conv2d", 0, "bfloat16", [[8, 64, 56, 56]], 2.0 * 8 * 64 * 64 * 9 * 56 * 56,
                  None, {"c_in": 64, "c_out": 64, "groups": 1, "bias": True, "out_numel": 8 * 64 * 56 * 56})
    norm = OpFact(1, "norm", "batch_norm", "bn", "BatchNorm2d", 0, "bfloat16", [], 0.0, None, {"after": 0})
    [finding] = run(facts_of((conv_module, conv), (bn_module, norm)), select=("TC112",))
    assert (finding.location.line, finding.details["norm"]) == (40, "bn")
    assert finding.message == "`conv` (Conv2d, bias=True) feeds BatchNorm `bn`; construct it with bias=False"
    assert finding.explanation.startswith("The norm subtracts the per-channel mean")
    parameters_only = facts_of((conv_module, None), (bn_module, None), capture=CaptureInfo(method="parameters"))
    [finding] = run(parameters_only, select=("TC112",))
    assert finding.details["impact_basis"] == "parameters"
    assert finding.explanation.endswith("; checked from its parameters.") and len(finding.message) <= 120


def test_stem_and_unaligned_channels():
    def conv(c_in, c_out, line, groups=1):
        return OpFact(0, "conv", "conv2d", f"c{line}", "Conv2d", 0, "bfloat16", [[8, c_in, 32, 32]],
                      2.0 * 8 * c_in * c_out * 9 * 1024 / groups, None,
                      {"c_in": c_in, "c_out": c_out, "groups": groups, "bias": False})

    ops = [(ModuleFact(f"c{line}", "Conv2d", True, Site(FILE, line, 5), {}), conv(*args, line=line, **kw))
           for args, line, kw in [((3, 64), 1, {}), ((64, 30), 2, {}), ((30, 30), 3, {"groups": 30}), ((32, 3), 4, {})]]
    findings = run(facts_of(*ops), select=("TC102", "TC103"))
    # the stem is TC103; 64→30 is TC102; a depthwise conv and a 3-channel output are not reported
    assert sorted((f.rule, f.location.line) for f in findings) == [("TC102", 2), ("TC103", 1)]
    # Short message (issue 29): what and where; the why goes to the explanation.
    [stem] = [f for f in findings if f.rule == "TC103"]
    assert stem.message.startswith("`c1` (Conv2d 3→64) is a 3-channel stem") and len(stem.message) <= 120
    assert "want 4 input channels" in stem.explanation and "channels_last" not in stem.message


def test_attention_head_dims():
    def sdpa(head, module, line):
        return (ModuleFact(module, "Attention", False, Site(FILE, line, 9), {}),
                OpFact(0, "sdpa", "scaled_dot_product_attention", module, "Attention", 0, "bfloat16",
                       [[8, 8, 256, head]], 4.0 * 8 * 8 * 256 * 256 * head, Site(FILE, 99, 9),
                       {"head_dim": head, "head_dim_v": head, "heads": 8}))

    findings = run(facts_of(sdpa(12, "a", 5), sdpa(64, "b", 6), sdpa(320, "c", 7)), select=("TC106",))
    assert [(f.location.line, f.details["suggested"]) for f in findings] == [(5, 16), (7, 256)]
    assert findings[0].message == "attention in `a` has head dim 12, not a multiple of 8; use 16"
    assert "(8 heads × 12)" in findings[0].explanation and "flash-attention kernels refuse it" in findings[0].explanation


def test_not_audited_says_why():
    failed = ModelFacts.failed({"kind": "script", "path": FILE, "label": "Net(vocab)",
                                "construction": {"line": 7, "column": 9},
                                "skipped": ["line 3 (`vocab = torch.load('v.pt')`) loads a checkpoint (`torch.load`), "
                                            "so the audit did not run it; it binds vocab"]},
                               "building the model failed at train.py:7 (`model = Net(vocab)`): "
                               "NameError: name 'vocab' is not defined")
    [finding] = run(failed)
    assert (finding.rule, finding.location.line, finding.severity) == ("TC100", 7, Severity.INFO)
    assert "(line 3 (`vocab = torch.load('v.pt')`) loads a checkpoint" in finding.explanation
    assert len(finding.message) <= 120
    traced = facts_of(linear("fc", 1024, 1020), capture=CaptureInfo(method="parameters", failures=[
        "export: RuntimeError: x", "dynamo: RuntimeError: y", "fx: TraceError: z"]))
    traced.ops = []
    findings = run(traced)
    assert [f.rule for f in findings] == ["TC100", "TC101"]
    assert "only the checks on layer parameters ran" in findings[0].explanation


def test_gpu_without_a_table_says_so():
    facts = facts_of(linear("fc", 4096, 4095))
    assert CostModel(facts, "bf16", "sm_80").source.endswith("(measured on sm_90; no table for sm_80 yet)")
    [finding] = run(facts, select=("TC101",), gpu="sm_80")
    assert "no table for sm_80" in finding.details["cost_source"]


def test_rule_modules_import_no_torch():
    assert "torch" not in sys.modules or Path(sys.modules["torch"].__file__).exists()
    import subprocess

    code = "import sys; from tcaudit.rules.registry import discover_model_rules; discover_model_rules(); " \
           "import tcaudit.model.cost, tcaudit.model.slicing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_alignment_messages_name_the_gpu_their_penalty_was_measured_on():
    """TC102 and TC106 quote the cost table's penalty for the target GPU, not a fixed estimate."""
    conv = OpFact(0, "conv", "conv2d", "c", "Conv2d", 0, "bfloat16", [[8, 64, 32, 32]], 2.0 * 8 * 64 * 30 * 9 * 1024,
                  None, {"c_in": 64, "c_out": 30, "groups": 1, "bias": False})
    attention = OpFact(0, "sdpa", "scaled_dot_product_attention", "a", "Attention", 0, "bfloat16",
                       [[8, 8, 256, 12]], 4.0 * 8 * 8 * 256 * 256 * 12, Site(FILE, 99, 9),
                       {"head_dim": 12, "head_dim_v": 12, "heads": 8})
    pairs = [(ModuleFact("c", "Conv2d", True, Site(FILE, 2, 5), {}), conv),
             (ModuleFact("a", "Attention", False, Site(FILE, 5, 9), {}), attention)]
    messages = {f.rule: f.message + f.explanation for f in run(facts_of(*pairs), select=("TC102", "TC106"))}
    assert "(~3.1× slower on NVIDIA H200)" in messages["TC102"]  # calibrate.json: 30 vs 32 channels, 3.06×
    assert "(~2.6× slower on NVIDIA H200)" in messages["TC106"]  # head dim 60 vs 64, 2.63×
    assert "estimated" not in messages["TC102"] + messages["TC106"]


def _table(path: str, rows: int, dim: int, line: int) -> tuple:
    module = ModuleFact(path, "Embedding", True, Site(FILE, line, 20),
                        {"role": "embedding", "num_embeddings": rows, "embedding_dim": dim})
    lookup = OpFact(0, "embedding", "embedding", path, "Embedding", 0, "float32", [], 0.0, None,
                    {"rows": rows, "dim": dim})
    return module, lookup


def test_vocab_only_where_a_softmax_ranges_over_the_rows():
    """An untied head (or F.linear over the table's weight: a GEMM of N=rows, K=dim) is a vocabulary; a
    recommender's user table, positions and a GAN's class table (beside an auxiliary classifier of
    another width) are lookups."""
    lm = facts_of(_table("tok", 32001, 512, 20), _table("pos", 1000, 512, 21), linear("head", 512, 32001, line=22))
    assert [(f.rule, f.details["heads"]) for f in run(lm, select=("TC104",))] == [("TC104", ["head"])]
    functional = facts_of(_table("wte", 50257, 128, 20), (None, linear("", 128, 50257)[1]))
    assert [f.details["vocab_size"] for f in run(functional, select=("TC104",))] == [50257]
    recommender = facts_of(_table("users", 6041, 64, 20), _table("items", 3953, 64, 21), linear("mlp", 128, 64))
    assert run(recommender, select=("TC104",)) == []
    gan = facts_of(_table("label_emb", 1000, 100, 20), linear("fc", 100, 512), linear("aux", 512, 1000, line=23))
    assert run(gan, select=("TC104",)) == []


def test_vocab_from_parameters_only_needs_a_head_of_the_tables_width():
    tied_head = ModuleFact("lm_head", "Linear", True, Site(FILE, 21, 9),
                           {"role": "linear", "in_features": 768, "out_features": 50257, "bias": False, "tied_to": "wte"})
    table, _ = _table("wte", 50257, 768, 20)
    parameters = facts_of((table, None), (tied_head, None), capture=CaptureInfo(method="parameters"))
    assert [f.details["tied"] for f in run(parameters, select=("TC104",))] == [True]
    users, _ = _table("users", 6041, 64, 20)
    assert run(facts_of((users, None), capture=CaptureInfo(method="parameters")), select=("TC104",)) == []


def test_a_gemm_that_runs_within_a_launch_is_info_and_says_so():
    """A 10-wide layer at batch 8 (a tutorial MLP): its math takes nanoseconds, padded or not, under
    the ~5 µs an eager step takes to launch any kernel. The step is launch-bound: info, no % of the step."""
    facts = facts_of(linear("fc", 10, 10, m=8))
    [finding] = run(facts, select=("TC101",))
    assert finding.severity == Severity.INFO
    assert finding.details["launch_bound"] is True and finding.details["est_time_lost"] == 0
    assert "launch-bound" in finding.explanation and "of the step" not in finding.explanation


def test_the_same_width_in_a_large_gemm_is_a_warning_with_its_share():
    facts = facts_of(linear("fc", 4100, 4100, m=8192))
    [finding] = run(facts, select=("TC101",))
    assert finding.severity == Severity.WARNING
    assert "launch_bound" not in finding.details and finding.details["est_time_lost"] > 0.3
    assert "of the step" in finding.explanation and "launch-bound" not in finding.explanation


def test_the_output_layers_n_is_the_tasks_but_its_k_is_still_checked():
    """``return self.head(x)`` with 10 classes: N=10 is what the task asks for; a K of 4100 is not."""
    module, op = linear("head", 4100, 10, m=8192)
    op.info["model_output"] = True
    [finding] = run(facts_of((module, op)), select=("TC101",))
    assert finding.details["unaligned"] == {"K": 4100}
    module, op = linear("head", 4096, 10, m=8192)
    op.info["model_output"] = True
    assert run(facts_of((module, op)), select=("TC101",)) == []
    module, op = linear("head", 4096, 10, m=8192)  # the same layer feeding another GEMM: reported
    assert [f.details["unaligned"] for f in run(facts_of((module, op)), select=("TC101",))] == [{"N": 10}]


def test_an_output_conv_keeps_its_class_channels():
    conv = dict(kind="conv", op="conv2d", module="head", module_type="Conv2d", graph=0, dtype="bfloat16",
                shapes=[[64, 64, 128, 128], [21, 64, 1, 1], [64, 21, 128, 128]], flops=2.0 * 64 * 21 * 64 * 128 * 128,
                site=Site(FILE, 20, 9))
    module = ModuleFact("head", "Conv2d", True, Site(FILE, 20, 14, 20, 40),
                        {"role": "conv", "in_channels": 64, "out_channels": 21, "kernel_size": [1, 1], "groups": 1})
    info = {"c_in": 64, "c_out": 21, "groups": 1, "bias": True, "stem": False}
    assert len(run(facts_of((module, OpFact(0, info=dict(info), **conv))), select=("TC102",))) == 1
    segmentation_head = OpFact(0, info={**info, "model_output": True}, **conv)
    assert run(facts_of((module, segmentation_head)), select=("TC102",)) == []



def test_launch_bound_is_judged_only_with_the_scripts_own_batch():
    """An assumed batch (8, say) says little about the real step: the layer is judged as if the batch
    were 512. A 10-wide layer is within a launch at any batch; a 1030-wide one only at the small batch."""
    facts = facts_of(linear("fc", 10, 10, m=8), input={"shapes": [[8, 10]], "assumed": True})
    [finding] = run(facts, select=("TC101",))
    assert finding.details["launch_bound"] is True
    given = facts_of(linear("fc", 1024, 1030, m=8), input={"shapes": [[8, 1024]], "assumed": False})
    assumed = facts_of(linear("fc", 1024, 1030, m=8), input={"shapes": [[8, 1024]], "assumed": True})
    [small] = run(given, select=("TC101",))
    [unknown] = run(assumed, select=("TC101",))
    assert small.details["launch_bound"] is True and "launch_bound" not in unknown.details


def test_the_launch_bound_threshold_comes_from_the_cost_table():
    facts = facts_of(linear("fc", 10, 10, m=8))
    table = json.loads(json.dumps(load_table()))
    table["gpus"][table["default_gpu"]].setdefault("launch", {})["hidden_flops"] = 100.0
    assert not CostModel(facts, table=table).within_launch(facts.ops, 3.0)  # 1,600 FLOPs × 3 > 100
    assert CostModel(facts).within_launch(facts.ops, 3.0)
