"""DCGAN's training step under each torch.compile mode: does CUDA graphs' reduce-overhead pay on a small step?

The step of benchmarks/realworld/dcgan.py (pytorch/examples' DCGAN: nz 100, ngf = ndf = 64, 64x64
images, BCELoss on a Sigmoid, two Adam optimizers, the discriminator called three times an iteration
with backwards in between, the three `.item()` reads the script prints), on synthetic batches already
on the GPU (the script's DataLoader is left out: this measures the step), at batch 128:

  eager                       the naive script (fp32, NCHW)
  default                     both nets `.compile()` (what `tcaudit fix --compile` wrote before)
  reduce_overhead             `.compile(mode="reduce-overhead")` + `torch.compiler.cudagraph_mark_step_begin()`
                              at the top of each iteration (what it writes now for a small step)
  max_autotune_no_cudagraphs  `.compile(mode="max-autotune-no-cudagraphs")`
  patched_default             `tcaudit fix --compile`'s whole patch with the default mode: fp16 autocast
                              (the BCE loss outside it), GradScaler, channels_last, fused Adam
  patched_reduce_overhead     the same patch with CUDA graphs, as `tcaudit fix --compile` writes it now

Each variant runs in its own process (a crash or a hang cannot take the others with it), with a time
limit, in the order above; a variant that would start past the budget is skipped and says so. Each
reports steps/s per round (the median over rounds; the device is synchronised around each round), the
compile-and-warm-up time, CUDA graph replays per step (a wrapper on torch.cuda.CUDAGraph.replay, as
`tcaudit verify` counts them), Inductor's cudagraph_skips, the peak memory and whether every loss was
finite.

    python benchmarks/cuda_graphs.py --out benchmarks/results/h200/cuda_graphs.json   # H200: ~4-5 min
    python benchmarks/cuda_graphs.py --tiny --variants eager default --out /tmp/cg.json # CPU smoke test

Options: --batch-size (128), --rounds (3), --steps (50 timed per round), --warmup (10 steps, which
include compiling and CUDA graph recording), --budget-s (330: the whole run, for a 6-minute slot),
--variant-timeout-s (150).
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

VARIANTS = ("eager", "reduce_overhead", "default", "patched_reduce_overhead", "patched_default",
            "max_autotune_no_cudagraphs")
MODES = {
    "eager": None, "default": "default", "reduce_overhead": "reduce-overhead",
    "max_autotune_no_cudagraphs": "max-autotune-no-cudagraphs",
    "patched_default": "default", "patched_reduce_overhead": "reduce-overhead",
}


def build(torch, nz: int, width: int, size: int):
    import torch.nn as nn

    nc, ngf, ndf = 3, width, width

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True)]
            channels, spatial = ngf * 8, 4
            while spatial * 2 < size:
                layers += [nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1, bias=False),
                           nn.BatchNorm2d(channels // 2), nn.ReLU(True)]
                channels //= 2
                spatial *= 2
            layers += [nn.ConvTranspose2d(channels, nc, 4, 2, 1, bias=False), nn.Tanh()]
            self.main = nn.Sequential(*layers)

        def forward(self, input):
            return self.main(input)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
            channels, spatial = ndf, size // 2
            while spatial > 4:
                layers += [nn.Conv2d(channels, channels * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(channels * 2),
                           nn.LeakyReLU(0.2, inplace=True)]
                channels *= 2
                spatial //= 2
            layers += [nn.Conv2d(channels, 1, 4, 1, 0, bias=False), nn.Sigmoid()]
            self.main = nn.Sequential(*layers)

        def forward(self, input):
            return self.main(input).view(-1, 1).squeeze(1)

    return Generator(), Discriminator()


def run_variant(variant: str, batch_size: int, size: int, width: int, rounds: int, steps: int, warmup: int) -> dict:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    patched = variant.startswith("patched")
    mode = MODES[variant]
    graphs = mode == "reduce-overhead"
    replays = [0]
    original_replay = torch.cuda.CUDAGraph.replay

    def counting_replay(self, *args, **kwargs):
        replays[0] += 1
        return original_replay(self, *args, **kwargs)

    torch.cuda.CUDAGraph.replay = counting_replay
    if patched:
        torch.backends.cudnn.benchmark = True
    nz = 100
    netG, netD = build(torch, nz, width, size)
    netG, netD = netG.to(device), netD.to(device)
    layout = torch.channels_last if patched else torch.contiguous_format
    if patched:
        netG, netD = netG.to(memory_format=layout), netD.to(memory_format=layout)
    if mode is not None:
        netG.compile(**({} if mode == "default" else {"mode": mode}))
        netD.compile(**({} if mode == "default" else {"mode": mode}))
    criterion = nn.BCELoss()
    fused = {"fused": True} if patched and cuda else {}
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999), **fused)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999), **fused)
    scaler = torch.amp.GradScaler(device.type, enabled=patched and cuda)
    amp = dict(device_type=device.type, dtype=torch.float16, enabled=patched and cuda)
    # Four distinct batches of images in [-1, 1], already on the device (the script's loader is not measured).
    images = [(torch.rand(batch_size, 3, size, size, device=device) * 2 - 1).contiguous(memory_format=layout)
              for _ in range(4)]
    finite = [True]

    def loss_of(output, label):
        with torch.autocast(device_type=device.type, enabled=False):
            return criterion(output.float(), label.float())

    def step(i: int) -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        netD.zero_grad()
        real = images[i % 4]
        label = torch.full((batch_size,), 1.0, device=device)
        with torch.autocast(**amp):
            output = netD(real)
            errD_real = loss_of(output, label)
        scaler.scale(errD_real).backward()
        D_x = output.mean().item()
        with torch.autocast(**amp):
            noise = torch.randn(batch_size, nz, 1, 1, device=device).to(memory_format=layout)
            fake = netG(noise)
            label.fill_(0.0)
            output = netD(fake.detach())
            errD_fake = loss_of(output, label)
        scaler.scale(errD_fake).backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        scaler.step(optD)
        netG.zero_grad()
        label.fill_(1.0)
        with torch.autocast(**amp):
            output = netD(fake)
            errG = loss_of(output, label)
        scaler.scale(errG).backward()
        D_G_z2 = output.mean().item()
        scaler.step(optG)
        scaler.update()
        values = (errD.item(), errG.item(), D_x, D_G_z1, D_G_z2)  # what the script prints every step
        finite[0] = finite[0] and all(math.isfinite(v) for v in values)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    start = time.perf_counter()
    for i in range(warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    per_round = []
    replays_before = replays[0]
    for r in range(rounds):
        sync()
        start = time.perf_counter()
        for i in range(steps):
            step(warmup + r * steps + i)
        sync()
        per_round.append(steps / (time.perf_counter() - start))
    timed_replays = replays[0] - replays_before
    skips = 0
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        skips = int(utils.counters["inductor"].get("cudagraph_skips", 0))
    median = statistics.median(per_round)
    return {
        "variant": variant, "status": "ok", "mode": mode, "patched": patched,
        "steps_per_s": median, "steps_per_s_rounds": per_round, "samples_per_s": median * batch_size,
        "step_ms": 1000.0 / median, "warmup_s": warmup_s, "losses_finite": finite[0],
        "graph_replays_per_step": timed_replays / (rounds * steps), "cudagraph_skips": skips,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the JSON goes")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--variant-timeout-s", type=float, default=150.0)
    parser.add_argument("--tiny", action="store_true", help="ngf = ndf = 8 on 32x32 images, few steps (CPU)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    size, width = (32, 8) if ns.tiny else (64, 64)
    if ns.tiny:
        ns.steps, ns.warmup, ns.rounds = min(ns.steps, 3), min(ns.warmup, 3), min(ns.rounds, 2)
    if ns.child:
        row = run_variant(ns.child, ns.batch_size, size, width, ns.rounds, ns.steps, ns.warmup)
        print("RESULT " + json.dumps(row), flush=True)
        return 0

    import torch

    began = time.monotonic()
    cuda = torch.cuda.is_available()
    result = {
        "benchmark": "cuda_graphs", "gpu": torch.cuda.get_device_name() if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
        "torch": torch.__version__, "python": platform.python_version(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "batch_size": ns.batch_size, "image_size": size, "width": width, "rounds": ns.rounds, "steps": ns.steps,
        "warmup": ns.warmup, "variants": {},
    }
    for variant in ns.variants:
        left = ns.budget_s - (time.monotonic() - began)
        if left < 20:
            result["variants"][variant] = {"variant": variant, "status": f"skipped: {left:.0f}s of the budget left"}
            print(f"{variant}: skipped (budget)", flush=True)
            continue
        command = [sys.executable, os.path.abspath(__file__), "--child", variant, "--out", ns.out,
                   "--batch-size", str(ns.batch_size), "--rounds", str(ns.rounds), "--steps", str(ns.steps),
                   "--warmup", str(ns.warmup), *(["--tiny"] if ns.tiny else [])]
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=min(ns.variant_timeout_s, left))
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if proc.returncode == 0 and lines:
                row = json.loads(lines[-1][len("RESULT "):])
            else:
                row = {"variant": variant, "status": f"failed (exit {proc.returncode})",
                       "error": (proc.stderr or proc.stdout)[-3000:]}
        except subprocess.TimeoutExpired:
            row = {"variant": variant, "status": f"timed out after {min(ns.variant_timeout_s, left):.0f}s"}
        row["process_s"] = time.monotonic() - started
        result["variants"][variant] = row
        print(f"{variant}: {row['status']}" + (
            f" {row['steps_per_s']:.1f} steps/s ({row['step_ms']:.2f} ms), warm-up {row['warmup_s']:.0f}s, "
            f"{row['graph_replays_per_step']:.1f} graph replays/step, losses finite: {row['losses_finite']}"
            if row["status"] == "ok" else ""), flush=True)
    eager = result["variants"].get("eager", {})
    for row in result["variants"].values():
        if row.get("status") == "ok" and eager.get("status") == "ok":
            row["speedup_vs_eager"] = row["steps_per_s"] / eager["steps_per_s"]
    result["wall_s"] = time.monotonic() - began
    with open(ns.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v.get("speedup_vs_eager") for k, v in result["variants"].items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
