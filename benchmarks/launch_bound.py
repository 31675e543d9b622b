"""Do precision, TF32 and channels_last pay on the models tcaudit calls launch-bound? (issue 33)

tcaudit reports TC201 (autocast), TC301 (TF32) and TC303 (channels_last) as info on a model whose
step is launch-bound: twice its GEMM/conv work still averages within one launch per op
(``CostModel.step_within_launch``). This trains each model below on synthetic data already on the GPU
(no loader: the most favourable case for the advice) in fp32, with TF32 matmuls, under bf16 autocast,
and for convnets under bf16 autocast in channels_last, and reports the eager ms/step of each: the
tutorial-sized models should gain nothing measurable, the near misses (the same MNIST Net at batch
1024, a CIFAR ResNet18 at batch 256, a ResNet50) should.

    python benchmarks/launch_bound.py --out benchmarks/results/h200/launch_bound.json

Needs CUDA (and torchvision for the ResNets). Rounds alternate the variants; the figure is the median
of the rounds' per-step means.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MnistNet(nn.Module):  # pytorch/examples mnist
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class LeNet(nn.Module):  # the CIFAR-10 tutorial's Net
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.max_pool2d(F.relu(self.conv1(x)), 2))), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))))


class SmallCNN(nn.Module):  # a Keras-style fit() script's model
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(4096, 128), nn.Linear(128, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.max_pool2d(F.relu(self.conv1(x)), 2))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def dqn():
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))


class PPOAgent(nn.Module):  # CleanRL ppo.py's Agent, both heads in one loss
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def forward(self, x):
        return torch.cat([self.actor(x), self.critic(x)], 1)


def resnet(name: str, classes: int, cifar: bool) -> nn.Module:
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=classes)
    if cifar:  # the usual CIFAR ResNet: a 3x3 stem, no max-pool
        model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    return model


# name → (builder, input shape, classes, convnet, what tcaudit says)
CASES = {
    "mnist_net_b64": (MnistNet, (64, 1, 28, 28), 10, True, "launch-bound"),
    "lenet_cifar_b4": (LeNet, (4, 3, 32, 32), 10, True, "launch-bound"),
    "small_cnn_b64": (SmallCNN, (64, 3, 32, 32), 5, True, "launch-bound"),
    "dqn_mlp_b128": (dqn, (128, 4), 2, False, "launch-bound"),
    "ppo_agent_b128": (PPOAgent, (128, 4), 3, False, "launch-bound"),
    "linear_10_2_b64": (lambda: nn.Linear(10, 2), (64, 10), 2, False, "launch-bound"),
    "mnist_net_b1024": (MnistNet, (1024, 1, 28, 28), 10, True, "not launch-bound"),
    # torchvision's resnet18 on 32x32 images as a script trains it (0.9 GFLOP per op at batch 256: under
    # one launch's 906 MFLOP, not twice under), and the usual CIFAR variant (3x3 stem, no max-pool)
    "resnet18_32px_b256": (lambda: resnet("resnet18", 10, False), (256, 3, 32, 32), 10, True, "not launch-bound"),
    "cifar_resnet18_b256": (lambda: resnet("resnet18", 10, True), (256, 3, 32, 32), 10, True, "not launch-bound"),
    "resnet50_b64": (lambda: resnet("resnet50", 1000, False), (64, 3, 224, 224), 1000, True, "not launch-bound"),
}


def variants(convnet: bool) -> list[str]:
    return ["fp32", "tf32", "bf16"] + (["bf16_channels_last"] if convnet else [])


def step_time(model, x, y, variant: str, steps: int) -> float:
    torch.backends.cuda.matmul.allow_tf32 = variant == "tf32"
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if variant == "bf16_channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    autocast = variant.startswith("bf16")

    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(10):
        one()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    rows = []
    for name, (build, shape, classes, convnet, verdict) in CASES.items():
        if args.only and name not in args.only:
            continue
        torch.manual_seed(0)
        model = build().cuda()
        x = torch.randn(*shape, device="cuda")
        y = torch.randint(0, classes, (shape[0],), device="cuda")
        times: dict[str, list[float]] = {v: [] for v in variants(convnet)}
        for _ in range(args.rounds):
            for variant in times:
                if variant == "bf16_channels_last":
                    model = model.to(memory_format=torch.channels_last)
                times[variant].append(step_time(model, x, y, variant, args.steps))
                if variant == "bf16_channels_last":
                    model = model.to(memory_format=torch.contiguous_format)
        ms = {v: round(statistics.median(t), 4) for v, t in times.items()}
        row = {
            "model": name, "input": list(shape), "tcaudit": verdict, "ms_per_step": ms,
            "speedup_over_fp32": {v: round(ms["fp32"] / t, 3) for v, t in ms.items() if v != "fp32"},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": "python " + " ".join(sys.argv),
        "steps": args.steps, "rounds": args.rounds,
        "note": "eager, synthetic batches already on the GPU, SGD with momentum, cudnn.benchmark on; "
                "fp32 = TF32 matmuls off (cuDNN convs keep their TF32 default)",
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
