"""torch.compile(model) after moving it."""
import torch
import torch.nn as nn


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class FFNStack(nn.Module):
    def __init__(self, dim=512, hidden=1365, layers=4):
        super().__init__()
        self.layers = nn.ModuleList([SwiGLU(dim, hidden) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(self.norm(x))
        return x


device = "cuda"
model = FFNStack().to(device)
model = torch.compile(model)
x = torch.randn(16, 256, 512, device=device)
