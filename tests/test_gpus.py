"""The target GPU (tcaudit/gpus.py, tcaudit/data/gpus.toml): which GPUs ``--gpu`` takes, ``--gpu auto``'s
detection (nvidia-smi, then an already imported torch), the figures messages quote per GPU, and the
fixes that follow the GPU's features (fp16 + GradScaler where there is no bf16)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from tcaudit import gpus
from tcaudit.catalog import load_catalog
from tcaudit.config import GPUS, ConfigError, Settings, load_settings
from tcaudit.fix.engine import fix_file
from tcaudit.costs import cost_note, figures, measured_entries

from conftest import REPO, run_cli
from helpers import scan_code

CATALOG = load_catalog()
FIXTURE = str(REPO / "fixtures" / "resnet50" / "train.py")
ARCHS = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")

# A transformer-like MLP trained on CUDA: not a convnet, so TC201 picks bf16 where the GPU has it.
MLP = textwrap.dedent(
    """\
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(100):
        x = torch.randn(64, 512, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
)


# -- the table ----------------------------------------------------------------------------------------


def test_every_architecture_from_volta_to_blackwell_is_a_setting():
    assert set(ARCHS) <= set(GPUS)
    assert set(gpus.archs()) == set(ARCHS)
    for arch, key in gpus.archs().items():
        assert gpus.gpus()[key].sm == arch


def test_every_published_figure_has_a_source_and_no_gpu_claims_a_path_it_lacks():
    for key, gpu in gpus.gpus().items():
        figures_kept = [v for v in (gpu.fp32, gpu.tf32, gpu.half) if v is not None]
        if figures_kept:
            assert gpu.source.startswith("NVIDIA "), key  # published by NVIDIA, named as a document
            assert gpu.detail, key
            assert gpu.fp32 is not None and gpu.half is not None, key
        assert all(v > 0 for v in figures_kept), key
        if not gpu.has_tf32:
            assert gpu.tf32 is None, f"{key}: TF32 Tensor Cores start with sm_80"


def test_features_follow_the_architecture():
    t4, a100, l4, h200 = (gpus.resolve(k) for k in ("sm_75", "a100", "l4", "sm_90"))
    assert not t4.has_bf16 and not t4.has_tf32 and not t4.has_fp8
    assert a100.has_bf16 and a100.has_tf32 and not a100.has_fp8
    assert l4.has_fp8 and h200.has_fp8
    assert gpus.target("auto").has_bf16 and not gpus.target("v100").has_bf16
    assert gpus.target("a10").arch == "sm_86" and gpus.target("auto").arch == "auto"


def test_a_setting_is_resolved_once_and_settings_carry_the_resolved_target():
    assert gpus.target("a10") is gpus.target("a10")
    target = Settings(gpu="h100").target
    assert target is gpus.target("h100")
    assert (target.arch, target.gpu.name, target.has_bf16, target.has_tf32) == ("sm_90", "H100", True, True)
    assert Settings().target.gpu is None and Settings().target.setting == "auto"


# -- detection --------------------------------------------------------------------------------------------


def _fake_nvidia_smi(folder: Path, output: str, code: int = 0) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    """A PATH holding only a folder for a fake nvidia-smi (and the shell it needs to run)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}/bin{os.pathsep}/usr/bin")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return folder


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for nvidia-smi")
@pytest.mark.parametrize(
    "line, name, sm, setting",
    [
        ("NVIDIA H200, 9.0", "NVIDIA H200", "sm_90", "h200"),
        ("NVIDIA A10, 8.6", "NVIDIA A10", "sm_86", "a10"),  # not the A100
        ("NVIDIA A100-SXM4-80GB, 8.0", "NVIDIA A100-SXM4-80GB", "sm_80", "a100"),
        ("Tesla T4, 7.5", "Tesla T4", "sm_75", "t4"),
        ("NVIDIA GeForce RTX 3090, 8.6", "NVIDIA GeForce RTX 3090", "sm_86", "rtx3090"),
        ("NVIDIA RTX A6000, 8.6", "NVIDIA RTX A6000", "sm_86", "sm_86"),  # no row of its own: the architecture
        ("Orin, 8.7", "Orin", "sm_87", "sm_87"),
        ("NVIDIA L40S, 8.9", "NVIDIA L40S", "sm_89", "sm_89"),  # not the L4
        ("NVIDIA GeForce RTX 3090 Ti, 8.6", "NVIDIA GeForce RTX 3090 Ti", "sm_86", "sm_86"),
        ("NVIDIA H100 80GB HBM3, 9.0", "NVIDIA H100 80GB HBM3", "sm_90", "h100"),
    ],
)
def test_auto_reads_nvidia_smi(fake_path, line, name, sm, setting):
    _fake_nvidia_smi(fake_path, f"{line}\nNVIDIA H200, 9.0\n")
    found = gpus.detect()
    assert found is not None
    assert (found.name, found.sm, found.setting, found.via) == (name, sm, setting, "nvidia-smi")


def test_no_nvidia_smi_and_no_torch_loaded_is_unknown(fake_path):
    assert gpus.detect() is None


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for nvidia-smi")
def test_a_failing_nvidia_smi_is_unknown(fake_path):
    _fake_nvidia_smi(fake_path, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n", code=9)
    assert gpus.detect() is None


def test_torch_is_asked_only_when_already_imported(fake_path, monkeypatch):
    class _Cuda:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def get_device_capability(index):
            return (8, 9)

        @staticmethod
        def get_device_name(index):
            return "NVIDIA L4"

    class _Torch:
        cuda = _Cuda

    monkeypatch.setitem(sys.modules, "torch", _Torch)
    found = gpus.detect()
    assert (found.sm, found.setting, found.via) == ("sm_89", "l4", "torch")


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for nvidia-smi")
def test_scan_names_the_detected_gpu_and_quotes_its_figures(fake_path):
    _fake_nvidia_smi(fake_path, "NVIDIA A100-SXM4-40GB, 8.0\n")
    code, out, _ = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", "--select", "TC201", FIXTURE)
    assert code == 1
    data = json.loads(out)
    assert data["gpu"]["setting"] == "a100" and data["gpu"]["sm"] == "sm_80"
    assert data["gpu"]["detected"] == {"name": "NVIDIA A100-SXM4-40GB", "sm": "sm_80", "setting": "a100",
                                       "detected_by": "nvidia-smi"}
    assert any("target GPU: NVIDIA A100-SXM4-40GB (sm_80, from nvidia-smi)" in n for n in data["notes"])
    [finding] = data["findings"]
    assert "(A100, published, not measured: NVIDIA A100 datasheet, dense BF16/FP16 Tensor Core 312 vs FP32 19.5" \
        in finding["explanation"]
    code, out, _ = run_cli("scan", "--no-exec", "--no-cache", "--format", "sarif", "--select", "TC201", FIXTURE)
    assert json.loads(out)["runs"][0]["properties"]["gpu"]["detected"]["name"] == "NVIDIA A100-SXM4-40GB"


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for nvidia-smi")
def test_an_explicit_gpu_is_not_overridden_by_detection(fake_path):
    _fake_nvidia_smi(fake_path, "NVIDIA A100-SXM4-40GB, 8.0\n")
    code, out, _ = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", "--gpu", "sm_90",
                           "--select", "TC201", FIXTURE)
    data = json.loads(out)
    assert data["gpu"] == {"setting": "sm_90", "name": "H200", "sm": "sm_90"}
    assert "(H200, torch 2.11:" in data["findings"][0]["explanation"]


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for nvidia-smi")
def test_auto_is_detected_once_per_process_for_each_path(fake_path, tmp_path):
    _fake_nvidia_smi(fake_path, "NVIDIA H200, 9.0\n")
    first = gpus.detected()
    assert first is not None and first.setting == "h200"
    _fake_nvidia_smi(fake_path, "Tesla T4, 7.5\n")
    assert gpus.detected() is first  # the same PATH: nvidia-smi is not asked again
    assert gpus.detect().setting == "t4"  # detect() itself always asks


def test_detection_does_not_import_torch():
    import subprocess

    code = ("import sys; from tcaudit import gpus; gpus.detect(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# -- settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ARCHS + ("t4", "A100", "rtx3090", "h100", "b200"))
def test_the_command_line_and_the_config_take_every_gpu(value, tmp_path):
    code, _, err = run_cli("scan", "--no-exec", "--no-cache", "--gpu", value, "--select", "TC201", FIXTURE)
    assert code == 1, err
    config = tmp_path / "pyproject.toml"
    config.write_text(f'[tool.tcaudit]\ngpu = "{value}"\n', encoding="utf-8")
    assert load_settings([str(tmp_path)]).gpu == value.lower()


def test_an_unknown_gpu_is_a_usage_error():
    code, out, err = run_cli("scan", "--gpu", "sm_42", FIXTURE)
    assert code == 2
    assert "argument --gpu: unknown GPU 'sm_42' (one of auto, sm_70, sm_75" in err
    assert "Traceback" not in err + out


def test_an_unknown_gpu_in_the_config_is_a_config_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\ngpu = "sm_42"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="'gpu' must be one of auto, sm_70"):
        load_settings([str(tmp_path)])


# -- figures per GPU ------------------------------------------------------------------------------------


def _message(tmp_path, rule: str, gpu: str, code: str | None = None) -> str:
    # TC201 too: TC303 reports channels_last only where TC201's fix brings autocast.
    result = scan_code(tmp_path, code or Path(FIXTURE).read_text("utf-8"), select=(rule, "TC201"), gpu=gpu)
    [finding] = [f for f in result.findings if f.rule == rule][:1]
    # The figures and the recipe are in the explanation where the message is short.
    return f"{finding.message}\n{finding.explanation}"


def test_sm_86_quotes_the_rtx_3090s_published_figures_or_says_there_are_none(tmp_path):
    tc201 = _message(tmp_path, "TC201", "sm_86")
    assert ("(RTX 3090, published, not measured: NVIDIA Ampere GA102 GPU architecture whitepaper, dense "
            "BF16/FP16 Tensor Core 71 vs FP32 35.6 TFLOPS, 2.0× peak)") in tc201
    tc303 = _message(tmp_path, "TC303", "sm_86")
    assert "(RTX 3090: not measured on this GPU)" in tc303
    for message in (tc201, tc303):
        assert "H200" not in message and "torch 2.11" not in message


def test_a_named_gpu_of_the_measured_architecture_gets_the_measured_figure_with_its_gpu(tmp_path):
    h200 = figures(measured_entries(CATALOG["TC201"])["sm_90"])["autocast"]
    assert f"(H200, torch 2.11: {h200})" in _message(tmp_path, "TC201", "h100")


def test_a_gpu_without_a_published_row_says_not_measured(tmp_path):
    assert "(RTX 5090: not measured on this GPU)" in _message(tmp_path, "TC201", "sm_120")


@pytest.mark.parametrize("gpu", sorted(set(GPUS) - {"auto"}))
def test_every_figure_names_its_gpu_and_says_whether_it_was_measured(gpu):
    for rule, spec in CATALOG.items():
        for key in {k for e in measured_entries(spec).values() for k in figures(e)}:
            note = cost_note(spec, gpus.target(gpu), key)
            assert note, (rule, gpu, key)
            target = gpus.resolve(gpu)
            if gpus.target(gpu).arch == "sm_90":
                assert note.startswith(" (H200, torch 2.11: "), (rule, gpu, note)
            else:
                assert note.startswith(f" ({target.name}, published, not measured: NVIDIA ") or note == (
                    f" ({target.name}: not measured on this GPU)"), (rule, gpu, note)


# -- features -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["sm_75", "sm_70", "t4"])
def test_a_gpu_without_bf16_gets_fp16_with_a_grad_scaler(tmp_path, gpu):
    message = _message(tmp_path, "TC201", gpu, MLP)
    assert "fp16 autocast with a GradScaler" in message and "has no bf16 Tensor Cores" in message
    path = tmp_path / "train.py"
    path.write_text(MLP, encoding="utf-8")
    fixed = fix_file(path, Settings(select=("TC201",), gpu=gpu, root=tmp_path)).fixed
    assert "dtype=torch.float16" in fixed and "torch.amp.GradScaler(" in fixed and "bfloat16" not in fixed
    assert "scaler.scale(loss).backward()" in fixed


def test_a_gpu_with_bf16_keeps_bf16_and_an_explicit_precision_wins(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(MLP, encoding="utf-8")
    fixed = fix_file(path, Settings(select=("TC201",), gpu="sm_86", root=tmp_path)).fixed
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed
    fixed = fix_file(path, Settings(select=("TC201",), gpu="sm_75", precision="bf16", root=tmp_path)).fixed
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed


def test_tc301_is_silent_where_tf32_does_not_exist(tmp_path):
    assert not [f for f in scan_code(tmp_path, MLP, select=("TC301",), gpu="sm_75").findings if f.rule == "TC301"]
    assert [f for f in scan_code(tmp_path, MLP, select=("TC301",), gpu="sm_80").findings if f.rule == "TC301"]


def test_scan_on_a_t4_works_and_fix_writes_fp16_with_a_scaler():
    code, out, err = run_cli("scan", "--no-exec", "--no-cache", "--gpu", "sm_75", "--format", "json", FIXTURE)
    assert code == 1 and "Traceback" not in err
    [tc201] = [f["explanation"] for f in json.loads(out)["findings"] if f["rule"] == "TC201"]
    assert "fp16 autocast with a GradScaler" in tc201
    assert "(T4, published, not measured: NVIDIA T4 datasheet, dense FP16 Tensor Core 65 vs FP32 8.1 TFLOPS" in tc201
    code, out, _ = run_cli("fix", "--no-exec", "--gpu", "sm_75", "--select", "TC201", FIXTURE)
    assert code == 1
    assert "+            with torch.autocast(device_type=device, dtype=torch.float16" in out
    assert "+            scaler.scale(loss).backward()" in out


def test_explain_lists_the_published_figures_labelled_as_published():
    code, out, _ = run_cli("explain", "TC201")
    assert code == 0
    section = out.split("Published, not measured (tcaudit/data/gpus.toml), for the other GPUs:\n", 1)[1]
    assert "- T4 (sm_75), autocast: T4, published, not measured: NVIDIA T4 datasheet" in section
    assert "- RTX 5090 (sm_120), autocast: not measured on this GPU, and no published figure kept" in section
    assert "H200 (sm_90), autocast" not in section.split("\n## ", 1)[0]  # measured there: not repeated
