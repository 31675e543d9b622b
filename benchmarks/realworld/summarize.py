"""Collect run.sh's verify.json files into results.json and print the Markdown table.

    python3 benchmarks/realworld/summarize.py OUT [--output benchmarks/realworld/results.json] [--merge]

Per script, from OUT/<script>/{fix,compile,ceiling,h2h}/verify.json: the naive script's samples/s (from
the fix run; each verify measures the naive side again, and those figures are kept too), the patch's,
the patch with --compile, and the hand-tuned ceiling's. ``fraction_of_ceiling`` is, where the script has
an ``h2h`` run (the `fix --compile` patch against the ceiling in one verify, rounds interleaved), that
run's patched-over-ceiling ratio with its interval (``fraction_of_ceiling_ci``); otherwise the best
patch's speedup over the ceiling's speedup, each measured against the naive side of its own runs
(``fraction_source`` says which). The ratio of speedups cancels a drift of the naive script between two
verify calls, not one of the fast variants: ceilings measured on two H200 hosts a session apart differed
by up to 20%, so the head-to-head figure is the one to quote.

``--merge`` keeps the rows of scripts OUT has no run of from the existing output file (and a part OUT
lacks from that script's existing row), so runs spread over several device calls or sessions add up;
each row and part keeps its own command, GPU and torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SCRIPTS = ("imagenet_style", "gpt_manual_attention", "word_lm", "dcgan", "unet_seg", "vit_classifier",
           "resnet50_fixture")
# Scripts that live elsewhere in the repository (their ceiling is benchmarks/realworld/<name>_ceiling.py).
SOURCES = {"resnet50_fixture": "fixtures/resnet50/train.py"}
PARTS = ("fix", "compile", "ceiling")
ALL_PARTS = PARTS + ("h2h",)
# What the harness counts as one sample: the leading dimension of the model's first tensor input.
UNITS = {
    "imagenet_style": "images",
    "gpt_manual_attention": "sequences of 1024 tokens",
    "word_lm": "bptt time steps (input is sequence-first)",
    "dcgan": "discriminator images (3 per real image: real, fake for D, fake for G)",
    "unet_seg": "images",
    "vit_classifier": "images",
    "resnet50_fixture": "images",
}
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results.json"


def load(out: Path, script: str, part: str) -> dict | None:
    path = out / script / part / "verify.json"
    return json.loads(path.read_text()) if path.is_file() else None


def row(out: Path, script: str) -> dict | None:
    runs = {part: load(out, script, part) for part in ALL_PARTS}
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
    head_to_head = runs["h2h"]
    result = {
        "script": SOURCES.get(script, f"benchmarks/realworld/{script}.py"),
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
        "fraction_source": "speedups" if fraction is not None else None,
        "fraction_of_ceiling_ci": None,
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
    if head_to_head is not None:
        _set_head_to_head(result, head_to_head)
    return result


def _set_head_to_head(r: dict, run: dict) -> None:
    """The `fix --compile` patch (verify's original side) against the ceiling (its patched side)."""
    ci = run.get("speedup_ci")
    r["h2h"] = {
        "patched_compile": run["original"]["samples_per_s"],
        "ceiling": run["patched"]["samples_per_s"],
        # patched / ceiling: the inverse of the verify's speedup (median of the rounds' ratios)
        "fraction": 1 / run["speedup"] if run.get("speedup") else None,
        "fraction_ci": [1 / ci[1], 1 / ci[0]] if ci and all(ci) else None,
        "rounds": run.get("rounds"),
        "loss_parity": run.get("loss_parity"),
        "gpu": run.get("gpu"),
        "torch": run.get("torch"),
        "command": run.get("command"),
    }
    _fraction_from_head_to_head(r)


def _fraction_from_head_to_head(r: dict) -> None:
    head = r.get("h2h")
    if head is not None and head.get("fraction") is not None:
        r["fraction_of_ceiling"] = head["fraction"]
        r["fraction_source"] = "h2h"
        r["fraction_of_ceiling_ci"] = head.get("fraction_ci")
        # The head-to-head figure under its own name: the `fix --compile` patch over the ceiling, in one verify.
        r["patch_over_ceiling"] = head["fraction"]
        r["patch_over_ceiling_ci"] = head.get("fraction_ci")


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``new``'s rows over ``old``'s, by script; within a script, a part ``new`` did not run keeps ``old``'s
    figures (its speedup, interval, parity and command), and the fraction of the ceiling is recomputed."""
    by_script = {r["script"]: r for r in old}
    for r in new:
        previous = by_script.get(r["script"])
        if previous is not None:
            if r.get("naive") is None:
                r["naive"] = previous.get("naive")
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
            r["fraction_source"] = "speedups" if r["fraction_of_ceiling"] is not None else None
            r["fraction_of_ceiling_ci"] = None
            if r.get("h2h") is None and previous.get("h2h") is not None:
                r["h2h"] = previous["h2h"]
            _fraction_from_head_to_head(r)
        by_script[r["script"]] = r
    order = {SOURCES.get(name, f"benchmarks/realworld/{name}.py"): i for i, name in enumerate(SCRIPTS)}
    return sorted(by_script.values(), key=lambda r: order.get(r["script"], len(order)))


def _name(script: str) -> str:
    """The benchmark's name for a row's script (``resnet50_fixture`` for fixtures/resnet50/train.py)."""
    return next((name for name, source in SOURCES.items() if source == script), Path(script).stem)


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
        if r.get("fraction_source") == "h2h":
            ci = r.get("fraction_of_ceiling_ci")
            fraction += f" [{ci[0]:.0%}, {ci[1]:.0%}] h2h" if ci else " h2h"
        speedup, ci = r.get("speedup", {}), r.get("speedup_ci") or {}
        lines.append(f"| {_name(r['script'])} | {_num(r.get('naive'))} | {_num(r.get('patched'))} | "
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
