"""U-Net semantic segmentation in the shape of the popular Pytorch-UNet trainers (our own code): a
conv-heavy encoder/decoder, CrossEntropyLoss over per-pixel masks, random images and masks, and no
--amp option at all.

    python unet_seg.py --batch-size 16 --image-size 256 --steps 100
"""
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, Dataset


class DoubleConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diff_y, diff_x = x2.size(2) - x1.size(2), x2.size(3) - x1.size(3)
        x1 = F.pad(x1, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels, n_classes, base=64):
        super().__init__()
        self.inc = DoubleConv(n_channels, base)
        self.down1 = Down(base, base * 2)
        self.down2 = Down(base * 2, base * 4)
        self.down3 = Down(base * 4, base * 8)
        self.down4 = Down(base * 8, base * 16)
        self.up1 = Up(base * 16, base * 8)
        self.up2 = Up(base * 8, base * 4)
        self.up3 = Up(base * 4, base * 2)
        self.up4 = Up(base * 2, base)
        self.outc = nn.Conv2d(base, n_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)


class RandomSegmentation(Dataset):
    """Random images with random masks, made once and kept in memory."""

    def __init__(self, length, image_size, n_classes, distinct=32):
        generator = torch.Generator().manual_seed(0)
        self.length = length
        self.images = torch.rand(distinct, 3, image_size, image_size, generator=generator)
        self.masks = torch.randint(0, n_classes, (distinct, image_size, image_size), generator=generator)

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        return {"image": self.images[idx % len(self.images)], "mask": self.masks[idx % len(self.masks)]}


def train_model(model, device, args):
    dataset = RandomSegmentation(args.dataset_size, args.image_size, args.classes)
    train_loader = DataLoader(dataset, shuffle=True, batch_size=args.batch_size, num_workers=args.workers)
    optimizer = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-8)
    criterion = nn.CrossEntropyLoss()
    global_step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        epoch_loss = 0
        for batch in train_loader:
            images = batch["image"].to(device=device, dtype=torch.float32)
            true_masks = batch["mask"].to(device=device, dtype=torch.long)
            masks_pred = model(images)
            loss = criterion(masks_pred, true_masks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            global_step += 1
            epoch_loss += loss.item()
            print(f"epoch {epoch} step {global_step} loss {loss.item():.4f}")
            if args.steps and global_step >= args.steps:
                return
        logging.info("epoch %d mean loss %.4f", epoch, epoch_loss / len(train_loader))


def get_args():
    parser = argparse.ArgumentParser(description="Train the UNet on images and target masks")
    parser.add_argument("--epochs", "-e", type=int, default=5)
    parser.add_argument("--batch-size", "-b", dest="batch_size", type=int, default=16)
    parser.add_argument("--learning-rate", "-l", dest="lr", type=float, default=1e-4)
    parser.add_argument("--classes", "-c", type=int, default=21)
    parser.add_argument("--base", type=int, default=64, help="channels of the first level")
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--dataset-size", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    args = get_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = UNet(n_channels=3, n_classes=args.classes, base=args.base)
    model.to(device=device)
    train_model(model, device, args)
