"""The convnet recipe under ``torch.compile`` (issue 32 item 5): ResNet50 training steps on one GPU,
bf16 autocast against fp16 autocast with GradScaler, fused against foreach SGD, all channels_last
and compiled (default mode), synthetic data already on the GPU. Per recipe: images/s (median of the
timed steps, CUDA events, after the compiling warm-up), whether every loss stayed finite, and the
compile (warm-up) time; ``--eager`` runs the same without compile. A fused SGD step under GradScaler that gives NaN shows as ``finite: false``.

    python benchmarks/convnet_recipe.py --out benchmarks/results/h200/convnet_recipe.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision

RECIPES = {
    "bf16_foreach": ("bfloat16", False),
    "bf16_fused": ("bfloat16", True),
    "fp16_scaler_foreach": ("float16", False),
    "fp16_scaler_fused": ("float16", True),
}


def run(recipe: str, batch: int, steps: int, warmup: int, eager: bool = False) -> dict:
    dtype_name, fused = RECIPES[recipe]
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                **({"fused": True} if fused else {"foreach": True}))
    scaler = torch.amp.GradScaler("cuda", enabled=dtype is torch.float16)
    criterion = nn.CrossEntropyLoss()
    compiled = model if eager else torch.compile(model)
    images = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = criterion(compiled(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    begun = time.perf_counter()
    for _ in range(warmup):
        losses.append(step())
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - begun
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        losses.append(step())
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    values = [float(loss) for loss in losses]
    return {"recipe": recipe, "compiled": not eager, "dtype": dtype_name, "sgd": "fused" if fused else "foreach", "grad_scaler": dtype is torch.float16,
            "images_per_s": round(batch / statistics.median(times), 1), "finite": all(map(math.isfinite, values)),
            "first_loss": round(values[0], 4), "last_loss": round(values[-1], 4), "warmup_s": round(warmup_s, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--eager", action="store_true", help="no torch.compile (the NaN report was eager)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    for recipe in args.recipes:
        rows.append(run(recipe, args.batch, args.steps, args.warmup, args.eager))
        print(json.dumps(rows[-1]), flush=True)
        torch._dynamo.reset()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "torchvision": torchvision.__version__,
              "python": platform.python_version(), "command": "python " + " ".join(sys.argv), "rows": rows}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
