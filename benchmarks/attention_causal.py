"""What the causal hint buys: attention forward + backward on one GPU, five ways.

``manual`` is the hand-written chain (scores, ``masked_fill`` with a T x T ``tril`` mask built in
forward, softmax, product): what TC308 rewrites. ``sdpa_mask`` is ``F.scaled_dot_product_attention``
given that mask as a boolean ``attn_mask`` (TC308's rewrite before it recognised masks built in
forward), ``sdpa_causal`` the same with ``is_causal=True`` and no mask (its rewrite now).
``mha_mask`` is ``nn.MultiheadAttention(need_weights=False)`` given the subsequent mask, ``mha_hint``
the same call with ``is_causal=True`` (the hint a rule would add: measured before writing one). bf16 under autocast; the median of the timed
iterations (CUDA events), after warm-up.

    python benchmarks/attention_causal.py --out benchmarks/results/h200/attention_causal.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def manual(q, k, v):
    T = q.size(-2)
    mask = torch.tril(torch.ones(T, T, device=q.device))
    att = (q @ k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    att = att.masked_fill(mask == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


def sdpa_mask(q, k, v):
    T = q.size(-2)
    mask = torch.tril(torch.ones(T, T, device=q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask != 0)


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def timed(step, iterations: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    device = "cuda"
    rows = []
    for T in args.seq:
        shape = (args.batch, args.heads, T, args.head_dim)
        q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        dim = args.heads * args.head_dim
        mha = nn.MultiheadAttention(dim, args.heads, batch_first=True, device=device)
        x = torch.randn(args.batch, T, dim, device=device, requires_grad=True)

        def attention_step(function):
            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = function(q, k, v)
                out.float().sum().backward()
            return step

        def mha_step(hint: bool):
            def step():
                mask = nn.Transformer.generate_square_subsequent_mask(T, device=device)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=hint)[0]
                out.float().sum().backward()
            return step

        steps = {"manual": attention_step(manual), "sdpa_mask": attention_step(sdpa_mask),
                 "sdpa_causal": attention_step(sdpa_causal), "mha_mask": mha_step(False), "mha_hint": mha_step(True)}
        # The same results first (bf16: loose tolerance).
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            reference = manual(q, k, v).float()
            for function in (sdpa_mask, sdpa_causal):
                torch.testing.assert_close(function(q, k, v).float(), reference, rtol=5e-2, atol=5e-2)
            mask = nn.Transformer.generate_square_subsequent_mask(T, device=device)
            torch.testing.assert_close(mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0].float(),
                                       mha(x, x, x, attn_mask=mask, need_weights=False)[0].float(),
                                       rtol=5e-2, atol=5e-2)
        row = {"batch": args.batch, "heads": args.heads, "seq": T, "head_dim": args.head_dim}
        for name, step in steps.items():
            row[f"{name}_ms"] = round(timed(step, args.iterations, args.warmup), 3)
        row["sdpa_causal_over_mask"] = round(row["sdpa_mask_ms"] / row["sdpa_causal_ms"], 2)
        row["sdpa_causal_over_manual"] = round(row["manual_ms"] / row["sdpa_causal_ms"], 2)
        row["mha_hint_over_mask"] = round(row["mha_mask_ms"] / row["mha_hint_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
              "command": "python " + " ".join(sys.argv), "unit": "ms per forward + backward (median)", "rows": rows}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
