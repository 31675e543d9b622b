"""Widths come from argparse defaults."""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="tabular MLP")
parser.add_argument("--in-features", type=int, default=54)
parser.add_argument("--hidden", type=int, default=250)
parser.add_argument("--depth", type=int, default=3)
parser.add_argument("--classes", type=int, default=7)
parser.add_argument("--batch-size", type=int, default=100)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()


class DeepMLP(nn.Module):
    def __init__(self, in_features, hidden, depth, classes):
        super().__init__()
        layers = [nn.Linear(in_features, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


model = DeepMLP(args.in_features, args.hidden, args.depth, args.classes).cuda()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)
for _ in range(10):
    x = torch.randn(args.batch_size, args.in_features).cuda()
    loss = model(x).logsumexp(1).mean()
    loss.backward()
    opt.step()
