"""A Trainer class builds self.model from its config in __init__."""
import torch
import torch.nn as nn


class Policy(nn.Module):
    def __init__(self, obs=17, act=6, hidden=256):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, act))
        self.v = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs):
        return self.pi(obs), self.v(obs)


class PPOTrainer:
    def __init__(self, obs_dim=17, act_dim=6, device="cuda"):
        self.device = torch.device(device)
        self.model = Policy(obs_dim, act_dim).to(self.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-4)

    def update(self, batch):
        logits, value = self.model(batch.to(self.device))
        (logits.sum() + value.sum()).backward()
        self.opt.step()


if __name__ == "__main__":
    trainer = PPOTrainer()
    trainer.update(torch.randn(2048, 17))
