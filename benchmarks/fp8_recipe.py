"""Which torchao float8 recipe ``fix --fp8`` writes (issue 52): benchmarks/fp8/gpt.py's GPT trained in bf16
autocast with each block compiled, against the same with its large linear layers converted by
``convert_to_float8_training`` (the LM head kept in bf16), tensorwise and rowwise scaling, same batches.

    python benchmarks/fp8_recipe.py --out fp8_recipe.json [--n-layer 8 --n-embd 4096 --batch-size 8]

Needs CUDA on sm_89+ and torchao; writes tokens/s, the ratio to bf16, peak memory and every step's loss.
"""

from __future__ import annotations

import argparse
import gc
import json
import runpy
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def gpt_class():
    """The GPT of benchmarks/fp8/gpt.py (its module-level loop runs zero steps of a tiny model)."""
    argv = sys.argv
    sys.argv = ["gpt.py", "--steps", "0", "--n-layer", "1", "--n-embd", "64", "--n-head", "1", "--no-compile"]
    try:
        return runpy.run_path(str(HERE / "fp8" / "gpt.py"))["GPT"]
    finally:
        sys.argv = argv


def run(variant: str, args, GPT) -> dict:
    torch.manual_seed(0)
    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_embd, args.n_head).cuda()
    if variant != "bf16":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(variant),
                                   module_filter_fn=lambda module, fqn: fqn != "lm_head")
    for block in model.h:
        block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(args.vocab_size, (8, args.batch_size, args.block_size + 1), generator=generator)
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        batch = data[step % len(data)].cuda(non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    timed = times[args.warmup:]
    tokens = args.batch_size * args.block_size
    result = {"variant": variant, "tokens_per_s": tokens / statistics.median(timed),
              "step_ms_median": 1e3 * statistics.median(timed),
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "losses": losses,
              "params": sum(p.numel() for p in model.parameters())}
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=4096)
    parser.add_argument("--n-head", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--variants", default="bf16,tensorwise,rowwise")
    args = parser.parse_args()
    import torchao

    GPT = gpt_class()
    results = []
    for variant in args.variants.split(","):
        try:
            results.append(run(variant, args, GPT))
        except Exception as exc:  # a recipe this torch/torchao cannot run: recorded, the others still measured
            results.append({"variant": variant, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "losses"}), flush=True)
    base = next((r for r in results if r["variant"] == "bf16" and "tokens_per_s" in r), None)
    for r in results:
        if base and "tokens_per_s" in r:
            r["vs_bf16"] = r["tokens_per_s"] / base["tokens_per_s"]
            tail = slice(args.warmup, None)
            r["mean_loss_timed"] = statistics.fmean(r["losses"][tail])
    Path(args.out).write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "torchao": torchao.__version__,
        "command": " ".join(["python", *sys.argv]), "config": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
