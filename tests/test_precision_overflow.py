"""Issue 30 (3): the precision TC201's fix chooses can never overflow. A fill beyond fp16's range
(``masked_fill(mask, -1e9)``, ``torch.finfo(torch.float32).min``) makes it bf16 whatever the setting or
the GPU; a Transformer whose feed-forward is a 1x1 ``Conv1d``, or any script with attention, is not a
convnet for the text fallback. The real-autocast run of the oracle (tests/test_oracle.py, AMP mode)
trains fixtures/fix/tc201_fp16_overflow_transformer under a real CPU fp16/bf16 autocast."""

from __future__ import annotations

import pytest

from helpers import scan_code

LOOP = """
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in [(torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,)))]:
    x, y = x.to(device), y.to(device)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
HEAD = """
import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
"""


def _plan(tmp_path, model: str, **settings):
    result = scan_code(tmp_path, HEAD + model + LOOP, select=("TC201",), **settings)
    [finding] = result.findings
    return finding.fix.plan, finding.explanation


CONVNET = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        logits = self.fc(self.conv(x).mean((2, 3)))
        return logits.masked_fill(logits.isnan(), {fill})
"""


def test_a_convnet_keeps_fp16_when_its_fills_fit(tmp_path):
    plan, _ = _plan(tmp_path, CONVNET.format(fill="float('-inf')"))
    assert (plan.dtype, plan.scaler) == ("float16", True)


@pytest.mark.parametrize("fill", ["-1e9", "-1e5", "NEG", "torch.finfo(torch.float32).min", "-torch.finfo(torch.float).max"])
def test_a_fill_beyond_fp16s_range_makes_a_convnet_bf16(tmp_path, fill):
    model = ("NEG = -2 ** 20\n" if fill == "NEG" else "") + CONVNET.format(fill=fill)
    plan, explanation = _plan(tmp_path, model)
    assert (plan.dtype, plan.scaler) == ("bfloat16", False)
    assert "beyond fp16's range (±65,504)" in explanation and "`masked_fill` fills" in explanation


def test_the_overflow_wins_over_the_configuration_and_the_gpu(tmp_path):
    model = CONVNET.format(fill="-1e9")
    plan, _ = _plan(tmp_path, model, precision="fp16")
    assert plan.dtype == "bfloat16"
    plan, explanation = _plan(tmp_path, model, gpu="v100")
    assert plan.dtype == "bfloat16"
    assert "V100" in explanation and "no bf16 Tensor Cores" in explanation


def test_a_finfo_of_half_is_inside_the_range(tmp_path):
    plan, _ = _plan(tmp_path, CONVNET.format(fill="torch.finfo(torch.float16).min"))
    assert plan.dtype == "float16"


CONV1D_TRANSFORMER = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 16)
        self.ff = nn.Sequential(nn.Conv1d(16, 64, kernel_size=1), nn.ReLU(), nn.Conv1d(64, 16, 1))
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.embed(x.flatten(2).transpose(1, 2))
        weights = torch.softmax(h @ h.transpose(1, 2), dim=-1)
        h = weights @ h
        return self.fc(self.ff(h.transpose(1, 2)).mean(2))
"""


def test_a_pointwise_conv1d_transformer_is_not_a_convnet(tmp_path):
    plan, explanation = _plan(tmp_path, CONV1D_TRANSFORMER)
    assert (plan.dtype, plan.scaler) == ("bfloat16", False)
    assert "bf16 keeps fp32's range" in explanation


def test_attention_makes_a_conv_script_bf16(tmp_path):
    """A convnet stem feeding nn.MultiheadAttention (a hybrid) gets bf16: attention scores overflow fp16."""
    model = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.conv(x).flatten(2).transpose(1, 2)
        return self.fc(self.attn(h, h, h)[0].mean(1))
"""
    plan, _ = _plan(tmp_path, model)
    assert plan.dtype == "bfloat16"


def test_a_wide_conv1d_is_still_a_convolution(tmp_path):
    model = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 16, kernel_size=5)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.conv(x.flatten(2)).mean(2))
"""
    plan, _ = _plan(tmp_path, model)
    assert plan.dtype == "float16"
