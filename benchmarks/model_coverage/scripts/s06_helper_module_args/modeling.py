import torch.nn as nn


class Tower(nn.Module):
    def __init__(self, features, hidden, layers):
        super().__init__()
        dims = [features] + [hidden] * layers
        self.mlp = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.out(self.mlp(x))
