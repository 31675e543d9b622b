"""TC319 mha-causal-hint: ``is_causal=True`` added where an nn.MultiheadAttention call is given the
causal mask; the patched module computes what the original computed (CPU, fp32, outputs and
gradients), and the hint is reported together with TC314 where that rule's fix passes
``need_weights=False`` first."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

BLOCK = '''
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        B, T, C = x.shape
        {mask}
        y, _ = self.attn(x, x, x, attn_mask=mask)
        return y
'''

MASKS = {
    "subsequent": "mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device)",
    "triu_full": 'mask = torch.triu(torch.full((T, T), float("-inf"), device=x.device), diagonal=1)',
    "triu_bool": "mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)",
}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("form", sorted(MASKS))
def test_the_hint_keeps_the_attention(tmp_path, form):
    torch = pytest.importorskip("torch")
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(BLOCK.format(mask=MASKS[form])).lstrip())
    result = fix_file(original, Settings(select=("TC314", "TC319")))
    assert sorted(result.applied) == ["TC314", "TC319"], result.declined
    assert "y, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)" in result.fixed
    patched = tmp_path / "patched.py"
    patched.write_text(result.fixed)
    a_module, b_module = _load(original, f"tc319_a_{form}"), _load(patched, f"tc319_b_{form}")
    torch.manual_seed(0)
    a = a_module.Block()
    b = b_module.Block()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 9, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out_a, out_b = a(x), b(x2)
    torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-6)
    out_a.sum().backward()
    out_b.sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-6)


def test_scan_reports_the_hint_beside_tc314(tmp_path):
    (tmp_path / "block.py").write_text(textwrap.dedent(BLOCK.format(mask=MASKS["subsequent"])).lstrip())
    code, out, err = run_cli("scan", "block.py", "--no-exec", "--select", "TC314,TC319", "--format", "json",
                             cwd=tmp_path)
    import json

    assert sorted(f["rule"] for f in json.loads(out)["findings"]) == ["TC314", "TC319"], err


@pytest.mark.parametrize("mask", [
    "mask = torch.triu(torch.ones(T, T, device=x.device), diagonal=1)",  # float ones: added, not causal
    "mask = nn.Transformer.generate_square_subsequent_mask(16, device=x.device)",  # a literal size
    'mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=0)',  # another diagonal
    'mask = torch.tril(torch.ones(T, T, dtype=torch.bool))',  # the wrong polarity for MHA
])
def test_other_masks_get_no_hint(tmp_path, mask):
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(BLOCK.format(mask=mask)).lstrip())
    result = fix_file(original, Settings(select=("TC314", "TC319")))
    assert result.applied == ["TC314"] and "is_causal" not in result.fixed
