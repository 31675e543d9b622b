"""What SyncBatchNorm costs under DDP, on the GPUs this runs on (TC509).

ResNet-50 (torchvision, random weights, 53 BatchNorm2d layers) trained with DDP under torchrun, bf16
autocast and channels_last, synthetic 224×224 batches, SGD: plain BatchNorm against
``nn.SyncBatchNorm.convert_sync_batchnorm`` at several per-GPU batch sizes. Every configuration runs
``--warmup`` steps, then ``--steps`` timed steps (CUDA events around the loop, one sync at the end);
rounds alternate the two norms so drift hits both. Rank 0 writes ``--out`` JSON: the GPU, torch, the
world size, and per batch size the median step time of each norm and their ratio.

    torchrun --nproc_per_node 2 benchmarks/syncbn_cost.py --out syncbn_cost.json

Needs two CUDA GPUs (NCCL). ``--device cpu`` (gloo) checks the script's plain-BatchNorm path on a CPU:
SyncBatchNorm runs only on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn


def step_ms(model, optimizer, batch: int, device, steps: int, warmup: int, amp: bool) -> float:
    x = torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    criterion = nn.CrossEntropyLoss()

    def one():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        one()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            one()
        end.record()
        torch.cuda.synchronize()
        elapsed = start.elapsed_time(end)
    else:
        import time

        begin = time.perf_counter()
        for _ in range(steps):
            one()
        elapsed = (time.perf_counter() - begin) * 1000
    # the slowest rank sets the pace of a DDP step
    value = torch.tensor([elapsed / steps], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def build(sync: bool, device, local_rank: int):
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    if sync:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device).to(memory_format=torch.channels_last)
    ids = [local_rank] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="syncbn_cost.json")
    parser.add_argument("--batches", default="8,16,32,64")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[str, list[float]] = {"batchnorm": [], "syncbatchnorm": []}
        for _ in range(args.rounds):
            for name, sync in (("batchnorm", False), ("syncbatchnorm", True))[: 2 if cuda else 1]:
                model, optimizer = build(sync, device, local_rank)
                times[name].append(step_ms(model, optimizer, batch, device, args.steps, args.warmup, cuda))
                del model, optimizer
                if cuda:
                    torch.cuda.empty_cache()
        plain = statistics.median(times["batchnorm"])
        synced = statistics.median(times["syncbatchnorm"]) if times["syncbatchnorm"] else float("nan")
        results.append({"batch_per_gpu": batch, "batchnorm_step_ms": plain, "syncbatchnorm_step_ms": synced,
                        "syncbn_slowdown": synced / plain, "rounds_ms": times})
        if dist.get_rank() == 0:
            print(f"batch {batch}/GPU: BN {plain:.2f} ms, SyncBN {synced:.2f} ms ({synced / plain:.3f}x)", flush=True)
    if dist.get_rank() == 0:
        record = {
            "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
            "gpus": dist.get_world_size(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "model": "torchvision resnet50, bf16 autocast, channels_last, SGD momentum",
            "command": f"torchrun --nproc_per_node {dist.get_world_size()} benchmarks/syncbn_cost.py --out OUT",
            "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
            "results": results,
        }
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
