"""parse_known_args and a choices flag selecting the width."""
import argparse

import torch
import torch.nn as nn

WIDTHS = {"small": 192, "base": 384, "large": 768}

parser = argparse.ArgumentParser()
parser.add_argument("--size", choices=sorted(WIDTHS), default="small")
parser.add_argument("--patch", type=int, default=16)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--batch-size", type=int, default=64)
args, unknown = parser.parse_known_args()


class PatchClassifier(nn.Module):
    def __init__(self, width, patch, classes=1000):
        super().__init__()
        self.embed = nn.Conv2d(3, width, patch, stride=patch)
        layer = nn.TransformerEncoderLayer(width, nhead=3, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.encoder(x).mean(1))


model = PatchClassifier(WIDTHS[args.size], args.patch).to("cuda")
opt = torch.optim.AdamW(model.parameters())
