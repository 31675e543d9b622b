"""getattr(torchvision.models, args.model)(num_classes=args.num_classes)."""
import argparse

import torch
import torchvision


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--num-classes", type=int, default=37)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    return p.parse_args()


def main():
    args = get_args()
    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(3):
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size).cuda()
        model(x).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
