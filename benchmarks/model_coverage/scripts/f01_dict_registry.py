"""A dict registry keyed by --model."""
import argparse

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1000), nn.ReLU(), nn.Linear(1000, num_classes))

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.c = nn.Sequential(nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.Linear(84, num_classes))

    def forward(self, x):
        return self.c(self.f(x))


MODELS = {"mlp": MLP, "lenet": LeNet}

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="lenet", choices=list(MODELS))
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

net = MODELS[args.model](num_classes=10).cuda()
x = torch.randn(args.batch_size, 3, 32, 32).cuda()
net(x).sum().backward()
