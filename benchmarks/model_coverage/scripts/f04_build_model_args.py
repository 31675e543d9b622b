"""build_model(args) with an if on args.arch inside the helper."""
import argparse

import torch
import torch.nn as nn
import torchvision


def build_model(args):
    if args.arch == "resnet18":
        model = torchvision.models.resnet18(num_classes=args.num_classes)
    elif args.arch == "small":
        model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, args.num_classes))
    else:
        raise NotImplementedError(args.arch)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--num-classes", type=int, default=102)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    model = build_model(args)
    model = model.to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)


if __name__ == "__main__":
    main()
