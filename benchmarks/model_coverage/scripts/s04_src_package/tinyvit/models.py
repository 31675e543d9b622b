import torch.nn as nn

from tinyvit.layers import Attention

VARIANTS = {"tiny": dict(dim=192, depth=2, heads=3), "small": dict(dim=384, depth=4, heads=6)}


class ViT(nn.Module):
    def __init__(self, dim, depth, heads, patch=16, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.ModuleList([Attention(dim, heads) for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for blk in self.blocks:
            x = x + blk(x)
        return self.head(x.mean(1))


def build(variant):
    return ViT(**VARIANTS[variant])
