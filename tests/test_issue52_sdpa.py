"""Issue 52, item 2 on the CPU: TC308's rewrite of one head's 3-D (B, T, hs) attention (the char-level GPT's
per-head ``Head``) hands SDPA 4-D (B, 1, T, hs) tensors, which its flash and memory-efficient kernels need,
and computes what the hand-written attention computed; the GPU suite (tests/test_gpu_fastpath.py) checks
the kernel it then runs."""

from __future__ import annotations

import runpy

import pytest

from conftest import FIXTURES

torch = pytest.importorskip("torch")

IN = FIXTURES / "fix" / "tc308_head_3d.in.py"
OUT = FIXTURES / "fix" / "tc308_head_3d.out.py"


def _head(path, monkeypatch):
    """The script's ``Head`` class (running the module-level loop of the fixture's 3 steps on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return runpy.run_path(str(path), run_name="fixture")["Head"]


def test_the_3d_head_gets_4d_input_and_the_same_output(monkeypatch):
    manual, fused = _head(IN, monkeypatch), _head(OUT, monkeypatch)
    torch.manual_seed(0)
    a = manual(16).eval()
    b = fused(16).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 32, 64)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        seen.append((q.dim(), k.dim(), v.dim()))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        expected, got = a(x), b(x)
    assert seen == [(4, 4, 4)]
    assert got.shape == expected.shape == (4, 32, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
