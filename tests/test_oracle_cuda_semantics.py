"""The CUDA-semantics shim (tests/oracle/shim/sitecustomize.py) makes the CPU fail where CUDA fails, so
the oracle catches the field failure classes F1 (unscale_ in the wrong place), F2 (BCE under
autocast) and F7 (an on-device random factory draws from another generator). Each naive patch below
is written by hand the way the field's fixes wrote it: plain CPU runs cannot tell it from the
original, CUDA semantics can; each correct version passes under both."""

from __future__ import annotations

import textwrap

import pytest

from oracle.harness import ScriptRun, max_relative_difference, run_scripts

pytestmark = pytest.mark.slow

F1_ORIGINAL = '''
import argparse
import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
parser.add_argument("--clip", type=float, default=0.0)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler(device, enabled=device == "cuda") if args.amp else None
for step in range(6):
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    opt.zero_grad()
    with torch.autocast(device_type=device, dtype=torch.float16, enabled=args.amp and device == "cuda"):
        loss = F.mse_loss(model(x.to(device)), y.to(device))
    if args.amp:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    if args.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    print("loss", loss.item())
'''
# The field's patch: unscale_ inserted before the clip, which comes after the step in neither branch.
F1_NAIVE = F1_ORIGINAL.replace(
    "    if args.clip > 0:\n", "    if args.clip > 0:\n        scaler.unscale_(opt)\n"
)
# Correct AMP clipping (clip before the step, unscale_ first, in the AMP branch) as a control.
F1_CORRECT_REFERENCE = F1_ORIGINAL.replace(
    "        scaler.scale(loss).backward()\n        scaler.step(opt)\n",
    "        scaler.scale(loss).backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n        scaler.step(opt)\n",
)
F1_CORRECT = F1_ORIGINAL.replace(
    "        scaler.scale(loss).backward()\n        scaler.step(opt)\n",
    "        scaler.scale(loss).backward()\n        scaler.unscale_(opt)\n"
    "        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)\n        scaler.step(opt)\n",
)

F2_ORIGINAL = '''
import torch
import torch.nn.functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(16, 1).to(device)
criterion = torch.nn.BCELoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def compute_loss(logits, y):
    return F.binary_cross_entropy(torch.sigmoid(logits), y) + criterion(torch.sigmoid(logits), y)


for step in range(3):
    x, y = torch.randn(8, 16, device=device), torch.rand(8, 1, device=device).round()
    loss = compute_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''
# The field's patch: TC201 wraps the helper's call in CUDA autocast (TC208 had declined the helper).
F2_NAIVE = F2_ORIGINAL.replace(
    "    loss = compute_loss(model(x), y)\n",
    '    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):\n'
    "        loss = compute_loss(model(x), y)\n",
)
# Forward under autocast, the loss outside it: what a correct fix does.
F2_CORRECT = F2_ORIGINAL.replace(
    "    loss = compute_loss(model(x), y)\n",
    '    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):\n'
    "        logits = model(x)\n"
    "    loss = compute_loss(logits.float(), y)\n",
)

F7_ORIGINAL = '''
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
data = torch.arange(32.0)
perm = torch.randperm(len(data)).to(device)
model = torch.nn.Linear(1, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
for i in range(4):
    batch = data.to(device)[perm[i * 8:(i + 1) * 8]].unsqueeze(1)
    loss = (model(batch) - 2 * batch).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''
F7_NAIVE = F7_ORIGINAL.replace("torch.randperm(len(data)).to(device)", "torch.randperm(len(data), device=device)")

# AMP behind a flag: the autocast counts as on only when the flag is (``enabled=`` is replayed with
# the CUDA tests taken as true), so the plain path of a flag-guarded script is not a false alarm.
F2_FLAG = F2_NAIVE.replace('enabled=device == "cuda"', 'enabled=AMP and device == "cuda"').replace(
    "import torch\n", "import sys\nimport torch\n\nAMP = '--amp' in sys.argv\n", 1
)

SCRIPTS = {
    "f2_flag_off": (F2_FLAG, ()),
    "f2_flag_on": (F2_FLAG, ("--amp",)),
    "f1_original": (F1_ORIGINAL, ("--amp", "--clip", "1.0")),
    "f1_naive": (F1_NAIVE, ("--amp", "--clip", "1.0")),
    "f1_naive_no_amp": (F1_NAIVE, ("--clip", "1.0")),
    "f1_correct_reference": (F1_CORRECT_REFERENCE, ("--amp",)),
    "f1_correct": (F1_CORRECT, ("--amp",)),
    "f2_original": (F2_ORIGINAL, ()),
    "f2_naive": (F2_NAIVE, ()),
    "f2_correct": (F2_CORRECT, ()),
    "f7_original": (F7_ORIGINAL, ()),
    "f7_naive": (F7_NAIVE, ()),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every script in plain CPU mode, and under CUDA semantics with the scalers real and off."""
    jobs = []
    for name, (text, argv) in SCRIPTS.items():
        text = textwrap.dedent(text).lstrip()
        for mode, scaler in (("cpu", "real"), ("cuda", "real"), ("cuda", "off")):
            env = (("TCAUDIT_ORACLE_MODE", mode), ("TCAUDIT_ORACLE_SCALER", scaler))
            jobs.append(ScriptRun(f"{name}-{mode}-{scaler}", text, argv, env))
    return run_scripts(jobs, tmp_path_factory.mktemp("cuda_semantics"))


def _diff(runs, a: str, b: str) -> float:
    assert runs[a].rc == 0, runs[a].explain()
    assert runs[b].rc == 0, runs[b].explain()
    return max_relative_difference(runs[a].losses, runs[b].losses)


def test_f1_naive_unscale_is_invisible_on_plain_cpu(runs):
    """Why the shim exists: with the scaler disabled on CPU, unscale_ is a no-op."""
    assert _diff(runs, "f1_original-cpu-real", "f1_naive-cpu-real") == 0.0


def test_f1_naive_unscale_diverges_under_cuda_semantics(runs):
    """unscale_ after step()/update() marks the next step's gradients as unscaled: they are applied
    still multiplied by 65536 (the field saw weights x1e6 in four steps)."""
    assert runs["f1_naive-cuda-real"].rc == 0, runs["f1_naive-cuda-real"].explain()
    assert _diff(runs, "f1_original-cuda-off", "f1_naive-cuda-real") > 0.5
    assert max(runs["f1_naive-cuda-real"].losses) > 1e3 * max(runs["f1_original-cuda-off"].losses)


def test_f1_naive_unscale_without_amp_crashes_in_every_mode(runs):
    for mode in ("cpu-real", "cuda-real"):
        run = runs[f"f1_naive_no_amp-{mode}"]
        assert run.rc != 0 and "'NoneType' object has no attribute 'unscale_'" in run.stderr


def test_correct_amp_clipping_is_exact_under_a_real_scaler(runs):
    """The control: unscale_ before the clip, in the AMP branch, computes what the unscaled math does."""
    assert _diff(runs, "f1_correct-cuda-off", "f1_correct-cuda-real") <= 1e-6
    # and clipping scaled gradients without unscale_ does not: the clip sees gradients x65536
    assert _diff(runs, "f1_correct_reference-cuda-off", "f1_correct_reference-cuda-real") > 1e-3


def test_f2_bce_under_cuda_autocast_runs_on_plain_cpu(runs):
    assert _diff(runs, "f2_original-cpu-real", "f2_naive-cpu-real") == 0.0


def test_f2_bce_under_cuda_autocast_raises_under_cuda_semantics(runs):
    run = runs["f2_naive-cuda-real"]
    assert run.rc != 0
    assert "RuntimeError" in run.stderr and "unsafe to autocast" in run.stderr
    assert runs["f2_original-cuda-real"].rc == 0  # BCE without autocast is fine


def test_f2_loss_outside_autocast_is_fine_under_cuda_semantics(runs):
    # the autocast stays virtual (fp32 on the CPU), so the values are the original's
    assert _diff(runs, "f2_original-cuda-real", "f2_correct-cuda-real") <= 1e-6


def test_f7_device_factory_keeps_values_on_cpu_only(runs):
    assert _diff(runs, "f7_original-cpu-real", "f7_naive-cpu-real") == 0.0
    assert _diff(runs, "f7_original-cuda-real", "f7_naive-cuda-real") > 1e-3


def test_shim_exposes_the_known_bad_fixture_originals(tmp_path):
    """The fixtures whose originals are broken on the GPU are broken under CUDA semantics too: TC208's
    BCE under autocast raises, TC205's clip on scaled gradients computes other values."""
    from oracle.cases import FIX_FIXTURES

    jobs = []
    for name in ("tc208_bce", "tc205_clip"):
        text = (FIX_FIXTURES / f"{name}.in.py").read_text()
        for scaler in ("real", "off"):
            jobs.append(ScriptRun(f"{name}-{scaler}", text, (), (("TCAUDIT_ORACLE_MODE", "cuda"), ("TCAUDIT_ORACLE_SCALER", scaler))))
    runs = run_scripts(jobs, tmp_path)
    assert runs["tc208_bce-real"].rc != 0 and "unsafe to autocast" in runs["tc208_bce-real"].stderr
    assert _diff(runs, "tc205_clip-off", "tc205_clip-real") > 1e-3


def test_an_amp_flag_decides_whether_autocast_counts_as_on(runs):
    assert runs["f2_flag_off-cuda-real"].rc == 0, runs["f2_flag_off-cuda-real"].explain()
    assert runs["f2_flag_on-cuda-real"].rc != 0 and "unsafe to autocast" in runs["f2_flag_on-cuda-real"].stderr
