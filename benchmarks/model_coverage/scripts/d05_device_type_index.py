"""torch.device("cuda", 0) with a local rank style variable."""
import os

import torch
import torch.nn as nn

local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device("cuda", local_rank)


class Regressor(nn.Module):
    def __init__(self, features=13, hidden=100):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(self.body(x))


model = Regressor()
model = model.to(device)
opt = torch.optim.Adam(model.parameters())
for _ in range(100):
    x = torch.randn(256, 13, device=device)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
