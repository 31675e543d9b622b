"""A project whose models package uses relative imports; train.py imports build_model."""
import argparse

import torch

from models import build_model

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="preact18")
parser.add_argument("--num-classes", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

device = torch.device("cuda")
model = build_model(args.arch, args.num_classes).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
