"""Where the editor's analysis of one edit goes (CPU, in-process; issue 50): the scan of each new text
with the document's ``IncrementalState``, as ``tcaudit server`` makes it, split into the splice
(``IncrementalState.prepare``), choosing the rules by their triggers, the facts (``ScriptFacts``) and
each rule's ``check``, with the cycle collector held off as the server holds it. The edits are
``server_latency.py``'s (``--where``); the files its fixture and 2,000-line file.

    .venv/bin/python benchmarks/analysis_phases.py [--where middle] [--file fixture|2k] [--edits 40]
        [--top 20] [--out benchmarks/results/analysis_phases.json]

The phases are timed by wrapping those functions for the run (this script's process only); a phase
holds the ones inside it (the facts are made inside the first rule that asks). Numbers move with the
machine's speed: compare runs made side by side.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))


def _timed(owner: object, name: str, label: str, spent: collections.Counter, generator: bool = False) -> None:
    function = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            made = function(*args, **kwargs)
            return list(made) if generator else made  # a rule's check yields: its work is the iteration
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--where", choices=("end", "middle", "comment", "noticed"), default="middle")
    parser.add_argument("--file", choices=("fixture", "2k"), default="fixture")
    parser.add_argument("--edits", type=int, default=40)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import fix_speed
    from server_latency import edited

    from tcaudit import api, engine
    from tcaudit.config import load_settings
    from tcaudit.rules import base
    from tcaudit.script import facts
    from tcaudit.source import incremental

    spent: collections.Counter = collections.Counter()
    _timed(incremental.IncrementalState, "prepare", "splice (prepare)", spent)
    _timed(engine, "candidate_rules", "rules chosen by triggers", spent)
    _timed(facts.ScriptFacts, "__init__", "facts (ScriptFacts)", spent)
    in_order = base.in_rule_order

    def timed_rules(rules):
        for rule in in_order(rules):
            if not getattr(rule, "_timed_check", False):
                _timed(rule, "check", f"rule {rule.id}", spent, generator=True)
                rule._timed_check = True
            yield rule

    base.in_rule_order = timed_rules

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n")
        if args.file == "fixture":
            path = root / "train.py"
            path.write_text((REPO / "fixtures" / "resnet50" / "train.py").read_text())
        else:
            (root / "big").mkdir()
            path = fix_speed.two_thousand_line_file(root / "big")
        # The server's settings: the project's, the GPU detected, no plans the config does not ask for.
        settings = dataclasses.replace(api.with_detected_gpu(load_settings([str(path)], None, {})), plan_unasked=False)
        state = api.IncrementalState()
        text = path.read_text()
        cwd = os.getcwd()
        os.chdir(root)
        try:
            def scan(text: str) -> None:
                list(api.scan(text=text, filename=path.name, settings=settings, edits="lazy", incremental=state))

            scan(text)
            spent.clear()
            times = []
            gc.disable()
            try:
                for version in range(2, args.edits + 2):
                    text = edited(text, version, args.where)
                    start = time.perf_counter()
                    scan(text)
                    times.append(time.perf_counter() - start)
                    if version % 8 == 0:
                        gc.collect(1)  # as the server's IdleCollector does between pauses
            finally:
                gc.enable()
        finally:
            os.chdir(cwd)
    phases = {label: round(1000 * total / args.edits, 2) for label, total in spent.most_common()}
    result = {
        "command": "benchmarks/analysis_phases.py " + " ".join(sys.argv[1:]),
        "machine": f"CPU only: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "file": args.file,
        "where": args.where,
        "edits": args.edits,
        "scan_median_ms": round(1000 * statistics.median(times), 2),
        "scan_min_ms": round(1000 * min(times), 2),
        "rules_total_ms": round(sum(v for k, v in phases.items() if k.startswith("rule ")), 2),
        "mean_ms_per_edit": phases,
    }
    print(f"{args.file}, {args.where}: scan median {result['scan_median_ms']} ms (min {result['scan_min_ms']}), "
          f"rules {result['rules_total_ms']} ms")
    for label, value in list(phases.items())[:args.top]:
        print(f"  {label:32s} {value:8.2f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
