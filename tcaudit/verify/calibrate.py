"""``tcaudit calibrate``: measure this GPU's cost of unaligned shapes and of each precision, and store
it as the cost table the model audit reads (``tcaudit/model/cost_table.json``'s format).

Each case is timed with CUDA events over repeated launches after a warm-up; the GEMM cases are
the team's first H200 measurements (GPT-2 LM head 8192×50257×768 against 50304, odd K, N a multiple of 4 only, odd M), the
conv case compares 30 and 32 channels under channels_last, and the attention case a head dim of 60
(no flash kernel) against 64. The launch case times eager forward calls (host time included, as a
training step sees them) of growing square GEMMs with K and N two past a multiple of 8 against the
aligned ones: up to ``launch.hidden_flops`` the unaligned one is no slower (the host's launch bounds both).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable



class CalibrateError(Exception):
    pass


def _time_ms(torch, fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def _gemm(torch, m: int, n: int, k: int, dtype, repeat: int) -> tuple[float, float]:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    ms = _time_ms(torch, lambda: a @ b, repeat)
    return ms, 2 * m * n * k / (ms / 1000)


def _wall_ms(torch, fn: Callable[[], Any], repeat: int) -> float:
    """Wall time per call, host included (what an eager step sees), median of five runs of ``repeat``."""
    import statistics
    import time

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) * 1000 / repeat)
    return statistics.median(runs)


HIDDEN_TOLERANCE = 1.10  # unaligned within 10% of aligned: nothing a user would measure


def hidden_flops(torch, repeat: int = 200) -> tuple[float, list[dict[str, Any]]]:
    """The largest GEMM (FLOPs) whose unaligned version (K and N two past a multiple of 8) is as fast as
    the aligned one in eager calls, every smaller size included, and the timings behind it."""
    bf16 = torch.bfloat16
    rows: list[dict[str, Any]] = []
    hidden = 0.0
    for size in (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096):
        x = torch.randn(size, size, device="cuda", dtype=bf16)
        w = torch.randn(size, size, device="cuda", dtype=bf16)
        xo = torch.randn(size, size + 2, device="cuda", dtype=bf16)
        wo = torch.randn(size + 2, size + 2, device="cuda", dtype=bf16)
        aligned = _wall_ms(torch, lambda: torch.nn.functional.linear(x, w), repeat)
        odd = _wall_ms(torch, lambda: torch.nn.functional.linear(xo, wo), repeat)
        flops = 2.0 * size ** 3
        rows.append({"m_n_k": size, "flops": flops, "aligned_us": aligned * 1000, "unaligned_us": odd * 1000,
                     "ratio": odd / aligned})
        if odd / aligned > HIDDEN_TOLERANCE:
            break
        hidden = flops
    return hidden, rows


def measure(repeat: int = 20, quick: bool = False) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise CalibrateError("calibrate needs a CUDA GPU; none is visible here (torch.cuda.is_available() is False)")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    scale = 4 if quick else 1
    M, K = 8192 // scale, 768
    results: dict[str, Any] = {"measured": [], "rates": {}, "gemm": {}, "conv": {}, "sdpa": {}, "launch": {}}

    bf16 = torch.bfloat16
    source = torch.empty(2**28 // scale, device="cuda", dtype=torch.float32)  # 1 GiB (256 MiB quick)
    target = torch.empty_like(source)
    copy_ms = _time_ms(torch, lambda: target.copy_(source), repeat)
    results["rates"]["hbm_bytes_per_s"] = 2 * source.numel() * 4 / (copy_ms / 1000)
    results["measured"].append(f"rates.hbm_bytes_per_s: device-to-device copy, "
                               f"{results['rates']['hbm_bytes_per_s'] / 1e12:.2f} TB/s")
    del source, target
    aligned_ms, rate = _gemm(torch, M, 50304, K, bf16, repeat)
    results["rates"]["bfloat16"] = rate
    results["measured"].append(f"rates.bfloat16: {M}x50304x{K} bf16 GEMM, {rate / 1e12:.0f} TFLOP/s")
    results["rates"]["float16"] = _gemm(torch, M, 50304, K, torch.float16, repeat)[1]
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    results["rates"]["float32"] = _gemm(torch, M, 50304, K, torch.float32, repeat)[1]  # TF32 path
    torch.backends.cuda.matmul.allow_tf32 = previous

    def ratio(label: str, shape: tuple[int, int, int], ref: tuple[int, int, int]) -> float:
        slow = _gemm(torch, *shape, bf16, repeat)[0]
        fast = _gemm(torch, *ref, bf16, repeat)[0]
        value = slow / fast
        results["measured"].append(f"{label}: {shape[0]}x{shape[1]}x{shape[2]} vs {ref[0]}x{ref[1]}x{ref[2]}, {value:.2f}x slower")
        return value

    n_odd = ratio("gemm.n_unaligned.2", (M, 50257, K), (M, 50304, K))
    k_odd = ratio("gemm.k_unaligned.2", (M, 4096, 4095), (M, 4096, 4096))
    n_by4 = ratio("gemm.n_unaligned.8", (M, 4100, 4096), (M, 4096, 4096))
    m_odd = ratio("gemm.m_unaligned", (M - 1, 4096, 4096), (M, 4096, 4096))
    not64 = ratio("gemm.not_multiple_of_64", (M, 50264, K), (M, 50304, K))
    results["gemm"] = {
        "k_unaligned": {"1": k_odd, "2": k_odd, "4": k_odd, "8": n_by4},
        "n_unaligned": {"1": n_odd, "2": n_odd, "4": n_odd, "8": n_by4},
        "m_unaligned": m_odd,
        "not_multiple_of_64": not64,
    }

    def conv_ms(channels: int) -> float:
        x = torch.randn(64 // scale, channels, 56, 56, device="cuda", dtype=bf16).to(memory_format=torch.channels_last)
        w = torch.randn(channels, channels, 3, 3, device="cuda", dtype=bf16).to(memory_format=torch.channels_last)
        return _time_ms(torch, lambda: F.conv2d(x, w, padding=1), repeat)

    torch.backends.cudnn.benchmark = True
    conv = conv_ms(30) / conv_ms(32) * (32 * 32) / (30 * 30)  # per-FLOP penalty
    results["conv"]["channels_unaligned"] = conv
    results["measured"].append(f"conv.channels_unaligned: 3x3 conv 30 vs 32 channels, {conv:.2f}x per FLOP")

    def sdpa_ms(head_dim: int) -> float:
        q = torch.randn(8 // scale or 1, 16, 2048, head_dim, device="cuda", dtype=bf16)
        return _time_ms(torch, lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), repeat)

    sdpa = sdpa_ms(60) / sdpa_ms(64) * 64 / 60
    results["sdpa"]["head_dim_unsupported"] = sdpa
    results["measured"].append(f"sdpa.head_dim_unsupported: head dim 60 vs 64, {sdpa:.2f}x per FLOP")

    hidden, rows = hidden_flops(torch, repeat=50 if quick else 200)
    results["launch"] = {"hidden_flops": hidden, "timings": rows}
    last = rows[-1]
    results["measured"].append(
        f"launch.hidden_flops: eager bf16 GEMMs with K and N two past a multiple of 8 take no more than "
        f"{HIDDEN_TOLERANCE:.2f}x the aligned ones up to {hidden / 1e6:.0f} MFLOP; at {last['m_n_k']}^3 "
        f"{last['ratio']:.2f}x")
    return {
        "arch": arch,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "results": results,
    }


def build_table(measurement: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge a measurement into a cost table (the packaged one as the base), keeping other GPUs."""
    from tcaudit.model.cost import load_table

    table = json.loads(json.dumps(base if base is not None else load_table()))
    arch = measurement["arch"]
    results = measurement["results"]
    gpus = table.setdefault("gpus", {})
    entry = gpus.get(arch)
    copied_from = None
    if entry is None:
        # A GPU the table has never seen: what this run does not measure (fp64/int8/fp8 rates, say)
        # starts as the default GPU's values, and is listed as estimated.
        copied_from = table.get("default_gpu") or next(iter(gpus), None)
        entry = json.loads(json.dumps(gpus.get(copied_from, {})))
    rates = dict(entry.get("rates", {}))
    rates.update(results["rates"])
    entry.update({
        "device": measurement["device"],
        "rates": rates,
        "gemm": results["gemm"],
        "conv": results["conv"],
        "sdpa": results["sdpa"],
        **({"launch": {"hidden_flops": results["launch"]["hidden_flops"]}} if results.get("launch") else {}),
        "measured": results["measured"],
        "estimated": [e for e in entry.get("estimated", []) if not e.startswith(("gemm.", "conv.", "sdpa.", "launch."))]
        + ([f"rates not measured here ({', '.join(sorted(set(rates) - set(results['rates'])))}): "
            f"copied from {copied_from} until measured"] if copied_from else []),
        "calibrated": {
            "date": datetime.date.today().isoformat(),
            "torch": measurement["torch"],
            "cuda": measurement["cuda"],
            "python": platform.python_version(),
            "command": measurement.get("command", "tcaudit calibrate"),
        },
    })
    table["gpus"][arch] = entry
    table["source"] = f"tcaudit calibrate on {measurement['device']} (torch {measurement['torch']})"
    table["default_gpu"] = arch
    return table


def write_table(table: dict[str, Any], output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, output)
    return output
