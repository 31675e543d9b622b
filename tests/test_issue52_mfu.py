"""Issue 52, item 3: verify's achieved TFLOP/s and MFU for both sides, from the model audit's FLOPs per sample,
the precision the harness saw the model's GEMMs run in, and the GPU's published dense peak for it
(tcaudit/data/gpus.toml); a CPU run gets TFLOP/s and no MFU, a GPU gpus.toml does not list no MFU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit import gpus
from tcaudit.model_profile import AuditedModels, ModelProfile
from tcaudit.verify.runner import RunMetrics, training_flops_per_sample, with_utilisation

TINY = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "tiny_train.py"


def _run(device: str, sm: str | None, precision: str, samples_per_s: float = 1000.0, world: int = 1) -> RunMetrics:
    return RunMetrics(label="patched", status="completed", device=device, cuda=sm is not None, torch="2.11",
                      world_size=world, samples_per_s=samples_per_s, step_ms_p50=1.0, step_ms_p90=1.0,
                      peak_memory_gib=1.0, final_loss=1.0, mean_loss=1.0, precision=precision, sm=sm)


def _profile(flops_per_sample: float) -> ModelProfile:
    return ModelProfile(construction="Net()", assigned="model", model_class="Net", conv_share=0.0, gemm_share=1.0,
                        attention_share=0.0, conv3d=False, image_input=False, flops_per_sample=flops_per_sample)


def test_training_flops_are_three_forwards_summed_over_the_scripts_models():
    assert training_flops_per_sample(AuditedModels((_profile(2e9), _profile(1e9)))) == 9e9
    assert training_flops_per_sample(AuditedModels((_profile(0.0),))) is None
    assert training_flops_per_sample(None) is None


@pytest.mark.parametrize("device, sm, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "sm_90", "bf16", 989.5),
    ("NVIDIA H200", "sm_90", "fp8", 1979.0),
    ("NVIDIA H100 80GB HBM3", "sm_90", "tf32", 494.5),
    ("NVIDIA A100-SXM4-80GB", "sm_80", "fp16", 312.0),
    ("NVIDIA A100-SXM4-80GB", "sm_80", "fp32", 19.5),
    ("Tesla T4", "sm_75", "tf32", 8.1),  # no TF32 Tensor Cores before Ampere: the FP32 peak
])
def test_mfu_divides_by_the_published_peak_for_the_precision_in_use(device, sm, precision, peak):
    run = with_utilisation(_run(device, sm, precision, samples_per_s=1000.0), 6e11)
    assert run.tflops == pytest.approx(600.0)
    assert run.peak_tflops == peak
    assert run.mfu == pytest.approx(600.0 / peak)


def test_no_mfu_without_a_peak_on_a_cpu_or_without_flops():
    assert with_utilisation(_run("NVIDIA A100-SXM4-80GB", "sm_80", "fp8"), 6e11).mfu is None  # no FP8 on sm_80
    assert with_utilisation(_run("NVIDIA RTX 5090", "sm_120", "bf16"), 6e11).mfu is None  # no figure kept
    cpu = with_utilisation(_run("CPU (x86_64, 2 cores)", None, "fp32"), 6e11)
    assert cpu.tflops == pytest.approx(600.0) and cpu.mfu is None
    assert with_utilisation(_run("NVIDIA H200", "sm_90", "bf16"), None).tflops is None


def test_mfu_is_per_gpu_under_several_processes():
    run = with_utilisation(_run("NVIDIA H100 80GB HBM3", "sm_90", "bf16", samples_per_s=2000.0, world=2), 6e11)
    assert run.tflops == pytest.approx(1200.0) and run.mfu == pytest.approx(600.0 / 989.5)


def test_device_names_map_to_their_gpus_entry():
    assert gpus.device_gpu("NVIDIA H100 80GB HBM3", "sm_90").key == "h100"
    assert gpus.device_gpu("NVIDIA GeForce RTX 3090 Ti", "sm_86") is None  # not the 3090's figures


@pytest.mark.slow
def test_verify_reports_tflops_for_both_sides_in_the_table_and_json(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("verify", str(TINY), "--steps", "3", "--warmup", "1", "--rounds", "1",
                                   "--out", str(out), "--", "--steps", "20", "--batch-size", "12")
    assert code == 0, stderr + stdout
    data = json.loads((out / "verify.json").read_text())
    for label in ("original", "patched"):
        side = data["utilisation"][label]
        run = data[label]
        assert side["precision"] == "fp32" and side["mfu"] is None  # CPU timings: no MFU
        # TFLOP/s = 3 x the forward FLOPs per sample x samples/s: the tiny script's 64-128-10 MLP, 2 GEMMs.
        forward = 2 * (64 * 128 + 128 * 10)
        assert side["tflops"] == pytest.approx(3 * forward * run["samples_per_s"] / 1e12, rel=1e-6)
    assert "TFLOP/s" in stdout and "MFU: not reported on a CPU" in stdout
