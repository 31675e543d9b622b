"""unet_seg.py as an expert would write it: the same UNet (imported from unet_seg.py), data and loss,
with bf16 autocast, channels_last, cudnn.benchmark, a fused AdamW, torch.compile, pinned persistent
loader workers and copies without blocking, and the loss read only when it prints.

    python unet_seg_ceiling.py --batch-size 16 --image-size 256 --steps 100
"""
import argparse

import torch
import torch.nn as nn
from torch import optim
from torch.utils.data import DataLoader

from unet_seg import RandomSegmentation, UNet


def get_args():
    parser = argparse.ArgumentParser(description="Train the UNet (tuned)")
    parser.add_argument("--epochs", "-e", type=int, default=5)
    parser.add_argument("--batch-size", "-b", dest="batch_size", type=int, default=16)
    parser.add_argument("--learning-rate", "-l", dest="lr", type=float, default=1e-4)
    parser.add_argument("--classes", "-c", type=int, default=21)
    parser.add_argument("--base", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--dataset-size", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--log-interval", type=int, default=20)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile the model (default: on with CUDA)")
    return parser.parse_args()


def main():
    args = get_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = UNet(n_channels=3, n_classes=args.classes, base=args.base)
    model.to(device=device, memory_format=torch.channels_last)
    train_model = torch.compile(model) if (cuda if args.compile is None else args.compile) else model
    dataset = RandomSegmentation(args.dataset_size, args.image_size, args.classes)
    loader = DataLoader(dataset, shuffle=True, batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=cuda, persistent_workers=args.workers > 0)
    optimizer = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-8, fused=cuda)
    criterion = nn.CrossEntropyLoss()
    global_step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch in loader:
            images = batch["image"].to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            true_masks = batch["mask"].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                masks_pred = train_model(images)
                loss = criterion(masks_pred, true_masks)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            global_step += 1
            if global_step % args.log_interval == 0:
                print(f"epoch {epoch} step {global_step} loss {loss.item():.4f}")
            if args.steps and global_step >= args.steps:
                return


if __name__ == "__main__":
    main()
