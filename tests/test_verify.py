"""tcaudit verify on the CPU: real runs of a tiny script, labelled as CPU timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("torch")

TINY = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "tiny_train.py"


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """One verify of the tiny script shared by the tests below: two rounds, health on, and attribution
    with a budget of two extra runs (one rule group of three measured). The tiny model is launch-bound,
    so ``fix`` applies its autocast and TF32 advice only where the rules are named (issue 52)."""
    out = tmp_path_factory.mktemp("verify")
    code, stdout, stderr = run_cli("verify", str(TINY), "--steps", "4", "--warmup", "2", "--rounds", "2",
                                   "--health", "--attribute", "--attribute-budget", "2", "--out", str(out),
                                   "--extend-select", "TC201,TC301",
                                   "--", "--steps", "50", "--batch-size", "12")
    return code, stdout, stderr, out


def _round_throughputs(out: Path, label: str) -> list[float]:
    """samples/s of each round of one side, recomputed from the harness's own files."""
    values = []
    for path in sorted((out / "runs").glob(f"{label}.r*.json")):
        run = json.loads(path.read_text())
        warmup = run["warmup"]
        values.append(sum(run["samples"][warmup:]) / sum(run["step_times"][warmup:]))
    return values


def test_verify_reports_both_runs(verified):
    code, stdout, stderr, out = verified
    assert code == 0, stderr
    assert "CPU timings" in stdout and "speedup" in stdout and "loss parity" in stdout


def test_verify_json_has_the_recorded_facts(verified):
    _, _, _, out = verified
    data = json.loads((out / "verify.json").read_text())
    assert data["gpu"] is None and data["cpu_timings"] is True
    assert data["torch"] and data["command"].startswith("tcaudit verify")
    assert "TC201" in data["fixes_applied"]
    for label in ("original", "patched"):
        run = data[label]
        assert len(run["step_times"]) == 6 and all(t > 0 for t in run["step_times"])
        assert run["samples"] == [12] * 6  # the model's batch, not the loss module's input again
        assert all(isinstance(l, float) for l in run["losses"])
        assert run["samples_per_s"] > 0
        assert run["graph_replays"] == 0 and run["cudagraph_skips"] == 0  # no CUDA graphs on a CPU
    for path in (out / "runs").glob("*.r*.json"):
        raw = json.loads(path.read_text())
        assert raw["graph_replays"] == [0] * len(raw["step_times"])
    # On a CPU the patch's autocast is disabled, so both runs compute the same numbers.
    assert data["original"]["losses"] == data["patched"]["losses"]
    assert data["loss_parity"] is True
    assert data["speedup"] > 0


def test_graph_replays_are_counted_per_step_and_shown_when_there_are_any(tmp_path):
    """No GPU here: the counting wrapper is tested on a stand-in for ``torch.cuda.CUDAGraph``, the
    recorder and runner on the numbers it produced, and the table on a run that replayed."""
    import types

    from rich.console import Console

    from tcaudit.verify.harness import Recorder, count_graph_replays
    from tcaudit.verify.report import graph_cell
    from tcaudit.verify.runner import summarize

    class Graph:
        def replay(self):
            return "replayed"

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(CUDAGraph=Graph))
    import torch

    recorder = Recorder(steps=3, warmup=1, out=tmp_path / "run.json", torch=torch)
    recorder.progress = None
    count_graph_replays(recorder, fake_torch)
    graph = Graph()
    recorder.step_post(None, (), {})  # opens the clock
    for replays in (2, 3, 3):
        for _ in range(replays):
            assert graph.replay() == "replayed"
        recorder.step_post(None, (), {})
    assert recorder.graph_replays == [2, 3, 3]
    run = summarize("patched", [{
        "status": "completed", "device": "GPU", "cuda": True, "torch": torch.__version__, "world_size": 1,
        "warmup": 1, "step_times": [0.01] * 3, "samples": [8] * 3, "losses": [1.0] * 3, "peak_memory_gib": 1.0,
        "graph_replays": recorder.graph_replays, "cudagraph_skips": 1,
    }])
    assert run.graph_replays == 6 and run.cudagraph_skips == 1  # the warm-up step's 2 are not timed
    assert graph_cell(run) == "6 (3.0/step), 1 skipped"
    console = Console(record=True, width=200)
    console.print(graph_cell(run))
    assert "3.0/step" in console.export_text()


def test_verify_reports_rounds_and_an_interval_computed_from_the_runs(verified):
    import statistics

    from tcaudit.verify.stats import ratio_interval

    code, stdout, _, out = verified
    data = json.loads((out / "verify.json").read_text())
    assert data["rounds"] == 2 and "t-interval on log ratios" in data["speedup_method"]
    original, patched = _round_throughputs(out, "original"), _round_throughputs(out, "patched")
    assert len(original) == len(patched) == 2 and len(data["runs"]["original"]) == 2
    assert data["round_speedups"] == pytest.approx([b / a for a, b in zip(original, patched)])
    assert data["speedup"] == pytest.approx(statistics.median(data["round_speedups"]))
    expected = ratio_interval(patched, original, 0.95)
    assert data["speedup_ci"] == pytest.approx([expected.low, expected.high])
    assert data["significant"] is expected.significant
    # (the report may wrap its speedup line: compare the words, not the line breaks)
    assert ("no significant difference" in " ".join(stdout.split())) is not expected.significant
    assert set(data["input_wait"]) >= {"original", "patched"}
    assert all(0 <= value <= 1 for value in data["input_wait"].values())


def test_verify_attribution_within_the_budget(verified):
    from tcaudit.verify.stats import ratio_interval

    _, stdout, _, out = verified
    data = json.loads((out / "verify.json").read_text())
    assert stdout.index("extra runs") < stdout.index("speedup:")  # the cost is said before the runs
    assert "--attribute-budget 2 allows 2" in stdout
    groups = [tuple(entry["rules"]) for entry in data["attribution"]]
    assert sorted(groups) == [("TC201",), ("TC301",), ("TC307",)]
    first, *rest = data["attribution"]
    label = "without-" + "+".join(first["rules"])
    without = _round_throughputs(out, label)
    assert len(without) == 2  # the measured group ran in both rounds
    expected = ratio_interval(_round_throughputs(out, "patched"), without)
    assert first["speedup"] == pytest.approx(expected.median)
    assert first["speedup_ci"] == pytest.approx([expected.low, expected.high])
    assert all(entry["speedup"] is None and "budget" in entry["note"] for entry in rest)
    assert "partial attribution" in data["attribution_summary"]
    assert (out / "work" / label / "tiny_train.py").is_file()


def test_verify_health_is_recorded_for_both_sides(verified):
    from tcaudit.runtime_facts import unused_parameters

    code, stdout, _, out = verified
    data = json.loads((out / "verify.json").read_text())
    for side in ("original", "patched"):
        health = data["health"][side]
        assert health["nonfinite_loss_steps"] == 0 and health["skipped_steps"] == 0
        assert health["grad_norm_median"] > 0 and health["ddp_find_unused_parameters"] is None
        assert len(health["rounds"][0]["grad_norms"]) == 6
        assert unused_parameters(out / "verify.json", side) == []
    assert data["health_regressions"] == [] and "no regression" in stdout and code == 0


def test_verify_writes_the_plot_and_the_patch(verified):
    _, _, _, out = verified
    assert (out / "verify.png").stat().st_size > 1000
    diff = (out / "work" / "patch.diff").read_text()
    assert "+    with torch.autocast(" in diff


def test_verify_fails_cleanly_when_the_script_fails(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nraise RuntimeError('boom')\n")
    code, stdout, stderr = run_cli("verify", str(script), "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "o"))
    assert code == 2
    assert "original run failed" in stderr and "boom" in stderr


def test_verify_missing_script(tmp_path):
    code, _, stderr = run_cli("verify", str(tmp_path / "nope.py"), "--out", str(tmp_path / "o"))
    assert code == 2 and "no such script" in stderr


def test_calibrate_without_cuda_exits_2_with_a_message(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, stderr = run_cli("calibrate")
    assert code == 2 and "needs a CUDA GPU" in stderr


def test_calibrated_table_merges_into_the_cost_table_format():
    from tcaudit.model.cost import load_table
    from tcaudit.verify.calibrate import build_table

    measurement = {
        "arch": "sm_89", "device": "NVIDIA L4", "torch": "2.11.0", "cuda": "12.8",
        "results": {
            "rates": {"bfloat16": 1.2e14, "float16": 1.2e14, "float32": 6e13},
            "gemm": {"k_unaligned": {"1": 4.0, "2": 4.0, "4": 4.0, "8": 2.0},
                     "n_unaligned": {"1": 3.0, "2": 3.0, "4": 3.0, "8": 2.0},
                     "m_unaligned": 1.1, "not_multiple_of_64": 1.05},
            "conv": {"channels_unaligned": 1.7}, "sdpa": {"head_dim_unsupported": 2.5},
            "measured": ["rates.bfloat16: test"],
        },
    }
    base = load_table()
    table = build_table(measurement, base)
    assert table["default_gpu"] == "sm_89"
    assert set(table["gpus"]) >= {"sm_90", "sm_89"}  # the packaged H200 entry is kept
    entry = table["gpus"]["sm_89"]
    assert entry["device"] == "NVIDIA L4" and entry["gemm"]["m_unaligned"] == 1.1
    assert entry["calibrated"]["torch"] == "2.11.0"
    assert set(entry) >= set(base["gpus"]["sm_90"]) - {"estimated"}


DDP_CANDIDATE = Path(__file__).resolve().parent.parent / "fixtures" / "fix" / "ddp_module_level.in.py"


@pytest.mark.slow
def test_verify_ddp_nproc_2_reports_scaling(tmp_path, monkeypatch):
    """``--ddp --nproc 2``: the single-process original runs once, the converted script on one process
    and under torchrun on two (gloo on this CPU), and the report gives the scaling efficiency."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    script = tmp_path / "train.py"
    script.write_bytes(DDP_CANDIDATE.read_bytes())
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("verify", str(script), "--ddp", "--nproc", "2", "--steps", "3", "--warmup", "1",
                                   "--out", str(out), "--", "--epochs", "3")
    assert code in (0, 1), stderr  # loss parity may differ: two processes take twice the batch per step
    assert "scaling: 2 processes" in stdout and "efficiency" in stdout
    data = json.loads((out / "verify.json").read_text())
    assert data["original"]["world_size"] == 1 and data["patched"]["world_size"] == 2
    assert data["scaling"]["nproc"] == 2 and data["scaling"]["efficiency"] > 0
    assert data["scaling"]["patched_one_process"]["world_size"] == 1
    assert "TC505" in data["fixes_applied"] and "--ddp" in data["command"]
    diff = (out / "work" / "patch.diff").read_text()
    assert "+model = DistributedDataParallel(model, gradient_as_bucket_view=True)" in diff


def test_verify_nproc_without_ddp_on_a_single_process_script_says_what_to_do(tmp_path):
    code, _, stderr = run_cli("verify", str(TINY), "--nproc", "2", "--steps", "1", "--warmup", "0",
                              "--out", str(tmp_path / "o"))
    assert code == 2
    assert "--ddp" in stderr and "single-process" in stderr
