"""torchvision.models.get_model with weights=None and a flag for the name."""
import argparse

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mobilenet_v3_small")
parser.add_argument("--weights", default=None)
parser.add_argument("--batch-size", default=32, type=int)
parser.add_argument("--device", default="cuda")
args = parser.parse_args()
model = torchvision.models.get_model(args.model, weights=args.weights, num_classes=1000)
model.to(args.device)
