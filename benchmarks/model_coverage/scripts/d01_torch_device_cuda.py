"""MLP on random data; device = torch.device("cuda") then model.to(device)."""
import torch
import torch.nn as nn

device = torch.device("cuda")


class MLP(nn.Module):
    def __init__(self, d_in=784, hidden=1000, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x.flatten(1))


model = MLP().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    x = torch.randn(64, 784, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
