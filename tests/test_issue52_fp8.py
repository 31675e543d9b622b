"""Issue 52, item 1 on the CPU: ``fix --fp8`` converts the large linear layers the model audit picks to
torchao float8 training (the exact text, the layers it selects, a patched script that still trains), and
declines with the reason on a GPU without FP8, without a known GPU, without torchao, for a model with no
layer large enough and for fp32 training. The speed and the loss parity are measured on the device
(BENCHMARKS.md, benchmarks/results/)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import runpy
import subprocess
import sys

import pytest

from conftest import REPO, run_cli
from tcaudit import gpus

torch = pytest.importorskip("torch")

GPT = REPO / "benchmarks" / "fp8" / "gpt.py"
SMALL = ["--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size", "16", "--batch-size", "2",
         "--vocab-size", "128", "--no-compile"]

CONVERSION = '''\
 model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_embd, args.n_head).to(device)
+if next(model.parameters()).is_cuda and torch.cuda.get_device_capability() >= (8, 9):
+    import re
+
+    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
+
+    fp8_layers = re.compile(
+        r"(?:_orig_mod\\.|module\\.)*(?:"
+        r"h\\.\\d+\\.attn\\.c_attn"
+        r"|h\\.\\d+\\.attn\\.c_proj"
+        r"|h\\.\\d+\\.mlp\\.c_fc"
+        r"|h\\.\\d+\\.mlp\\.c_proj"
+        r")"
+    )
+    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
+                               module_filter_fn=lambda module, fqn: fp8_layers.fullmatch(fqn) is not None)
 if not args.no_compile:
'''


def _fix(tmp_path, source: str, *flags: str):
    script = tmp_path / "gpt.py"
    script.write_text(source, encoding="utf-8")
    code, out, err = run_cli("fix", "--no-cache", "--select", "TC108", *flags, str(script), cwd=tmp_path)
    return script, code, out, err


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    pytest.importorskip("torchao")
    tmp_path = tmp_path_factory.mktemp("fp8")
    script, code, out, err = _fix(tmp_path, GPT.read_text(encoding="utf-8"), "--gpu", "h100", "--fp8", "--apply")
    assert code in (0, 1), err
    assert "gpt.py: --fp8: converted (TC108)" in err and "fixed gpt.py (TC108)" in err, err
    return script


@pytest.mark.slow
def test_fix_fp8_inserts_the_conversion_after_the_model_is_placed(patched, tmp_path):
    original = GPT.read_text(encoding="utf-8").splitlines(keepends=True)
    import difflib

    diff = "".join(difflib.unified_diff(original, patched.read_text(encoding="utf-8").splitlines(keepends=True), n=1))
    assert CONVERSION in diff, diff
    # A second fix --fp8 changes nothing: the script uses torchao now.
    code, out, err = run_cli("fix", "--no-cache", "--select", "TC108", "--gpu", "h100", "--fp8", str(patched),
                             cwd=patched.parent)
    assert code == 0 and out == "", (out, err)


@pytest.mark.slow
def test_the_filter_converts_the_blocks_linears_and_keeps_the_lm_head_in_bf16(patched, monkeypatch):
    """The patch's own ``module_filter_fn``, applied (in torchao's CPU emulation) to the script's GPT: the four
    linear layers of every block become Float8Linear, the LM head stays; a bf16 step trains through them."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    text = patched.read_text(encoding="utf-8")
    pattern = re.compile("".join(re.findall(r'^\s+r"(.*)"$', text, re.M)))
    monkeypatch.setattr(sys, "argv", ["gpt.py", "--steps", "0", *SMALL])
    model = runpy.run_path(str(patched))["GPT"](128, 16, 2, 64, 2)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name("tensorwise"), emulate=True)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda module, fqn: pattern.fullmatch(fqn) is not None)
    converted = sorted(name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear")
    assert converted == sorted(f"h.{i}.{layer}" for i in range(2)
                               for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert type(model.lm_head) is torch.nn.Linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randint(128, (2, 16))).float().logsumexp(-1).mean()
    loss.backward()
    assert model.h[0].mlp.c_fc.weight.grad is not None and torch.isfinite(loss)


@pytest.mark.slow
def test_the_patched_script_still_trains_on_a_cpu(patched):
    done = subprocess.run([sys.executable, str(patched), "--steps", "3", *SMALL], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step 0 loss" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("gpu, reason", [
    ("t4", "the target GPU, T4 (sm_75), has no FP8 Tensor Cores (Ada and Hopper, sm_89, and newer)"),
    ("a100", "the target GPU, A100 (sm_80), has no FP8 Tensor Cores"),
])
def test_declined_on_a_gpu_without_fp8(tmp_path, gpu, reason):
    script, code, out, err = _fix(tmp_path, GPT.read_text(encoding="utf-8"), "--gpu", gpu, "--fp8")
    assert out == "" and f"TC108 no fix: {reason}" in err, err
    assert script.read_text(encoding="utf-8") == GPT.read_text(encoding="utf-8")


@pytest.mark.slow
def test_declined_without_a_known_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "detected", lambda: None)
    _, code, out, err = _fix(tmp_path, GPT.read_text(encoding="utf-8"), "--gpu", "auto", "--fp8")
    assert out == "" and "TC108 no fix: no target GPU is known" in err and "`--gpu`" in err, err


@pytest.mark.slow
def test_declined_without_torchao_saying_how_to_install_it(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    _, code, out, err = _fix(tmp_path, GPT.read_text(encoding="utf-8"), "--gpu", "h100", "--fp8")
    assert out == "" and "TC108 no fix: torchao, whose float8 training the conversion calls, is not installed: " \
        "`pip install torchao` (or `pip install 'tcaudit[fp8]'`)" in err, err


@pytest.mark.slow
def test_declined_for_a_model_with_no_layer_large_enough(tmp_path):
    small = GPT.read_text(encoding="utf-8").replace('"--n-embd", type=int, default=4096',
                                                    '"--n-embd", type=int, default=1024')
    _, code, out, err = _fix(tmp_path, small, "--gpu", "h100", "--fp8")
    assert out == "", out
    assert "TC108 no fix: no linear layer of `GPT` has N and K of at least 4096 and multiples of 16" in err, err


@pytest.mark.slow
def test_declined_for_fp32_training(tmp_path):
    fp32 = GPT.read_text(encoding="utf-8").replace(
        "    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == \"cuda\"):\n"
        "        logits = model(x)\n        loss", "    logits = model(x)\n    loss")
    assert "autocast" not in fp32.split("for step in range")[1]
    _, code, out, err = _fix(tmp_path, fp32, "--gpu", "h100", "--fp8")
    assert out == "" and "TC108 no fix: `model` trains in fp32: FP8 training goes on top of bf16 autocast" in err, err


@pytest.mark.slow
def test_without_fp8_fix_leaves_the_model_alone_and_scan_reports_the_candidate(tmp_path):
    script, code, out, err = _fix(tmp_path, GPT.read_text(encoding="utf-8"), "--gpu", "h100")
    assert out == "" and "TC108" not in err, (out, err)
    code, out, err = run_cli("scan", "--no-cache", "--select", "TC108", "--gpu", "h100", "--format", "concise",
                             str(script), cwd=tmp_path)
    assert code == 0 and "TC108 ≥4096³ bf16 GEMMs do" in out, (out, err)
