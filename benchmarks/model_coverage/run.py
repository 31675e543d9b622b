"""Model-audit coverage: how many of the model-building scripts in ``scripts/`` the audit reaches,
and what a full folder scan costs cold (empty cache) and warm (everything cached).

    PYTHONPATH=$PWD python benchmarks/model_coverage/run.py [--budget SECONDS] [--json OUT]

A script counts as audited when discovery finds its model and every model found in it was built
and its graph captured (no TC100). Each top-level ``.py`` file and each sub-folder's entry script (``train.py`` / ``main.py``)
is one script; the sub-folders' other files are the project's sibling modules. CPU only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
ENTRY_NAMES = ("train.py", "main.py")


def entry_scripts() -> list[Path]:
    entries = sorted(p for p in SCRIPTS.glob("*.py"))
    for folder in sorted(p for p in SCRIPTS.iterdir() if p.is_dir()):
        entries += [folder / name for name in ENTRY_NAMES if (folder / name).is_file()]
    return entries


def models_found(entry: Path) -> int:
    """How many model constructions discovery finds in the script (no torch needed)."""
    from tcaudit.model import discover_file
    from tcaudit.source.parsing import read_source

    return len(discover_file(read_source(entry, entry.name)))


def scan(cache_dir: Path, budget: float) -> tuple[float, dict]:
    command = [
        sys.executable, "-m", "tcaudit", "scan", *map(str, entry_scripts()), "--select", "TC1", "--format", "json",
        "--cache-dir", str(cache_dir), "--model-budget", str(budget), "--isolated", "--jobs", "1",
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE.parents[1])
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"scan failed ({done.returncode}):\n{done.stderr}")
    return elapsed, json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=600.0, help="--model-budget for the scans")
    parser.add_argument("--json", metavar="OUT", help="write the per-script outcome here")
    args = parser.parse_args()
    entries = entry_scripts()
    cache_dir = Path(tempfile.mkdtemp(prefix="tcaudit-coverage-"))
    try:
        cold, report = scan(cache_dir, args.budget)
        warm, again = scan(cache_dir, args.budget)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    tc100: dict[str, list[str]] = {}
    for finding in report["findings"]:
        if finding["rule"] == "TC100":
            tc100.setdefault(str((HERE.parents[1] / finding["path"]).resolve()), []).append(finding["message"])
    findings_by_script = {str(p.resolve()): 0 for p in entries}
    for finding in report["findings"]:
        path = str((HERE.parents[1] / finding["path"]).resolve())
        if path in findings_by_script:
            findings_by_script[path] += 1
    rows = []
    for entry in entries:
        key = str(entry.resolve())
        rows.append({"script": str(entry.relative_to(SCRIPTS)), "tc100": tc100.get(key, []),
                     "models_found": models_found(entry), "findings": findings_by_script[key]})
    failed = [row for row in rows if row["tc100"] or not row["models_found"]]
    for row in failed:
        print(f"TC100 {row['script']}: {row['tc100'][0]}" if row["tc100"] else f"no model found: {row['script']}")
    silent = [row["script"] for row in rows if not row["findings"]]
    same = [f for f in report["findings"]] == [f for f in again["findings"]]
    print(f"scripts: {len(rows)}; models found: {sum(r['models_found'] for r in rows)}; every model audited "
          f"(found, no TC100): {len(rows) - len(failed)} ({100 * (len(rows) - len(failed)) / len(rows):.0f}%); "
          f"TC100 or no model found: {len(failed)} ({100 * len(failed) / len(rows):.1f}%)")
    if silent:
        print(f"no TC1 finding in the script itself (clean, or the layers live in sibling modules): {', '.join(silent)}")
    print(f"full scan, cold cache: {cold:.1f} s; warm: {warm:.1f} s ({cold / warm:.1f}x); "
          f"warm findings identical: {same}")
    for note in report.get("notes", []):
        if "budget" in note or "constructions" in note:
            print(f"note: {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "cold_s": cold, "warm_s": warm}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
