"""Collect run.sh's verify.json files into results.json and print the Markdown table.

    python3 benchmarks/realworld/summarize.py OUT [--output benchmarks/realworld/results.json] [--merge]

Per script, from OUT/<script>/{fix,compile,ceiling}/verify.json: the naive script's samples/s (from the
fix run; each verify measures the naive side again, and those figures are kept too), the patch's, the
patch with --compile, and the hand-tuned ceiling's. ``fraction_of_ceiling`` is the best patch's speedup
over the ceiling's speedup, each measured against the naive side of its own interleaved runs, so a
drift of the machine between two verify calls does not enter it.

``--merge`` keeps the rows of scripts OUT has no run of from the existing output file (and a part OUT
lacks from that script's existing row), so runs spread over several device calls or sessions add up;
each row and part keeps its own command, GPU and torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SCRIPTS = ("imagenet_style", "gpt_manual_attention", "word_lm", "dcgan", "unet_seg", "vit_classifier")
PARTS = ("fix", "compile", "ceiling")
# What the harness counts as one sample: the leading dimension of the model's first tensor input.
UNITS = {
    "imagenet_style": "images",
    "gpt_manual_attention": "sequences of 1024 tokens",
    "word_lm": "bptt time steps (input is sequence-first)",
    "dcgan": "discriminator images (3 per real image: real, fake for D, fake for G)",
    "unet_seg": "images",
    "vit_classifier": "images",
}
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results.json"


def load(out: Path, script: str, part: str) -> dict | None:
    path = out / script / part / "verify.json"
    return json.loads(path.read_text()) if path.is_file() else None


def row(out: Path, script: str) -> dict | None:
    runs = {part: load(out, script, part) for part in PARTS}
    present = [run for run in runs.values() if run is not None]
    if not present:
        return None

    def side(part: str, label: str) -> float | None:
        run = runs[part]
        return None if run is None else run[label]["samples_per_s"]

    def speedup(part: str) -> float | None:
        run = runs[part]
        return None if run is None else run["speedup"]

    naive = next((side(part, "original") for part in PARTS if runs[part] is not None), None)
    patched_speedups = [s for s in (speedup("fix"), speedup("compile")) if s is not None]
    ceiling_speedup = speedup("ceiling")
    fraction = (max(patched_speedups) / ceiling_speedup
                if patched_speedups and ceiling_speedup else None)
    first = present[0]
    return {
        "script": f"benchmarks/realworld/{script}.py",
        "unit": UNITS.get(script, "samples"),
        "naive": naive,
        "patched": side("fix", "patched"),
        "patched_compile": side("compile", "patched"),
        "ceiling": side("ceiling", "patched"),
        "speedup": {part: speedup(part) for part in PARTS},
        "speedup_ci": {part: None if runs[part] is None else runs[part]["speedup_ci"] for part in PARTS},
        "rounds": {part: None if runs[part] is None else runs[part].get("rounds") for part in PARTS},
        "naive_per_run": {part: side(part, "original") for part in PARTS},
        "fraction_of_ceiling": fraction,
        "loss_parity": {part: None if runs[part] is None else runs[part]["loss_parity"] for part in PARTS},
        "fixes_applied": {part: None if runs[part] is None else runs[part]["fixes_applied"]
                          for part in ("fix", "compile")},
        "gpu": first["gpu"],
        "device": first["device"],
        "cpu_timings": first["cpu_timings"],
        "torch": first["torch"],
        "steps": first["steps"],
        "command": {part: None if runs[part] is None else runs[part]["command"] for part in PARTS},
    }


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``new``'s rows over ``old``'s, by script; within a script, a part ``new`` did not run keeps ``old``'s
    figures (its speedup, interval, parity and command), and the fraction of the ceiling is recomputed."""
    by_script = {r["script"]: r for r in old}
    for r in new:
        previous = by_script.get(r["script"])
        if previous is not None:
            for part in PARTS:
                if r["speedup"].get(part) is None and previous.get("speedup", {}).get(part) is not None:
                    for key in ("speedup", "speedup_ci", "rounds", "naive_per_run", "loss_parity", "command"):
                        r.setdefault(key, {})[part] = previous.get(key, {}).get(part)
                    field = {"fix": "patched", "compile": "patched_compile", "ceiling": "ceiling"}[part]
                    r[field] = previous.get(field)
                    if part in ("fix", "compile"):
                        r["fixes_applied"][part] = previous.get("fixes_applied", {}).get(part)
            patched = [s for s in (r["speedup"].get("fix"), r["speedup"].get("compile")) if s is not None]
            ceiling = r["speedup"].get("ceiling")
            r["fraction_of_ceiling"] = max(patched) / ceiling if patched and ceiling else None
        by_script[r["script"]] = r
    order = {f"benchmarks/realworld/{name}.py": i for i, name in enumerate(SCRIPTS)}
    return sorted(by_script.values(), key=lambda r: order.get(r["script"], len(order)))


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _times(value: float | None, interval: list | None = None) -> str:
    """``2.47×``, with the 95% interval where the verify had rounds enough for one: ``2.47× [2.40, 2.55]``."""
    if value is None:
        return "–"
    if interval and all(v is not None for v in interval):
        return f"{value:.2f}× [{interval[0]:.2f}, {interval[1]:.2f}]"
    return f"{value:.2f}×"


def table(rows: list[dict]) -> str:
    lines = ["| script | naive | fix | fix --compile | ceiling | fix × | compile × | ceiling × | best / ceiling | parity fix/compile/ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parity = "/".join({True: "ok", False: "FAIL", None: "–"}[r.get("loss_parity", {}).get(part)] for part in PARTS)
        fraction = "–" if r.get("fraction_of_ceiling") is None else f"{r['fraction_of_ceiling']:.0%}"
        speedup, ci = r.get("speedup", {}), r.get("speedup_ci") or {}
        lines.append(f"| {Path(r['script']).stem} | {_num(r.get('naive'))} | {_num(r.get('patched'))} | "
                     f"{_num(r.get('patched_compile'))} | {_num(r.get('ceiling'))} | "
                     f"{_times(speedup.get('fix'), ci.get('fix'))} | {_times(speedup.get('compile'), ci.get('compile'))} | "
                     f"{_times(speedup.get('ceiling'), ci.get('ceiling'))} | {fraction} | {parity} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="run.sh's output folder")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"default {DEFAULT_OUTPUT}")
    parser.add_argument("--merge", action="store_true", help="keep what OUT does not measure from the existing output")
    args = parser.parse_args(argv)
    rows = [r for r in (row(args.out, script) for script in SCRIPTS) if r is not None]
    if args.merge and args.output.is_file():
        rows = merge(json.loads(args.output.read_text()), rows)
    args.output.write_text(json.dumps(rows, indent=2) + "\n")
    if rows:
        devices = sorted({str(r.get("device")) for r in rows})
        torches = sorted({str(r.get("torch")) for r in rows})
        print(f"samples/s (units per script in {args.output.name}); {', '.join(devices)}; torch {', '.join(torches)}")
        if any(r.get("cpu_timings") for r in rows):
            print("CPU timings: a smoke test, not a benchmark")
    print(table(rows))
    print(f"wrote {args.output} ({len(rows)} scripts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
