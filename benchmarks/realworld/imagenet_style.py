"""ImageNet training in the shape of pytorch/examples/imagenet/main.py (our own code, --dummy data only).

    python imagenet_style.py -a resnet50 --dummy -b 256 -j 8 --steps 100
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.utils.data
import torchvision.models as models
import torchvision.transforms as transforms
from PIL import Image

model_names = sorted(name for name in models.__dict__
                     if name.islower() and not name.startswith("__") and callable(models.__dict__[name]))

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("-a", "--arch", metavar="ARCH", default="resnet18", choices=model_names,
                    help="model architecture: " + " | ".join(model_names) + " (default: resnet18)")
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N", help="number of data loading workers")
parser.add_argument("--epochs", default=90, type=int, metavar="N")
parser.add_argument("--steps", default=0, type=int, help="stop after this many training steps (0: all)")
parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N")
parser.add_argument("--image-size", default=224, type=int)
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")
parser.add_argument("--dummy-images", default=64, type=int, help="distinct fake images kept in memory")


class FakeImageNet(torch.utils.data.Dataset):
    """Like torchvision's FakeData, but the images are made once and kept in memory as uint8 arrays (what
    a decoder hands over); each item is a PIL image passed through the transform, as ImageFolder does."""

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


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0)) for k in topk]


def train(train_loader, model, criterion, optimizer, epoch, args, step):
    batch_time, losses, top1 = AverageMeter("Time", ":6.3f"), AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        if torch.cuda.is_available():
            images = images.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        acc1, = accuracy(output, target)
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0].item(), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\t{batch_time}\t{losses}\t{top1}")
        step += 1
        if args.steps and step >= args.steps:
            break
    return step


def validate(val_loader, model, criterion):
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            if torch.cuda.is_available():
                images, target = images.cuda(non_blocking=True), target.cuda(non_blocking=True)
            loss = criterion(model(images), target)
    return loss.item()


def main():
    args = parser.parse_args()
    print("=> creating model '{}'".format(args.arch))
    model = models.__dict__[args.arch]()
    if torch.cuda.is_available():
        model = torch.nn.DataParallel(model).cuda()
    criterion = nn.CrossEntropyLoss()
    if torch.cuda.is_available():
        criterion = criterion.cuda()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    if not args.dummy:
        raise SystemExit("this benchmark copy only has --dummy data")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = FakeImageNet(1281167, args.image_size, 1000, args.dummy_images, transforms.Compose([
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ]))
    val_dataset = FakeImageNet(50000, args.image_size, 1000, args.dummy_images,
                               transforms.Compose([transforms.ToTensor(), normalize]), seed=1)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True,
                                               num_workers=args.workers)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, num_workers=args.workers)
    step = 0
    for epoch in range(args.epochs):
        step = train(train_loader, model, criterion, optimizer, epoch, args, step)
        if args.steps and step >= args.steps:
            break
        validate(val_loader, model, criterion)


if __name__ == "__main__":
    main()
