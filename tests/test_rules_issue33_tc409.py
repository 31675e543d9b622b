"""Issue 33: TC409 d2h-non-blocking-read.

A copy to the host with ``non_blocking=True`` read before any sync: positive shapes, near misses
(syncs of every kind, copies to the GPU, devices that may be a GPU, results never read), the exact
fixed text (compiled, and run on CPU), and the declined fixes with their reasons."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.fix.engine import fix_file

RULE = "TC409"
HEAD = "import torch\nimport numpy as np\nmodel = Net().cuda()\n"


def _hits(tmp_path, code):
    return [f for f in scan_code(tmp_path, code, select=(RULE,)).findings if f.rule == RULE]


def _fixed(tmp_path, code) -> str:
    path = tmp_path / "fixme.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    result = fix_file(path, Settings(select=(RULE,)))
    assert result.error is None
    compile(result.fixed, str(path), "exec")
    return result.fixed


# -- reported ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    'h = model(x).to("cpu", non_blocking=True)\na = h.numpy()\n',
    'h = model(x).to(device="cpu", non_blocking=True)\na = h.tolist()\n',
    'h = model(x).to("cpu:0", non_blocking=True)\na = h[0].item()\n',
    'h = model(x).to(torch.device("cpu"), non_blocking=True)\na = float(h.sum())\n',
    'h = model(x).to("cpu", torch.float32, non_blocking=True)\nprint(h)\n',
    'h = model(x).to("cpu", non_blocking=True)\nnp.save("out.npy", h)\n',
    'h = model(x).to("cpu", non_blocking=True)\ntorch.save(h, "out.pt")\n',
    'h = model(x).to("cpu", non_blocking=True)\nlog = "%s" % h\n',
    'h = model(x).to("cpu", non_blocking=True)\nlog = "{}".format(h.T)\n',
    'h = model(x).argmax().to("cpu", non_blocking=True)\nclasses = ["a", "b"]\nname = classes[h]\n',
    'h = model(x).to("cpu", non_blocking=True)\nassert h.min() >= 0\n',
    'h = model(x).to("cpu", non_blocking=True)\nwhile h[0] > 0:\n    break\n',
    'h = model(x).to("cpu", non_blocking=True)\nok = [v for v in range(3) if h[v] > 0]\n',
    'a = model(x).to("cpu", non_blocking=True).numpy()\n',
    'print(model(x).to("cpu", non_blocking=True))\n',
    'h, g = model(x).to("cpu", non_blocking=True), 1\nprint(h.tolist())\n',
    'buf = torch.empty(8, pin_memory=True)\nbuf.copy_(model(x), non_blocking=True)\nprint(buf.tolist())\n',
    'buf = torch.zeros(8, device="cpu")\nbuf[:4].copy_(model(x)[:4], non_blocking=True)\nv = buf[0].item()\n',
    'buf = model(x).cpu().pin_memory()\nbuf.copy_(model(x), non_blocking=True)\nv = buf.numpy()\n',
    'kw = dict(non_blocking=True)\nh = model(x).to("cpu", **kw)\nv = h.numpy()\n',
    'NB = True\nh = model(x).to("cpu", non_blocking=NB)\nv = h.numpy()\n',
])
def test_flags_a_host_read_before_any_sync(tmp_path, body):
    [hit] = _hits(tmp_path, HEAD + body)
    assert hit.severity is Severity.ERROR
    assert hit.fix.fix_class is FixClass.NUMERICS
    assert len(hit.message) <= 120 and "before any sync" in hit.message
    assert "synchronize" in hit.explanation


def test_a_read_in_a_branch_or_after_the_loop_is_reported(tmp_path):
    code = """
    import torch

    def run(model, loader, step):
        for x in loader:
            host = model(x.cuda()).to("cpu", non_blocking=True)
            if step % 10 == 0:
                print(f"{host.mean():.3f}")
        for x in loader:
            last = model(x.cuda()).to("cpu", non_blocking=True)
        return last.tolist()
    """
    assert [f.details["read_line"] for f in _hits(tmp_path, code)] == [7, 10]


def test_the_message_names_the_read_and_its_line(tmp_path):
    [hit] = _hits(tmp_path, HEAD + 'h = model(x).to("cpu", non_blocking=True)\nz = 1\nv = h.numpy()\n')
    assert hit.message == "non-blocking copy to the host is read by `.numpy()` (line 6) before any sync: values may be stale"
    assert hit.location.line == 4


# -- not reported -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    # synchronized before the read
    'h = model(x).to("cpu", non_blocking=True)\ntorch.cuda.synchronize()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\ntorch.cuda.current_stream().synchronize()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\ne = torch.cuda.Event()\ne.record()\ne.synchronize()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\ndone.wait()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nwhile not done.query():\n    pass\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nloss = model(x).sum().item()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nother = model(x).cpu()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nother = model(x).to("cpu")\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\ntorch.distributed.barrier()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nif flag:\n    torch.cuda.synchronize()\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nprint(loss.item(), h.numpy())\n',
    # never read on the host, or only metadata, or sent back to the GPU
    'h = model(x).to("cpu", non_blocking=True)\nresults.append(h)\n',
    'h = model(x).to("cpu", non_blocking=True)\nprint(h.shape, h.dtype, h.size(0), len(h))\n',
    'h = model(x).to("cpu", non_blocking=True)\ny = model(h.cuda())\nprint(y.cuda().sum())\n',
    'h = model(x).to("cpu", non_blocking=True)\nif h is None:\n    pass\n',
    # the name rebound, or the function left, before the read
    'h = model(x).to("cpu", non_blocking=True)\nh = torch.zeros(3)\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nfn = lambda: h.numpy()\n',
    # flags that are not True
    'h = model(x).to("cpu", non_blocking=False)\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=args.non_blocking)\nv = h.numpy()\n',
    'h = model(x).to("cpu")\nv = h.numpy()\n',
    # targets that may be a GPU, and sources already on the host
    'h = model(x).to(device, non_blocking=True)\nv = h.sum().item()\n',
    'h = model(x).to(args.device, non_blocking=True)\nv = h.sum().item()\n',
    'h = model(x).cuda(non_blocking=True)\nv = h.sum().item()\n',
    'h = torch.randn(3).to("cpu", non_blocking=True)\nv = h.numpy()\n',
    'buf = torch.empty(8, device="cuda")\nbuf.copy_(h2, non_blocking=True)\nv = buf.sum().item()\n',
    'buf = torch.empty_like(model(x))\nbuf.copy_(model(x), non_blocking=True)\nv = buf.tolist()\n',
    'buf = torch.empty(8, pin_memory=True)\nbuf.copy_(torch.randn(8), non_blocking=True)\nv = buf.tolist()\n',
    # a flag by position is not looked for; a blocking copy by position is a sync
    'h = model(x).to("cpu", None, True)\nv = h.numpy()\n',
    'h = model(x).to("cpu", non_blocking=True)\nother = model(x).to("cpu", None, False)\nv = h.numpy()\n',
    # Tensor.cpu() takes no non_blocking: a TypeError, not a silent read
    'h = model(x).cpu(non_blocking=True)\nv = h.numpy()\n',
])
def test_near_misses_stay_silent(tmp_path, body):
    assert _hits(tmp_path, HEAD + body) == []


def test_a_device_that_is_a_parameter_is_not_the_host(tmp_path):
    code = """
    import torch
    device = "cpu"

    def fetch(model, x, device):
        h = model(x.cuda()).to(device, non_blocking=True)
        return h.numpy()
    """
    assert _hits(tmp_path, code) == []


def test_a_helper_that_synchronizes_is_a_sync(tmp_path):
    code = """
    import torch

    def wait():
        torch.cuda.synchronize()

    def fetch(model, x):
        h = model(x.cuda()).to("cpu", non_blocking=True)
        wait()
        return h.numpy()
    """
    assert _hits(tmp_path, code) == []


def test_a_read_in_the_next_iteration_after_a_sync_is_fine(tmp_path):
    code = """
    import torch

    def run(model, loader):
        host = None
        for x in loader:
            if host is not None:
                torch.cuda.synchronize()
                print(host.tolist())
            host = model(x.cuda()).to("cpu", non_blocking=True)
    """
    assert _hits(tmp_path, code) == []


def test_cpu_only_scripts_and_files_without_torch_are_silent(tmp_path):
    assert _hits(tmp_path, "import torch\nh = net(x).to('cpu', non_blocking=True)\nprint(h.numpy())\n") == []
    assert _hits(tmp_path, "h = net(x.cuda()).to('cpu', non_blocking=True)\nprint(h.numpy())\n") == []


# -- the fix ----------------------------------------------------------------------------------------


def test_fix_output_exactly(tmp_path):
    code = """
    import torch

    def collect(model, x, buf):
        a = model(x.cuda()).to("cpu", non_blocking=True)
        b = model(x.cuda()).to(
            "cpu",
            non_blocking=True,
        )
        c = model(x.cuda()).to("cpu", non_blocking=True, copy=True)
        pinned = torch.empty(4, pin_memory=True)
        pinned.copy_(model(x.cuda()), non_blocking=True)
        return a.numpy(), b.numpy(), c.numpy(), pinned.tolist()
    """
    assert _fixed(tmp_path, code) == textwrap.dedent("""
    import torch

    def collect(model, x, buf):
        a = model(x.cuda()).to("cpu")
        b = model(x.cuda()).to(
            "cpu",
        )
        c = model(x.cuda()).to("cpu", copy=True)
        pinned = torch.empty(4, pin_memory=True)
        pinned.copy_(model(x.cuda()))
        return a.numpy(), b.numpy(), c.numpy(), pinned.tolist()
    """).lstrip("\n")


@pytest.mark.parametrize(("body", "reason"), [
    ('kw = {"non_blocking": True}\nh = model(x).to("cpu", **kw)\nv = h.numpy()\n', "comes from a **kwargs dict"),
    ('NB = True\nh = model(x).to("cpu", non_blocking=NB)\nv = h.numpy()\n', "non_blocking is `NB`, not a literal"),
])
def test_declined_fixes_say_why(tmp_path, body, reason):
    [hit] = _hits(tmp_path, HEAD + body)
    assert not hit.fix.available and reason in hit.fix.reason
    assert _fixed(tmp_path, HEAD + body) == HEAD + body


def test_fixed_script_runs_on_cpu_and_reads_the_result(tmp_path):
    code = """
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 3).to(device)
    x = torch.ones(2, 4, device=device)
    with torch.no_grad():
        expected = model(x).argmax(dim=1).tolist()
        preds = model(x).argmax(dim=1).to("cpu", non_blocking=True)
        assert preds.tolist() == expected
    print("ok", preds.tolist())
    """
    assert len(_hits(tmp_path, code)) == 1
    fixed = _fixed(tmp_path, code)
    assert 'preds = model(x).argmax(dim=1).to("cpu")\n' in fixed
    script = tmp_path / "fixed.py"
    script.write_text(fixed, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok ")


def test_tc601_reads_the_same_sync_names_from_the_shared_module():
    from tcaudit.rules.loop import tc601_per_step_sync
    from tcaudit.script import host_sync

    assert tc601_per_step_sync.SYNCHRONIZE is host_sync.SYNCHRONIZE
    assert tc601_per_step_sync.SYNC_METHODS == ("item", "cpu", "numpy", "tolist")
