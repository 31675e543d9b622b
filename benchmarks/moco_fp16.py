"""Why a MoCo v1 model mis-trains under fp16 autocast + GradScaler, and which recipe trains like fp32
(issue 53). On a CUDA GPU only:

    python benchmarks/moco_fp16.py OUT.json [--steps 30]

A MoCo module in the shape of facebookresearch/moco's ``builder.py`` (query encoder, momentum key
encoder updated in forward, a queue of past keys, shuffle-BN through all_gather, InfoNCE logits
divided by T = 0.07), as a DDP group of one over NCCL, trained under fixed seeds in each recipe:

- ``fp32``, twice (the second run is the noise floor: cuDNN picks its algorithms afresh);
- ``fp16``: what ``tcaudit fix`` wrote before issue 53 (fp16 autocast over forward and loss, GradScaler);
- ``fp16-noscaler``: the same autocast without a scaler (fp16's arithmetic alone, no skipped steps);
- ``fp16-fp32-logits``: fp16 autocast with the InfoNCE logits (q.k, q.queue, /T) and the loss in fp32;
- ``fp16-fp32-keys``: fp16 autocast with the momentum encoder's forward (the keys) in fp32;
- ``bf16``: bf16 autocast over forward and loss, no scaler;
- ``bf16-fp32-logits``: bf16 autocast with the logits and loss in fp32.

For each recipe and step: the loss, the sum of the query encoder's parameters after the step, whether
the scaler skipped it, and its scale. Then, at a realistic size (ResNet50, 224 px), the step time of the
fp32, fp16, fp16-fp32-logits, bf16 and bf16-fp32-logits recipes (median of the timed steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision


@torch.no_grad()
def concat_all_gather(tensor):
    gathered = [torch.ones_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor, async_op=False)
    return torch.cat(gathered, dim=0)


class MoCo(nn.Module):
    """facebookresearch/moco builder.py (v1: no MLP head), with switches for where precision changes."""

    def __init__(self, base_encoder, dim=128, K=4096, m=0.999, T=0.07, logits_fp32=False, keys_fp32=False):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.logits_fp32, self.keys_fp32 = logits_fp32, keys_fp32
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = F.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = concat_all_gather(keys)
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr : ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    @torch.no_grad()
    def _batch_shuffle_ddp(self, x):
        batch_size_this = x.shape[0]
        x_gather = concat_all_gather(x)
        num_gpus = x_gather.shape[0] // batch_size_this
        idx_shuffle = torch.randperm(x_gather.shape[0], device=x.device)
        dist.broadcast(idx_shuffle, src=0)
        idx_unshuffle = torch.argsort(idx_shuffle)
        idx_this = idx_shuffle.view(num_gpus, -1)[dist.get_rank()]
        return x_gather[idx_this], idx_unshuffle

    @torch.no_grad()
    def _batch_unshuffle_ddp(self, x, idx_unshuffle):
        batch_size_this = x.shape[0]
        x_gather = concat_all_gather(x)
        num_gpus = x_gather.shape[0] // batch_size_this
        idx_this = idx_unshuffle.view(num_gpus, -1)[dist.get_rank()]
        return x_gather[idx_this]

    def forward(self, im_q, im_k):
        q = self.encoder_q(im_q)
        q = F.normalize(q, dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, idx_unshuffle = self._batch_shuffle_ddp(im_k)
            with torch.autocast(im_k.device.type, enabled=False) if self.keys_fp32 else nullcontext():
                k = self.encoder_k(im_k.float() if self.keys_fp32 else im_k)
            k = F.normalize(k, dim=1)
            k = self._batch_unshuffle_ddp(k, idx_unshuffle)
        with torch.autocast(q.device.type, enabled=False) if self.logits_fp32 else nullcontext():
            if self.logits_fp32:
                q, k = q.float(), k.float()
            l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
            l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
            logits = torch.cat([l_pos, l_neg], dim=1)
            logits /= self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return logits, labels


RECIPES = {
    # name: (autocast dtype or None, GradScaler, logits in fp32, keys in fp32)
    "fp32": (None, False, False, False),
    "fp32-again": (None, False, False, False),
    "fp16": (torch.float16, True, False, False),
    "fp16-noscaler": (torch.float16, False, False, False),
    "fp16-fp32-logits": (torch.float16, True, True, False),
    "fp16-fp32-keys": (torch.float16, True, False, True),
    "bf16": (torch.bfloat16, False, False, False),
    "bf16-fp32-logits": (torch.bfloat16, False, True, False),
}


def make_data(n, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 3, size, size, generator=g)
    # Two views: each a random flip and its own noise, so positives are close but not equal.
    def view(gen):
        flipped = torch.where(torch.rand(n, 1, 1, 1, generator=gen) < 0.5, images.flip(-1), images)
        return (flipped + 0.1 * torch.randn(flipped.shape, generator=gen) - 0.5) / 0.25
    return view(g), view(g)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train(recipe, arch, steps, batch, size, K, data, timed=False, device="cuda", skip=()):
    """``skip``: the steps (0-based) whose optimizer step is left out, as a scaler that found infs does."""
    dtype, use_scaler, logits_fp32, keys_fp32 = RECIPES[recipe.split("+")[0]]
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    device = torch.device(device, 0) if device == "cuda" else torch.device(device)
    model = MoCo(getattr(torchvision.models, arch), K=K, logits_fp32=logits_fp32, keys_fp32=keys_fp32).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if device.type == "cuda" else None)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.03, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    view_q, view_k = data
    n = view_q.shape[0]
    record = {"loss": [], "param_sum": [], "skipped": [], "scale": [], "seconds": []}
    for step in range(steps):
        lo = (step * batch) % n
        im_q = view_q[lo : lo + batch].to(device, non_blocking=True)
        im_k = view_k[lo : lo + batch].to(device, non_blocking=True)
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
            output, target = model(im_q=im_q, im_k=im_k)
            loss = criterion(output, target)
        optimizer.zero_grad()
        skipped = False
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
            skipped = bool(sum(v.item() for v in found.values()))
            scaler.update()
        else:
            scale = 1.0
            loss.backward()
            if step in skip:
                skipped = True
            else:
                optimizer.step()
        sync(device)
        record["seconds"].append(time.perf_counter() - start)
        if not timed:
            record["loss"].append(loss.item())
            record["param_sum"].append(sum(p.double().sum().item() for p in model.module.encoder_q.parameters()))
            record["skipped"].append(skipped)
            record["scale"].append(scale)
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timed-steps", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", world_size=1, rank=0)
    torch.cuda.set_device(0)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "command": f"python benchmarks/moco_fp16.py OUT.json --steps {args.steps}", "recipes": {}}
    # Numerics: resnet18 encoders at 64 px, batch 64, a queue of 4,096 keys (K a multiple of the batch).
    data = make_data(512, 64)
    for recipe in RECIPES:
        result["recipes"][recipe] = train(recipe, "resnet18", args.steps, 64, 64, 4096, data)
    # The fp32 run with the fp16 run's skipped steps left out too: what fp16 + GradScaler should match if
    # its only difference is the scaler finding its scale (a skipped step), not its arithmetic.
    skips = {i for i, s in enumerate(result["recipes"]["fp16"]["skipped"]) if s}
    result["recipes"]["fp32+fp16-skips"] = train("fp32", "resnet18", args.steps, 64, 64, 4096, data, skip=skips)
    reference = result["recipes"]["fp32"]
    print(f"{'recipe':<18} {'skipped':>7} {'loss 1..5':<40} {'max rel loss diff':>17} {'param sum diff at end':>21}")
    for recipe, rec in result["recipes"].items():
        diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(reference["loss"], rec["loss"])]
        rec["max_rel_loss_diff"] = max(diffs)
        rec["param_sum_diff"] = [b - a for a, b in zip(reference["param_sum"], rec["param_sum"])]
        first = " ".join(f"{x:.4f}" for x in rec["loss"][:5])
        end = rec["param_sum_diff"][-1]
        print(f"{recipe:<18} {sum(rec['skipped']):>7} {first:<40} {max(diffs):>17.4f} {end:>21.4f}")
    print("loss by step (fp32 | fp32+fp16-skips | fp16 | fp16-noscaler | fp16-fp32-logits | bf16 | bf16-fp32-logits):")
    shown = ("fp32", "fp32+fp16-skips", "fp16", "fp16-noscaler", "fp16-fp32-logits", "bf16", "bf16-fp32-logits")
    for i in range(args.steps):
        row = [result["recipes"][r]["loss"][i] for r in shown]
        skip = "S" if result["recipes"]["fp16"]["skipped"][i] else " "
        print(f"  {i + 1:>2} " + " ".join(f"{x:8.4f}" for x in row) + f" {skip}")
    # Speed at a realistic size: ResNet50, 224 px, batch 128, a queue of 65,536 keys.
    data = make_data(256, 224)
    result["timing"] = {"arch": "resnet50", "image_size": 224, "batch": 128, "K": 65536, "steps": args.timed_steps}
    for recipe in ("fp32", "fp16", "fp16-fp32-logits", "bf16", "bf16-fp32-logits"):
        rec = train(recipe, "resnet50", args.timed_steps, 128, 224, 65536, data, timed=True)
        ms = statistics.median(rec["seconds"][5:]) * 1000
        result["timing"][recipe] = {"median_step_ms": ms, "img_per_s": 128 / ms * 1000}
        print(f"timing {recipe:<18} {ms:8.1f} ms/step {128 / ms * 1000:8.0f} img/s")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    dist.destroy_process_group()
    assert all(math.isfinite(x) for x in reference["loss"])


if __name__ == "__main__":
    main()
