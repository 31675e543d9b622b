"""On a CUDA GPU: each rewrite that exists for speed lands on its fast kernel (issue 52, item 2). Every
patched fixture runs under a probe that records what ran: the profiler's operator and kernel names
(the SDPA backend, the fused optimizer kernel, NHWC convolutions, Inductor's Triton kernels), CUDA
graph replays, and the dtype of every image batch copied to the GPU. Skipped without CUDA; run with

    TCAUDIT_FASTPATH_SUMMARY=/path/fastpath.json python -m pytest -q -m gpu tests/test_gpu_fastpath.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a CUDA GPU (no nvidia-smi)"),
]

FIX = FIXTURES / "fix"

# Runs a script as __main__ under torch.profiler; writes what ran to the JSON file named by argv[1].
PROBE = textwrap.dedent('''
    import json, runpy, sys
    import torch
    from torch.profiler import ProfilerActivity, profile

    out, script, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    replays, copies = [0], []
    replay = torch.cuda.CUDAGraph.replay

    def counted(self, *args, **kwargs):
        replays[0] += 1
        return replay(self, *args, **kwargs)

    torch.cuda.CUDAGraph.replay = counted
    to, cuda = torch.Tensor.to, torch.Tensor.cuda

    def recorded(method):
        def wrapper(self, *args, **kwargs):
            moved = method(self, *args, **kwargs)
            if (isinstance(moved, torch.Tensor) and moved.is_cuda and not self.is_cuda and self.dim() == 4
                    and not isinstance(self, torch.nn.Parameter)):  # a batch, not a conv weight moving
                copies.append(str(self.dtype).removeprefix("torch."))
            return moved
        return wrapper

    torch.Tensor.to, torch.Tensor.cuda = recorded(to), recorded(cuda)
    sys.argv = [script, *argv]
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.start()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
    finally:
        torch.cuda.synchronize()
        prof.stop()
        names = sorted({event.name for event in prof.events()})
        with open(out, "w") as f:
            json.dump({"names": names, "graph_replays": replays[0], "copies_4d": copies,
                       "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, f)
''')

SUMMARY: dict[str, dict] = {}


def _argv(path: Path) -> list[str]:
    match = re.search(r"#\s*run:\s*python \{path\}(.*)", path.read_text(encoding="utf-8"))
    return match.group(1).split() if match else []


def _probe(tmp_path: Path, name: str, text: str, argv: list[str]) -> dict:
    script = tmp_path / f"{name}.py"
    script.write_text(text, encoding="utf-8")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    out = tmp_path / f"{name}.json"
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(probe), str(out), str(script), *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    record = json.loads(out.read_text())
    names = record["names"]
    SUMMARY[name] = {key: value for key, value in record.items() if key != "names"}
    SUMMARY[name]["kernels_of_interest"] = [n for n in names if re.search(
        r"flash|efficient_attention|attention_math|_fused_|_foreach_|nhwc|nchw|triton_", n, re.I)][:40]
    return record


@pytest.fixture(scope="module", autouse=True)
def summary():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    yield
    target = os.environ.get("TCAUDIT_FASTPATH_SUMMARY")
    if target:
        Path(target).write_text(json.dumps(SUMMARY, indent=2) + "\n")


def _fixed(path: Path, *rules: str) -> str:
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    result = fix_file(path, Settings(select=rules))
    assert result.error is None and set(rules) <= set(result.applied), (result.error, result.applied)
    return result.fixed


def test_sdpa_on_one_heads_3d_tensors_needs_the_4d_form_for_flash():
    """What TC308's 3-D rewrite is for: on (B, T, hs) SDPA has no flash kernel; on (B, 1, T, hs) it has."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(8, 256, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(1), q.unsqueeze(1), q.unsqueeze(1),
                                                               is_causal=True)
    assert out.shape == (8, 1, 256, 64)


def test_tc308_on_a_char_level_gpts_heads_runs_flash_attention(tmp_path):
    source = FIX / "tc308_head_3d.in.py"
    record = _probe(tmp_path, "tc308_head_3d", _fixed(source, "TC201", "TC308"), _argv(source))
    names = record["names"]
    assert any("flash" in n.lower() for n in names), [n for n in names if "attention" in n.lower()]
    assert not any("attention_math" in n for n in names)


def test_tc307_fused_adam_runs_the_fused_kernel(tmp_path):
    source = FIX / "tc307_trainer_function.out.py"
    names = _probe(tmp_path, "tc307_trainer_function", source.read_text(encoding="utf-8"), _argv(
        FIX / "tc307_trainer_function.in.py"))["names"]
    assert any(n.startswith(("aten::_fused_adamw_", "aten::_fused_adam_")) for n in names), \
        [n for n in names if "adam" in n.lower()]


def test_tc303_channels_last_runs_nhwc_convolutions_without_layout_transposes(tmp_path):
    original = _probe(tmp_path, "tc303_convnet.original", (FIX / "tc303_convnet.in.py").read_text(encoding="utf-8"),
                      _argv(FIX / "tc303_convnet.in.py"))["names"]
    names = _probe(tmp_path, "tc303_convnet", (FIX / "tc303_convnet.out.py").read_text(encoding="utf-8"),
                   _argv(FIX / "tc303_convnet.in.py"))["names"]
    transposes = [n for n in names if re.search(r"nchwToNhwc|nhwcToNchw", n)]
    assert not transposes, transposes
    assert any("nhwc" in n.lower() for n in names), [n for n in names if "conv" in n.lower()][:20]
    SUMMARY["tc303_convnet.original"]["layout_transposes"] = len(
        [n for n in original if re.search(r"nchwToNhwc|nhwcToNchw", n)])


def test_compile_default_mode_runs_inductors_triton_kernels(tmp_path):
    source = FIX / "compile_convnet.out.py"
    names = _probe(tmp_path, "compile_convnet", source.read_text(encoding="utf-8"),
                   _argv(FIX / "compile_convnet.in.py"))["names"]
    assert any(n.startswith("triton_") for n in names), names[:40]


def test_compile_reduce_overhead_replays_cuda_graphs(tmp_path):
    source = FIX / "compile_small_dcgan.out.py"
    record = _probe(tmp_path, "compile_small_dcgan", source.read_text(encoding="utf-8"),
                    _argv(FIX / "compile_small_dcgan.in.py"))
    assert record["graph_replays"] > 0, record


def test_tc411_copies_uint8_images_to_the_gpu(tmp_path):
    source = FIX / "tc411_custom_dataset.out.py"
    copies = _probe(tmp_path, "tc411_custom_dataset", source.read_text(encoding="utf-8"),
                    _argv(FIX / "tc411_custom_dataset.in.py"))["copies_4d"]
    assert copies and set(copies) == {"uint8"}, copies
