"""When padding a layer pays, on the GPU this runs on: launch-bound toy models, RNN sizes, FP8 GEMMs.

Three measurements behind the model audit's judgements (issue 33):

- ``toy``: the tutorial models whose 10-, 20- and 84-wide layers TC101/TC102 used to warn about (a
  4→10→10→3 MLP at batch 8, the MNIST VAE's 20-wide latent at batch 128, LeNet at batch 4, a CIFAR
  convnet with 30-channel blocks at batch 128) train eagerly (bf16 autocast, SGD) as written and with
  every internal width padded to a multiple of 8; the ratio says whether padding is measurable.
- ``launch``: :func:`tcaudit.verify.calibrate.hidden_flops`, the largest eager GEMM whose unaligned
  version is as fast as the aligned one (the cost table's ``launch.hidden_flops``).
- ``rnn``: ``nn.LSTM``/``nn.GRU`` forward+backward under bf16 and fp16 autocast with input and hidden
  sizes off and on a multiple of 8 (cuDNN's Tensor Core RNN kernels).
- ``fp8``: ``torch._scaled_mm`` (e4m3, per-tensor scales, the inputs quantized in the timed step as
  float8 training does) against a bf16 GEMM, for square sizes: where FP8 pays on this GPU.
- ``d2h``: a device-to-host copy with ``non_blocking=True`` of a result still being computed, read on
  the host before any synchronisation: how often the values read are not the result (TC409).
- ``recompile``: a compiled convnet trained at batch 128, then fed a last partial batch of 100 (what
  ``drop_last=False`` gives): the seconds the new shape's recompilation takes (TC318).

Interleaved rounds (``--rounds``), medians kept. Writes ``--out`` JSON with the GPU, torch and every
figure. On the H200 (about three minutes):

    python benchmarks/small_layers.py --out small_layers.json

``--device cpu --quick`` only checks the script (the ``launch`` and ``fp8`` parts need CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def pad8(width: int) -> int:
    return (width + 7) // 8 * 8


def toy_models(padded: bool):
    """(name, model, input shape, classes) for each toy, as written or with internal widths padded."""
    p = pad8 if padded else (lambda width: width)
    yield "mlp_4_10_10_3_bs8", nn.Sequential(nn.Linear(4, p(10)), nn.ReLU(), nn.Linear(p(10), p(10)), nn.ReLU(),
                                             nn.Linear(p(10), 3)), (8, 4), 3
    yield "vae_784_400_20_bs128", nn.Sequential(nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, p(20)), nn.ReLU(),
                                                nn.Linear(p(20), 400), nn.ReLU(), nn.Linear(400, 784)), (128, 784), 784
    yield "lenet_bs4", nn.Sequential(
        nn.Conv2d(3, p(6), 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(p(6), 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, p(84)), nn.ReLU(), nn.Linear(p(84), 10)), \
        (4, 3, 32, 32), 10
    yield "cifar_convnet_30ch_bs128", nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, p(30), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(p(30), p(30), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(p(30), 128, 3, padding=1),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)), (128, 3, 32, 32), 10


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_time(model: nn.Module, shape, classes: int, device: str, steps: int, warmup: int) -> float:
    """Seconds per eager training step (bf16 autocast, SGD), data already on the device."""
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(*shape, device=device)
    y = torch.randint(0, classes, (shape[0],), device=device)

    def one() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        one()
    sync(device)
    return (time.perf_counter() - start) / steps


def toy(device: str, steps: int, warmup: int, rounds: int) -> list[dict]:
    rows = []
    for (name, plain, shape, classes), (_, padded, _, _) in zip(toy_models(False), toy_models(True)):
        times: dict[str, list[float]] = {"as_written": [], "padded": []}
        for round_ in range(rounds):
            order = [("as_written", plain), ("padded", padded)]
            for label, model in order if round_ % 2 == 0 else order[::-1]:
                times[label].append(step_time(model, shape, classes, device, steps, warmup))
        written, pad = statistics.median(times["as_written"]), statistics.median(times["padded"])
        rows.append({"model": name, "step_us_as_written": written * 1e6, "step_us_padded": pad * 1e6,
                     "padded_speedup": written / pad})
        print(f"toy {name}: {written * 1e6:.0f} us as written, {pad * 1e6:.0f} us padded ({written / pad:.3f}x)")
    return rows


def timed(fn: Callable[[], object], device: str, repeat: int) -> float:
    for _ in range(3):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - start) / repeat


def rnn(device: str, quick: bool, rounds: int) -> list[dict]:
    rows = []
    batch, seq = (4, 5) if quick else (64, 100)
    cases = [("LSTM", 300, 1000), ("LSTM", 304, 1024), ("LSTM", 250, 500), ("LSTM", 256, 512),
             ("GRU", 300, 1000), ("GRU", 304, 1024), ("LSTM", 100, 100), ("LSTM", 104, 104)]
    if quick:
        cases = cases[:2]
    dtypes = [("bf16", torch.bfloat16), ("fp16", torch.float16)] if device == "cuda" else [("bf16", torch.bfloat16)]
    for kind, inp, hidden in cases:
        for label, dtype in dtypes:
            layer = getattr(nn, kind)(inp, hidden, batch_first=True).to(device)
            x = torch.randn(batch, seq, inp, device=device)

            def one() -> None:
                with torch.autocast(device, dtype=dtype):
                    out, _ = layer(x)
                out.float().mean().backward()

            samples = [timed(one, device, 3 if quick else 20) for _ in range(rounds)]
            per = statistics.median(samples)
            flops = 3 * 2 * batch * seq * (4 if kind == "LSTM" else 3) * hidden * (inp + hidden)
            rows.append({"kind": kind, "input": inp, "hidden": hidden, "dtype": label, "batch": batch, "seq": seq,
                         "step_us": per * 1e6, "tflops": flops / per / 1e12})
            print(f"rnn {kind} {inp}->{hidden} {label}: {per * 1e6:.0f} us, {flops / per / 1e12:.1f} TFLOP/s")
    return rows


def fp8(repeat: int) -> list[dict]:
    """bf16 GEMM against e4m3 ``_scaled_mm`` with the activations quantized per step (weights too:
    float8 training recasts them after every update)."""
    rows = []
    f8 = torch.float8_e4m3fn
    for size in (1024, 2048, 4096, 8192, 16384):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        bf16_s = timed(lambda: a @ b, "cuda", repeat)
        one = torch.ones((), device="cuda")

        def scaled() -> torch.Tensor:
            sa = a.abs().amax().float() / 448.0
            sb = b.abs().amax().float() / 448.0
            qa = (a / sa).to(f8)
            qb = (b / sb).to(f8).t().contiguous().t()  # column-major second operand
            return torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        qa, qb = a.to(f8), b.to(f8).t().contiguous().t()
        gemm_only = timed(lambda: torch._scaled_mm(qa, qb, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                          "cuda", repeat)
        with_casts = timed(scaled, "cuda", repeat)
        flops = 2.0 * size ** 3
        rows.append({"m_n_k": size, "bf16_tflops": flops / bf16_s / 1e12, "fp8_gemm_tflops": flops / gemm_only / 1e12,
                     "fp8_gemm_speedup": bf16_s / gemm_only, "fp8_with_quantize_speedup": bf16_s / with_casts})
        print(f"fp8 {size}^3: bf16 {flops / bf16_s / 1e12:.0f} TFLOP/s, fp8 {flops / gemm_only / 1e12:.0f} "
              f"({bf16_s / gemm_only:.2f}x), with per-step quantize {bf16_s / with_casts:.2f}x")
    return rows


def d2h(trials: int) -> dict:
    """Read a pinned host buffer right after ``.to("cpu", non_blocking=True)`` of a freshly computed
    tensor: before the copy lands, the host sees what the buffer held (here: -1)."""
    a = torch.randn(4096, 4096, device="cuda")
    wrong = 0
    for trial in range(trials):
        out = torch.full((1024,), -1.0).pin_memory()
        value = (a @ a).sum(dim=1)[:1024] * 0 + trial  # long GEMM in front of the copy
        out.copy_(value, non_blocking=True)
        seen = out[0].item()  # host read, no synchronisation
        wrong += seen != trial
        torch.cuda.synchronize()
    # .to("cpu", non_blocking=True) as scripts write it
    stale = 0
    for trial in range(trials):
        value = (a @ a).sum(dim=1)[:1024] * 0 + trial
        host = value.to("cpu", non_blocking=True)
        stale += float(host[0]) != trial
        torch.cuda.synchronize()
    print(f"d2h: {wrong}/{trials} reads into a pinned buffer and {stale}/{trials} reads after "
          f".to('cpu', non_blocking=True) saw a value that was not the result")
    return {"trials": trials, "wrong_reads_pinned_copy": wrong, "wrong_reads_to_cpu_non_blocking": stale}


def recompile(quick: bool) -> dict:
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1),
        nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).cuda()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def one(batch: int) -> float:
        x = torch.randn(batch, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(compiled(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    first = one(128)
    steady = statistics.median(one(128) for _ in range(5 if quick else 20))
    partial = one(100)
    again = statistics.median(one(128) for _ in range(5))
    print(f"recompile: first step {first:.1f} s, steady {steady * 1e3:.2f} ms, first partial batch {partial:.1f} s")
    return {"first_step_s": first, "steady_step_ms": steady * 1e3, "new_shape_step_s": partial,
            "steady_after_ms": again * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="small_layers.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.rounds = 2, 1, 1
    result: dict = {"torch": torch.__version__, "command": "python benchmarks/small_layers.py --out small_layers.json"}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
        result["cuda"] = torch.version.cuda
    else:
        result["gpu"] = None
        result["note"] = "CPU run: checks the script only, its numbers mean nothing"
    result["toy"] = toy(args.device, args.steps, args.warmup, args.rounds)
    result["rnn"] = rnn(args.device, args.quick, args.rounds)
    if args.device == "cuda":
        from tcaudit.verify.calibrate import HIDDEN_TOLERANCE, hidden_flops

        hidden, rows = hidden_flops(torch)
        result["launch"] = {"hidden_flops": hidden, "tolerance": HIDDEN_TOLERANCE, "timings": rows}
        print(f"launch: unaligned eager GEMMs cost nothing extra up to {hidden / 1e6:.1f} MFLOP")
        result["fp8"] = fp8(10 if args.quick else 50)
        result["d2h"] = d2h(20 if args.quick else 200)
        result["recompile"] = recompile(args.quick)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
