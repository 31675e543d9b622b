"""TC201 on a gradient penalty (WGAN-GP): ``autograd.grad(..., create_graph=True)`` computes the
penalty's gradients from the unscaled critic output, so a GradScaler alone does not cover it (fp16
would need the AMP recipe: scale the outputs, unscale the gradients). The fix picks bf16, no scaler,
even for a convolutional critic (where fp16 + GradScaler is otherwise the choice) and under
``precision = fp16``."""

from __future__ import annotations

import textwrap

import pytest

from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

WGAN_GP = """
import torch
import torch.nn as nn
from torch import autograd

critic = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten(), nn.LazyLinear(1)).cuda()
generator = nn.Sequential(nn.Linear(128, 3 * 32 * 32), nn.Tanh()).cuda()
opt_d = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.999))


def gradient_penalty(real, fake):
    alpha = torch.rand(real.size(0), 1, 1, 1, device=real.device)
    mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(mixed)
    grads = autograd.grad(outputs=out, inputs=mixed, grad_outputs=torch.ones_like(out), create_graph={create_graph})[0]
    return ((grads.view(grads.size(0), -1).norm(2, dim=1) - 1) ** 2).mean()


for real in loader:
    real = real.cuda()
    fake = generator(torch.randn(real.size(0), 128, device="cuda")).view(-1, 3, 32, 32)
    d_loss = critic(fake.detach()).mean() - critic(real).mean() + 10 * gradient_penalty(real, fake.detach())
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
"""


def _fixed(tmp_path, create_graph: str, precision: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(WGAN_GP).replace("{create_graph}", create_graph))
    result = fix_file(path, Settings(select=("TC201",), precision=precision))
    assert result.error is None and result.applied == ["TC201"]
    return result.fixed


@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_gradient_penalty_gets_bf16_without_a_scaler(tmp_path, precision):
    fixed = _fixed(tmp_path, "True", precision)
    assert "dtype=torch.bfloat16" in fixed
    assert "GradScaler" not in fixed and "scaler." not in fixed


def test_a_plain_autograd_grad_keeps_the_convnet_choice(tmp_path):
    """Without create_graph there is no second backward through the penalty: the convnet's fp16 +
    GradScaler stays the choice."""
    fixed = _fixed(tmp_path, "False", "auto")
    assert "dtype=torch.float16" in fixed and "GradScaler" in fixed
