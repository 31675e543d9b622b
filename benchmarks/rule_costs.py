"""What the per-step patterns of TC203, TC406, TC602, TC605 and TC606 cost, on the GPU this runs on.

Their `[cost]` tables say "not measured"; this measures them. Each model (an MLP, a small convnet, a
6-layer transformer; bf16 autocast, SGD, data on the device) trains the same steps with the plain step
and with the rule's pattern added, in alternating order for ``--rounds`` rounds (the median is kept):

- TC203: a GradScaler driving a bf16 step (``scale``/``step``/``update``);
- TC406: a per-step tensor built on the host and moved (``torch.ones(n).to(device)``) instead of
  ``torch.ones(n, device=device)``;
- TC602: ``zero_grad(set_to_none=False)`` instead of the default ``True``;
- TC605: ``torch.cuda.empty_cache()`` every step;
- TC606: an evaluation pass (``model.eval()``) without ``torch.no_grad()``, against one with it: its
  samples/s and peak memory.

It prints one line per rule and model and writes ``--out`` (JSON: GPU, torch, every measurement, and
for each rule a figure string to paste into ``rules/TCNNN.toml`` as ``[cost.sm_XX]`` with the GPU and
torch it ran on). On the H200 (about 2 minutes):

    python benchmarks/rule_costs.py --out rule_costs.json

``--device cpu --steps 3 --warmup 1 --rounds 1 --small`` only checks the script for typos; its
numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn


def models(small: bool):
    width = 64 if small else 1024
    yield "mlp", nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                               nn.Linear(width, 10)), (8 if small else 256, width)
    channels = 8 if small else 64
    yield "convnet", nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(2 * channels, 2 * channels, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, 10)), (8 if small else 128, 3, 32, 32)
    d_model, tokens = (32, 16) if small else (512, 256)
    layer = nn.TransformerEncoderLayer(d_model, 4 if small else 8, 4 * d_model, batch_first=True)
    yield "transformer", nn.Sequential(nn.TransformerEncoder(layer, 2 if small else 6), nn.Flatten(),
                                       nn.Linear(tokens * d_model, 10)), (4 if small else 32, tokens, d_model)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(model, shape, device, steps, warmup, variant) -> float:
    """samples/s of ``steps`` timed training steps with ``variant`` ("plain" or a rule id) added."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device, enabled=variant == "TC203")
    x = torch.randn(*shape, device=device)
    y = torch.randint(0, 10, (shape[0],), device=device)
    start = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y, reduction="none")
        if variant == "TC406":
            weights = torch.ones(shape[0]).to(device)  # built on the host, then copied
        else:
            weights = torch.ones(shape[0], device=device)
        loss = (loss * weights).mean()
        opt.zero_grad(set_to_none=variant != "TC602")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if variant == "TC605" and device == "cuda":
            torch.cuda.empty_cache()
    sync(device)
    return steps * shape[0] / (time.perf_counter() - start)


def evaluate(model, shape, device, steps, warmup, no_grad: bool) -> tuple[float, float]:
    """(samples/s, peak GiB) of an evaluation pass with or without ``torch.no_grad()``."""
    model.eval()
    x = torch.randn(*shape, device=device)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
        if no_grad:
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
                out = model(x)
        else:
            with torch.autocast(device, dtype=torch.bfloat16):
                out = model(x)
        # Predictions hold no graph; without no_grad the forward still records one and saves the
        # activations a backward would need until `out` is dropped: the peak memory shows that.
        predictions = out.argmax(-1)
        del predictions
    sync(device)
    rate = steps * shape[0] / (time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    model.train()
    return rate, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny models (for a CPU check of the script)")
    parser.add_argument("--out", default="rule_costs.json")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on the GPU, or check the script with --device cpu --small")
    rules = ("TC203", "TC406", "TC602", "TC605")
    rows = []
    for name, model, shape in models(args.small):
        model = model.to(args.device)
        rates: dict[str, list[float]] = {variant: [] for variant in ("plain", *rules)}
        for round_ in range(args.rounds):
            order = ("plain", *rules) if round_ % 2 == 0 else (*rules, "plain")
            for variant in order:
                rates[variant].append(train(model, shape, args.device, args.steps, args.warmup, variant))
        plain = statistics.median(rates["plain"])
        for rule in rules:
            with_pattern = statistics.median(rates[rule])
            rows.append({"rule": rule, "model": name, "plain_samples_per_s": plain,
                         "pattern_samples_per_s": with_pattern, "slowdown_percent": 100 * (1 - with_pattern / plain),
                         "rounds": rates[rule], "plain_rounds": rates["plain"]})
            print(f"{rule} {name}: {plain:,.0f} → {with_pattern:,.0f} samples/s ({rows[-1]['slowdown_percent']:.1f}% slower)")
        evals = {flag: [evaluate(model, shape, args.device, args.steps, args.warmup, flag) for _ in range(args.rounds)]
                 for flag in (True, False)}
        with_no_grad = statistics.median(rate for rate, _ in evals[True])
        without = statistics.median(rate for rate, _ in evals[False])
        rows.append({"rule": "TC606", "model": name, "plain_samples_per_s": with_no_grad,
                     "pattern_samples_per_s": without, "slowdown_percent": 100 * (1 - without / with_no_grad),
                     "peak_gib_no_grad": max(peak for _, peak in evals[True]),
                     "peak_gib_without": max(peak for _, peak in evals[False])})
        print(f"TC606 {name}: eval {with_no_grad:,.0f} samples/s under no_grad, {without:,.0f} without "
              f"(peak {rows[-1]['peak_gib_no_grad']:.2f} → {rows[-1]['peak_gib_without']:.2f} GiB)")
    figures = {}
    for rule in (*rules, "TC606"):
        parts = [f"{r['model']} {r['slowdown_percent']:.1f}% slower" for r in rows if r["rule"] == rule]
        figures[rule] = ", ".join(parts)
    report = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
              "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "small": args.small,
              "command": "python benchmarks/rule_costs.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("small", "out")),
              "figures": figures, "results": rows}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
