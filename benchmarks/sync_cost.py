"""What one host sync per training step costs (TC601's figure), on the GPU this runs on.

Trains three models (an MLP, a small convnet, a 6-layer transformer) for the same steps twice: once
keeping the loss on the device, once reading ``loss.item()`` every step, and prints and writes
``sync_cost.json`` (samples/s of each, the slowdown, GPU, torch). Put the result into
``rules/TC601.toml`` as ``[cost.sm_XX] per_step = "..."`` with the GPU and torch it ran on.

    python benchmarks/sync_cost.py --steps 200 --warmup 30 --out sync_cost.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn


def models():
    yield "mlp 3x1024, batch 256", nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), (256, 1024), 10
    yield "convnet 4 conv, batch 128 (32x32)", nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)), (128, 3, 32, 32), 10
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    yield "transformer 6x512, batch 32 x 256 tokens", nn.Sequential(nn.TransformerEncoder(layer, 6), nn.Flatten(), nn.Linear(256 * 512, 10)), (32, 256, 512), 10


def run(model, shape, classes, steps, warmup, sync):
    device = "cuda"
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(*shape, device=device)
    y = torch.randint(0, classes, (shape[0],), device=device)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sync:
            loss.item()
    torch.cuda.synchronize()
    return steps * shape[0] / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--out", default="sync_cost.json")
    args = p.parse_args()
    results = []
    for name, model, shape, classes in models():
        free = run(model, shape, classes, args.steps, args.warmup, sync=False)
        synced = run(model, shape, classes, args.steps, args.warmup, sync=True)
        free2 = run(model, shape, classes, args.steps, args.warmup, sync=False)  # order effects
        best_free = max(free, free2)
        results.append({"model": name, "samples_per_s_no_sync": best_free, "samples_per_s_item_each_step": synced,
                        "slowdown_percent": 100 * (1 - synced / best_free)})
        print(f"{name}: {best_free:,.0f} → {synced:,.0f} samples/s with .item() each step "
              f"({results[-1]['slowdown_percent']:.1f}% slower)")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": args.steps, "results": results}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
