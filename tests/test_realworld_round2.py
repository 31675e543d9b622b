"""What the second round of real-world-shaped scripts (fixtures/fix/all_rw_ddp_torchrun,
all_rw_accum_no_sync, all_rw_lightning_free_trainer, all_rw_rl_ppo, all_rw_keras_style_fit) found,
each pinned on a minimal script of the same shape."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file


def _fix(tmp_path: Path, code: str, **settings) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code))
    result = fix_file(path, Settings(**settings))
    assert result.error is None
    return result.fixed


def _finding(tmp_path: Path, code: str, rule: str, **settings):
    result = scan_code(tmp_path, textwrap.dedent(code), select=(rule,), **settings)
    found = [f for f in result.findings if f.rule == rule]
    assert len(found) == 1, [f.message for f in result.findings]
    return found[0]


# CleanRL's shape: everything under the main guard, `device` bound there, the agent called through methods.
PPO = """
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Linear(4, 3)
        self.critic = nn.Linear(4, 1)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)

if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    agent = Agent().to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    obs = torch.randn(32, 4).to(device)
    old_logprob = torch.zeros(32).to(device)
    for epoch in range(4):
        _, newlogprob, entropy, value = agent.get_action_and_value(obs)
        ratio = (newlogprob - old_logprob).exp()
        loss = -(ratio * value.detach().squeeze()).mean() - 0.01 * entropy.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_tc201_declines_a_policy_gradient_loss_built_from_log_probabilities(tmp_path):
    finding = _finding(tmp_path, PPO, "TC201", exec_models=False)
    assert not finding.fix.available
    assert "torch.distributions" in finding.fix.reason and "log_prob" in finding.fix.reason
    assert "autocast" not in _fix(tmp_path, PPO, select=("TC201",), exec_models=False)


def test_tc201_still_wraps_the_same_loop_without_log_probabilities(tmp_path):
    """The decline is about log-probabilities, not about module-level steps under the main guard:
    without them the wrap is made, and its device is the script's `device` bound under the guard."""
    code = PPO.replace("probs.log_prob(action)", "probs.logits.sum(-1)").replace(
        "probs = Categorical(logits=self.actor(x))", "probs = self").replace(
        "action = probs.sample()", "action = x").replace("probs.entropy()", "x.sum(-1)").replace(
        "from torch.distributions.categorical import Categorical\n", "").replace(
        "probs.logits.sum(-1)", "self.actor(x).sum(-1)")
    fixed = _fix(tmp_path, code, select=("TC201",), exec_models=False)
    assert 'with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):' in fixed


def test_tc201_does_not_take_the_main_guard_for_a_cuda_flag(tmp_path):
    """Every `.cuda()` of a module-level script runs under `if __name__ == "__main__":`; that test says
    nothing about the device and must not become autocast's `enabled=`."""
    code = """
    import torch
    import torch.nn as nn

    if __name__ == "__main__":
        model = nn.Linear(64, 64).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(32, 64).cuda()
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
    fixed = _fix(tmp_path, code, select=("TC201",), exec_models=False)
    assert "torch.autocast(" in fixed
    assert "__name__ ==" not in fixed.split("torch.autocast(", 1)[1].split("\n", 1)[0]


def test_tc305_declines_a_model_without_forward(tmp_path):
    """`agent.compile()` compiles `forward`; an agent called only through `get_action_and_value` would
    stay eager while the report says it is compiled."""
    finding = _finding(tmp_path, PPO, "TC305", exec_models=False, structural_fixes=("compile",))
    assert not finding.fix.available
    assert "defines no `forward`" in finding.fix.reason
    fixed = _fix(tmp_path, PPO, select=("TC305",), structural_fixes=("compile",), exec_models=False)
    assert ".compile()" not in fixed


def test_tc305_still_compiles_a_model_whose_base_class_of_this_file_has_forward(tmp_path):
    code = PPO.replace("class Agent(nn.Module):", "class Base(nn.Module):\n    def forward(self, x):\n"
                       "        return self.critic(x)\n\nclass Agent(Base):")
    finding = _finding(tmp_path, code, "TC305", exec_models=False, structural_fixes=("compile",))
    assert finding.fix.available
