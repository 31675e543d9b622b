"""TC308 manual-attention: the SDPA rewrite computes what the hand-written attention computed.

The differential oracle: the original and the patched module are loaded side by side, built with the
same seed, and run on the same inputs on the CPU in fp32; outputs and gradients must agree within
float tolerance (evaluation mode, and training mode with dropout 0, where both are deterministic).
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

torch = pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pair(tmp_path: Path, code: str):
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(code).lstrip(), encoding="utf-8")
    result = fix_file(original, Settings(select=("TC308",)))
    assert result.applied == ["TC308"], result.declined
    patched = tmp_path / "patched.py"
    patched.write_text(result.fixed, encoding="utf-8")
    return _load(original, "tc308_original"), _load(patched, "tc308_patched"), result.fixed


def _same_model(original, patched, build):
    torch.manual_seed(0)
    a = build(original)
    b = build(patched)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True])
def test_causal_gpt_attention_is_reproduced(training):
    original = _load(FIXTURES / "tc308_gpt.in.py", "gpt_original")
    patched = _load(FIXTURES / "tc308_gpt.out.py", "gpt_patched")
    config = original.GPTConfig(dropout=0.0)
    a, b = _same_model(original, patched, lambda module: module.GPT(config))
    a.train(training)
    b.train(training)
    idx = torch.randint(config.vocab_size, (3, 40))
    logits_a, loss_a = a(idx[:, :-1], idx[:, 1:])
    logits_b, loss_b = b(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-5, atol=1e-5)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_additive_mask_and_division_by_the_scale(tmp_path):
    original, patched, text = _pair(tmp_path, '''
        import math
        import torch

        def attention(q, k, v, mask):
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
            scores = scores + mask
            weights = scores.softmax(dim=-1)
            return torch.matmul(weights, v)
    ''')
    assert "attn_mask=mask" in text and "scale=1.0 / (math.sqrt(q.size(-1)))" in text
    q, k, v = (torch.randn(2, 4, 7, 16) for _ in range(3))
    mask = torch.randn(7, 7)
    torch.testing.assert_close(patched.attention(q, k, v, mask), original.attention(q, k, v, mask))


@pytest.mark.slow
def test_boolean_mask_keeps_the_positions_that_were_not_filled(tmp_path):
    original, patched, text = _pair(tmp_path, '''
        import torch
        import torch.nn.functional as F

        def attention(q, k, v, pad):
            att = q @ k.transpose(-2, -1) * 0.25
            att = att.masked_fill(pad, float("-inf"))
            att = F.softmax(att, dim=-1)
            return att @ v
    ''')
    assert "attn_mask=~(pad)" in text
    q, k, v = (torch.randn(2, 3, 5, 16) for _ in range(3))
    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    pad[0, ..., -2:] = True
    torch.testing.assert_close(patched.attention(q, k, v, pad), original.attention(q, k, v, pad))


def test_weights_used_elsewhere_are_declined_in_scan(tmp_path):
    from helpers import scan_code

    result = scan_code(tmp_path, '''
        import torch

        def attention(q, k, v, log):
            att = q @ k.mT
            att = torch.softmax(att, dim=-1)
            log.append(att)
            return att @ v
    ''', select=("TC308",))
    (finding,) = result.findings
    assert not finding.fix.available and "used for more than the product" in finding.fix.reason


def test_finite_fill_value_is_declined(tmp_path):
    from helpers import scan_code

    result = scan_code(tmp_path, '''
        import torch

        def attention(q, k, v, pad):
            att = q @ k.transpose(-2, -1)
            att = att.masked_fill(pad, -1e9)
            att = att.softmax(-1)
            return att @ v
    ''', select=("TC308",))
    (finding,) = result.findings
    assert not finding.fix.available and "-1e9" in finding.fix.reason


def test_reassigned_key_between_scores_and_product_is_not_matched(tmp_path):
    """Moving the scores into the final call would read the new ``k``: no finding rather than a
    wrong fix."""
    from helpers import scan_code

    result = scan_code(tmp_path, '''
        import torch

        def attention(q, k, v):
            att = q @ k.transpose(-2, -1)
            k = k * 2
            att = att.softmax(-1)
            return att @ v
    ''', select=("TC308",))
    assert result.findings == []


def test_parenthesised_tuples_do_not_break_the_analysis(tmp_path):
    """``x = (a, b) * 2`` and ``x = () + y`` once raised inside the rule (a zero-length tuple cannot
    lose its parentheses); found scanning torch itself."""
    from helpers import scan_code

    result = scan_code(tmp_path, '''
        def f(a, b, y):
            x = () + y
            z = (a, b) * 2
            return x, z
    ''', select=("TC308",))
    assert result.findings == []


# Issue 32: causal masks built in forward become is_causal=True (the flash kernel's condition).
LOCAL_ATTENTION = '''
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Attention(nn.Module):
        def __init__(self, dim=32, heads=4):
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.heads = heads

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
            {mask}
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            {use}
            att = F.softmax(att, dim=-1)
            y = att @ v
            return y.transpose(1, 2).contiguous().view(B, T, C){extra}
'''

CAUSAL_FORMS = {
    "tril_eq_0": ("mask = torch.tril(torch.ones(T, T, device=x.device))",
                  'att = att.masked_fill(mask == 0, float("-inf"))'),
    "tril_bool_invert": ("mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))",
                         'att = att.masked_fill(~mask, float("-inf"))'),
    "triu_filled": ("mask = torch.triu(torch.ones(T, T, device=x.device), diagonal=1).bool()",
                    "att = att.masked_fill(mask, -math.inf)"),
    "triu_additive": ('causal = torch.triu(torch.full((T, T), float("-inf"), device=x.device), diagonal=1)',
                      "att = att + causal"),
    "size_call": ("mask = torch.tril(torch.ones(x.size(1), x.size(1))).to(x.device)",
                  'att = att.masked_fill(mask == 0, float("-inf"))'),
}


def _attention_pair(tmp_path, mask: str, use: str, extra: str = ""):
    return _pair(tmp_path, LOCAL_ATTENTION.format(mask=mask, use=use, extra=extra))


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(CAUSAL_FORMS))
def test_a_causal_mask_built_in_forward_becomes_is_causal(tmp_path, form):
    mask, use = CAUSAL_FORMS[form]
    original, patched, text = _attention_pair(tmp_path, mask, use)
    assert "is_causal=True" in text and "attn_mask" not in text
    assert mask.split(" = ")[0] + " = " not in text  # the mask, read by nothing else, is gone
    a, b = _same_model(original, patched, lambda module: module.Attention())
    x = torch.randn(2, 7, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out_a, out_b = a(x), b(x2)
    torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-6)
    out_a.sum().backward()
    out_b.sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-6)


def test_a_mask_read_elsewhere_stays_and_is_causal_is_used(tmp_path):
    mask, use = CAUSAL_FORMS["tril_eq_0"]
    _, _, text = _attention_pair(tmp_path, mask, use, extra="\n            self.last_mask = mask")
    assert "is_causal=True" in text and "mask = torch.tril(torch.ones(T, T, device=x.device))" in text


@pytest.mark.parametrize("mask, use", [
    # a literal size: a 1 x 1 or 8 x 8 mask need not be the scores' T x T
    ("mask = torch.tril(torch.ones(8, 8))", 'att = att.masked_fill(mask == 0, float("-inf"))'),
    # another diagonal: not the causal mask
    ("mask = torch.tril(torch.ones(T, T), diagonal=-1)", 'att = att.masked_fill(mask == 0, float("-inf"))'),
    ("mask = torch.triu(torch.ones(T, T))", 'att = att.masked_fill(mask.bool(), float("-inf"))'),
    # rectangular, or sizes not read from a shape
    ("mask = torch.tril(torch.ones(T, T + 1))", 'att = att.masked_fill(mask == 0, float("-inf"))'),
    ("mask = torch.tril(torch.ones(n, n))", 'att = att.masked_fill(mask == 0, float("-inf"))'),
    # the wrong polarity: tril filled where set masks the past, not the future
    ("mask = torch.tril(torch.ones(T, T)).bool()", 'att = att.masked_fill(mask, float("-inf"))'),
])
def test_other_masks_stay_an_attn_mask(tmp_path, mask, use):
    code = LOCAL_ATTENTION.replace("B, T, C = x.size()", "B, T, C = x.size()\n            n = 8")
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(code.format(mask=mask, use=use, extra="")).lstrip(), encoding="utf-8")
    result = fix_file(original, Settings(select=("TC308",)))
    assert result.applied == ["TC308"], result.declined
    assert "is_causal" not in result.fixed and "attn_mask=" in result.fixed
    assert mask in result.fixed
