"""``tcaudit verify train.py [--steps N --warmup W --rounds R --nproc K --out DIR] -- ARGS``."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path


def add_verify_parser(sub, add_selection) -> None:
    from tcaudit.cli.fix import add_structural_flags

    verify = sub.add_parser(
        "verify",
        help="train the original and the patched script side by side and compare them",
        description="Make the patched copy, train both for --steps timed steps under a harness that needs no "
        "edit to the script, and report samples/s, step time, peak memory, loss parity and the speedup. "
        "Arguments after -- go to the script.",
    )
    verify.add_argument("script", metavar="SCRIPT")
    verify.add_argument("--steps", type=int, default=50, help="timed steps per run (default 50)")
    verify.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    verify.add_argument("--nproc", type=int, default=1, help="processes per run under torchrun (default 1)")
    verify.add_argument("--out", default="tcaudit-verify", metavar="DIR", help="results folder (default ./tcaudit-verify)")
    verify.add_argument("--classes", default="safe,numerics", metavar="CLASSES", help="fix classes for the patched copy")
    verify.add_argument("--tolerance", type=float, default=0.10, help="relative loss-parity tolerance (default 0.10)")
    verify.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="give up on a run after this long")
    verify.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds, each side its own process per round, order alternating (default 3)")
    verify.add_argument("--confidence", type=float, default=0.95, help="level of the speedup interval (default 0.95)")
    verify.add_argument("--fail-under", type=float, default=None, metavar="X",
                        help="exit 1 when the speedup interval's lower bound is below X (a CI gate; needs --rounds 2+)")
    verify.add_argument("--aa", action="store_true",
                        help="A/A self-check: the original on both sides, to see this machine's noise band")
    verify.add_argument("--patched", default=None, metavar="FILE",
                        help="compare against this file instead of the patch tcaudit fix makes")
    verify.add_argument("--health", action="store_true",
                        help="record training health on both sides (non-finite steps, GradScaler skips, grad norms, "
                        "parameters without a gradient, peak memory per step); exit 1 when the patched run is worse")
    verify.add_argument("--no-network", action="store_true",
                        help="run both copies of the script in a network namespace of their own (bubblewrap or "
                        "unshare): verify trains the script with your user, files and environment; this takes only "
                        "the network away")
    verify.add_argument("--attribute", action="store_true",
                        help="also run the patch with each rule group left out, and report what each contributed")
    verify.add_argument("--attribute-budget", type=int, default=None, metavar="N",
                        help="at most N extra runs for --attribute")
    add_structural_flags(verify)
    add_selection(verify)


def run_verify(args: argparse.Namespace, settings) -> int:
    from rich.console import Console

    from tcaudit.cli.fix import with_structural_flags
    from tcaudit.findings import parse_classes
    from tcaudit.progress import showing
    from tcaudit.verify.report import render_table, write_plot
    from tcaudit.verify.runner import VerifyError, verify

    if importlib.util.find_spec("torch") is None:
        print("tcaudit: error: verify needs torch (pip install 'tcaudit[torch]')", file=sys.stderr)
        return 2
    if args.steps < 1 or args.warmup < 0 or args.nproc < 1 or args.rounds < 1:
        print("tcaudit: error: --steps, --nproc and --rounds must be at least 1, --warmup at least 0", file=sys.stderr)
        return 2
    problem = _option_problem(args)
    if problem:
        print(f"tcaudit: error: {problem}", file=sys.stderr)
        return 2
    script_args = list(getattr(args, "script_args", []))
    classes = parse_classes(args.classes)
    settings = with_structural_flags(settings, args)
    console = Console(stderr=False, highlight=False, width=max(110, Console(emoji=False).width), emoji=False)
    options = ["--rounds", str(args.rounds), *(["--aa"] if args.aa else []),
               *(["--no-network"] if getattr(args, "no_network", False) else []),
               *(["--health"] if args.health else []),
               *(["--patched", args.patched] if args.patched else []), *(["--attribute"] if args.attribute else []),
               *(["--attribute-budget", str(args.attribute_budget)] if args.attribute_budget is not None else []),
               *(["--fail-under", str(args.fail_under)] if args.fail_under is not None else [])]
    command = shlex.join(["tcaudit", "verify", args.script, "--steps", str(args.steps), "--warmup",
                          str(args.warmup), "--nproc", str(args.nproc), *options,
                          *(f"--{option}" for option in settings.structural_fixes),
                          *(["--pad-dims"] if settings.pad_dims else []), "--", *script_args])
    try:
        # On a terminal only (not in CI logs): verify's rounds, and each run's steps.
        with showing(None) as progress:
            result = verify(
                Path(args.script), script_args, settings, steps=args.steps, warmup=args.warmup, nproc=args.nproc,
                out_dir=Path(args.out), classes=classes, tolerance=args.tolerance, command=command,
                progress=progress.rich, timeout=args.timeout, rounds=args.rounds, confidence=args.confidence,
                aa=args.aa, patched_file=Path(args.patched) if args.patched else None, health=args.health,
                attribute=args.attribute, attribute_budget=args.attribute_budget,
                announce=lambda line: _print_paused(console, progress, line),
                no_network=getattr(args, "no_network", False),
            )
    except VerifyError as exc:
        print(f"tcaudit: error: {exc}", file=sys.stderr)
        return 2
    render_table(result, console)
    plot = write_plot(result, Path(args.out) / "verify.png")
    if plot is None:
        console.print("verify.png skipped: matplotlib is not installed")
    code = 0 if result.parity and not result.health_regressions else 1
    if args.fail_under is not None:
        low = result.interval.low
        if low is None or low < args.fail_under:
            console.print(f"[red]--fail-under {args.fail_under:g}[/red]: the interval's lower bound "
                          f"{'-' if low is None else format(low, '.2f')} is below it")
            code = 1
        else:
            console.print(f"--fail-under {args.fail_under:g}: passed (lower bound {low:.2f})")
    return code


def _print_paused(console, progress, line: str) -> None:
    """A line on stdout while the progress display (on stderr) steps aside, so it is not drawn over."""
    with progress.paused():
        console.print(line)


def _option_problem(args: argparse.Namespace) -> str | None:
    if not 0 < args.confidence < 1:
        return "--confidence must be between 0 and 1 (e.g. 0.95)"
    if args.fail_under is not None and args.rounds < 2:
        return "--fail-under needs an interval: --rounds 2 or more"
    if args.aa and (args.patched or args.attribute):
        return "--aa runs the original on both sides; it does not combine with --patched or --attribute"
    if args.attribute and args.patched:
        return "--attribute leaves rules out of tcaudit fix's patch; it does not combine with --patched"
    if args.attribute_budget is not None and (args.attribute_budget < 0 or not args.attribute):
        return "--attribute-budget takes a number of runs (0 or more) and goes with --attribute"
    return None


def add_calibrate_parser(sub) -> None:
    calibrate = sub.add_parser(
        "calibrate",
        help="measure this GPU's cost of unaligned shapes and precisions (needs CUDA)",
        description="On a CUDA machine: time aligned vs unaligned GEMMs, convs and attention and each precision, "
        "and store the result as the cost table the model audit reads.",
    )
    calibrate.add_argument("--output", "-o", metavar="FILE", help="where to write the table "
                           "(default: ~/.cache/tcaudit/cost_table.json, which the model audit reads first)")
    calibrate.add_argument("--repeat", type=int, default=20, help="timed launches per case (default 20)")
    calibrate.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")


def run_calibrate(args: argparse.Namespace) -> int:
    import json as _json

    from tcaudit.model.cost import default_user_table
    from tcaudit.verify.calibrate import CalibrateError, build_table, measure, write_table

    if importlib.util.find_spec("torch") is None:
        print("tcaudit: error: calibrate needs torch and a CUDA GPU (pip install 'tcaudit[torch]')", file=sys.stderr)
        return 2
    try:
        measurement = measure(repeat=args.repeat, quick=args.quick)
    except CalibrateError as exc:
        print(f"tcaudit: error: {exc}", file=sys.stderr)
        return 2
    output = Path(args.output) if args.output else default_user_table()
    measurement["command"] = " ".join(["tcaudit", *sys.argv[1:]]) if sys.argv[1:2] == ["calibrate"] else "tcaudit calibrate"
    table = build_table(measurement)
    write_table(table, output)
    entry = table["gpus"][measurement["arch"]]
    print(f"{measurement['device']} ({measurement['arch']}), torch {measurement['torch']}")
    for line in entry["measured"]:
        print(f"  {line}")
    print(f"cost table written to {output}")
    print(_json.dumps({"output": str(output)}))
    return 0
