"""fixtures/resnet50/train.py as an expert would write it for one GPU: the same model, batches and loss,
with bf16 autocast, channels_last (model and batches), cudnn.benchmark, a fused SGD, torch.compile, and
the host reading the loss only when it prints. The command line is the fixture's.

    python resnet50_fixture_ceiling.py --synthetic --epochs 1 --steps 50 --batch-size 256
"""
import argparse
import time

import torch
import torch.nn as nn
import torchvision.models as models


def get_args():
    parser = argparse.ArgumentParser(description="ResNet50 training (tuned)")
    parser.add_argument("--data", default="")
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--print-freq", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile the model (default: on with CUDA)")
    return parser.parse_args()


def main():
    args = get_args()
    if not args.synthetic:
        raise SystemExit("this ceiling has the fixture's --synthetic data only")
    torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    model = models.resnet50(num_classes=args.num_classes).to(device, memory_format=torch.channels_last)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4, fused=cuda)
    train_model = torch.compile(model) if (cuda if args.compile is None else args.compile) else model
    # The fixture's SyntheticBatches: random batches made once on the device and replayed.
    steps = args.steps or 100
    batches = [
        (torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
         .contiguous(memory_format=torch.channels_last),
         torch.randint(0, args.num_classes, (args.batch_size,), device=device))
        for _ in range(min(steps, 4))
    ]
    step = 0
    for epoch in range(args.epochs):
        model.train()
        start = time.time()
        for i in range(steps):
            images, target = batches[i % len(batches)]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = criterion(train_model(images), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if i % args.print_freq == 0:
                print("epoch %d step %d loss %.4f" % (epoch, i, loss.item()))
            step += 1
            if args.steps and step >= args.steps:
                break
        print("epoch %d took %.1fs" % (epoch, time.time() - start))
        if args.steps and step >= args.steps:
            break


if __name__ == "__main__":
    main()
