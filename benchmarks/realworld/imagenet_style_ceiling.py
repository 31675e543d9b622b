"""imagenet_style.py as an expert would write it for one GPU: the same model, data and loss, with bf16
autocast, channels_last, cudnn.benchmark, a fused SGD, torch.compile, no DataParallel around a single
GPU, uint8 batches in pinned memory copied without blocking and normalized on the GPU, and the host
reading the loss only when it prints.

    python imagenet_style_ceiling.py -a resnet50 --dummy -b 256 -j 8 --steps 100
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.utils.data
import torchvision.models as models
import torchvision.transforms as transforms
from PIL import Image

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (tuned)")
parser.add_argument("-a", "--arch", default="resnet18")
parser.add_argument("-j", "--workers", default=4, type=int)
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("--steps", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=256, type=int)
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
parser.add_argument("--momentum", default=0.9, type=float)
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int)
parser.add_argument("--image-size", default=224, type=int)
parser.add_argument("--dummy", action="store_true")
parser.add_argument("--dummy-images", default=64, type=int)
parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the model (default: on with CUDA)")


class FakeImageNet(torch.utils.data.Dataset):
    """imagenet_style.py's FakeImageNet (uint8 arrays in memory, a PIL image through the transform)."""

    def __init__(self, size, image_size, num_classes, distinct, transform=None, seed=0):
        generator = np.random.default_rng(seed)
        self.size = size
        self.images = generator.integers(0, 256, (distinct, image_size, image_size, 3), dtype=np.uint8)
        self.targets = generator.integers(0, num_classes, (distinct,))
        self.transform = transform

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        image = Image.fromarray(self.images[index % len(self.images)])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index % len(self.targets)])


def main():
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = models.__dict__[args.arch]().to(device, memory_format=torch.channels_last)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, fused=cuda)
    train_model = torch.compile(model) if (cuda if args.compile is None else args.compile) else model
    if not args.dummy:
        raise SystemExit("this benchmark copy only has --dummy data")
    # The workers hand over uint8 (PILToTensor): the GPU converts and normalizes.
    dataset = FakeImageNet(1281167, args.image_size, 1000, args.dummy_images,
                           transforms.Compose([transforms.RandomHorizontalFlip(), transforms.PILToTensor()]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                         pin_memory=cuda, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers > 0 else None)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for i, (images, target) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                output = train_model(images)
                loss = criterion(output, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if i % args.print_freq == 0:
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
            step += 1
            if args.steps and step >= args.steps:
                return


if __name__ == "__main__":
    main()
