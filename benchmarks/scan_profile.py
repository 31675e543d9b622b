"""Where ``tcaudit scan`` spends its time on a folder: which rules' text triggers let which files
through to a LibCST parse, and the time of each phase (triggers, the syntax check of skipped files,
parse, facts, each rule), in one process (``--jobs 1``, no cache).

    PYTHONPATH=. .venv/bin/python benchmarks/scan_profile.py [DIR] [--files]

DIR defaults to torchvision's installed package (located in a child process, so this one never
imports torch). Run it with ``PYTHONPATH`` pointing at another checkout (``git worktree add /tmp/v010
57f0e35``) to profile that version: the script uses only ``engine.instantiate_rules``,
``engine.candidate_rules``, ``engine.syntax_error`` and ``engine.analyse_source`` (0.1.0's own
facts and rules where it has none). CPU timings; no GPU is involved.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

from tcaudit import engine
from tcaudit.config import Settings
from tcaudit.source.parsing import SourceError, read_source


def torchvision_dir() -> Path:
    code = "import pathlib, torchvision; print(pathlib.Path(torchvision.__file__).parent)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("torchvision is not importable here; pass DIR")
    return Path(proc.stdout.strip())


def analyse(source, rules, settings) -> None:
    """The facts and the rules on one parsed file (0.1.0 had no ``engine.analyse_source``)."""
    if hasattr(engine, "analyse_source"):
        engine.analyse_source(source, rules, settings)
        return
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.script.rule import RuleContext  # 0.1.0's home of it

    facts, context = ScriptFacts(source), RuleContext(settings)
    for rule in rules:
        list(rule.check(facts, context))


def profile(root: Path, list_files: bool) -> None:
    settings = Settings()
    rules = engine.instantiate_rules(settings)
    phases: collections.Counter[str] = collections.Counter()
    per_rule_files: collections.Counter[str] = collections.Counter()
    parsed: list[tuple[str, list[str]]] = []
    files = sorted(root.rglob("*.py"))
    for path in files:
        try:
            source = read_source(path, path.as_posix())
        except SourceError:
            continue
        start = time.perf_counter()
        candidates = engine.candidate_rules(rules, source.text)
        phases["triggers"] += time.perf_counter() - start
        if not candidates:
            start = time.perf_counter()
            engine.syntax_error(source)
            phases["syntax check of skipped files"] += time.perf_counter() - start
            continue
        parsed.append((path.relative_to(root).as_posix(), [r.id for r in candidates]))
        per_rule_files.update(r.id for r in candidates)
        start = time.perf_counter()
        try:
            source.module
        except SourceError:
            continue
        phases["LibCST parse"] += time.perf_counter() - start
        start = time.perf_counter()
        analyse(source, candidates, settings)
        phases["facts and rules"] += time.perf_counter() - start
    print(f"{root}: {len(files)} files, {len(parsed)} parsed")
    for phase, seconds in phases.most_common():
        print(f"  {phase:32s} {seconds:6.3f} s")
    print("files let through, per rule:", ", ".join(f"{rule} {n}" for rule, n in per_rule_files.most_common()))
    if list_files:
        for name, ids in parsed:
            print(f"  {name}: {' '.join(ids)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path)
    parser.add_argument("--files", action="store_true", help="list each parsed file and the rules that let it through")
    args = parser.parse_args()
    root = args.dir or torchvision_dir()
    # LibCST's parser recurses; scan runs it on a large stack, and so does this (deeply nested files).
    try:
        from tcaudit.source.deep import call_with_deep_stack
    except ImportError:  # 0.1.0
        profile(root, args.files)
    else:
        call_with_deep_stack(profile, root, args.files)


if __name__ == "__main__":
    main()
