"""Precision of tcaudit's warnings and errors on our own real-world-shaped scripts (issue 33).

The set: every ``fixtures/fix/all_*.in.py`` (whole training scripts in the shapes of public ones:
pytorch/examples, torchvision references, timm, nanoGPT, minGPT, yolov5, DCGAN/VAE/WGAN-GP, PPO, a
seq2seq with packed sequences, a Lightning-free trainer, ...), every ``fixtures/scripts/*.py`` (the
TRAPS.md / REALWORLD.md shapes, near-miss negatives included) and ``fixtures/resnet50/train.py``.
They are scanned as a user would: ``tcaudit scan`` with the model audit on, ``--gpu sm_90``.

Every warning and error must have a verdict in ``benchmarks/precision/verdicts.toml``: the file, the
rule, the line, ``true`` or ``false``, and why (read against the script, by hand). Info findings are
not judged (they claim no cost). Precision = true / judged. A finding without a verdict makes the run
fail (exit 1) and is listed, so a rule change that adds findings cannot raise the number unseen; a
verdict whose finding is gone is listed as stale.

    python benchmarks/precision.py --out benchmarks/results/precision.json

``--projects`` judges the multi-file projects of ``fixtures/projects/`` instead (issue 46: helpers in
sibling modules and packages, loader factories, a trainer class, notebooks, argparse and config
defaults), each scanned as a folder from inside it, as a user would, against
``benchmarks/precision/projects.toml``; it also lists the problems each project plants that the scan
missed (``misses``: the ``entry_findings`` and ``folder_findings`` of the project's ``expect.toml``).

    python benchmarks/precision.py --projects --out benchmarks/results/precision_projects.json

Needs torch for the model audit (about ten minutes on a 2-core CPU; ``--no-exec`` skips the audit and
judges the script rules only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERDICTS = ROOT / "benchmarks" / "precision" / "verdicts.toml"
PROJECT_VERDICTS = ROOT / "benchmarks" / "precision" / "projects.toml"
PROJECTS = ROOT / "fixtures" / "projects"


def corpus() -> list[Path]:
    files = sorted((ROOT / "fixtures" / "fix").glob("all_*.in.py"))
    files += sorted((ROOT / "fixtures" / "scripts").glob("*.py"))
    files.append(ROOT / "fixtures" / "resnet50" / "train.py")
    return files


def scan(files: list[Path], no_exec: bool, cwd: Path = ROOT) -> list[dict]:
    command = [sys.executable, "-m", "tcaudit", "scan", "--format", "json", "--gpu", "sm_90", "--no-cache",
               "--isolated", "--model-budget", "3600", *(["--no-exec"] if no_exec else []), *map(str, files)]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"scan failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    findings = json.loads(proc.stdout)["findings"]
    for finding in findings:
        finding["path"] = str(cwd / finding["path"])
    return findings


def projects() -> list[Path]:
    return sorted(p for p in PROJECTS.iterdir() if (p / "expect.toml").is_file())


def project_misses(findings: list[dict]) -> list[str]:
    """The planted problems (``expect.toml``'s expected findings) that the folder scans did not report."""
    found = {(Path(f["path"]).resolve().relative_to(ROOT).as_posix(), f["rule"], f["line"]) for f in findings}
    misses = []
    for project in projects():
        spec = tomllib.loads((project / "expect.toml").read_text(encoding="utf-8"))
        for rule, path, line, *_ in spec["folder_findings"]:
            key = ((project / path).relative_to(ROOT).as_posix(), rule, line)
            if key not in found:
                misses.append(f"{key[0]}:{line} {rule}")
    return misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-exec", action="store_true", help="skip the model audit")
    parser.add_argument("--projects", action="store_true", help="judge fixtures/projects/ (each scanned as a folder)")
    args = parser.parse_args()
    source = PROJECT_VERDICTS if args.projects else VERDICTS
    verdicts = {
        (v["file"], v["rule"], v["line"]): v for v in tomllib.loads(source.read_text(encoding="utf-8")).get("verdict", [])
    }
    if args.projects:
        every = [f for project in projects() for f in scan([Path(".")], args.no_exec, cwd=project)]
        files = sum(1 for project in projects() for p in project.rglob("*") if p.suffix in (".py", ".ipynb"))
    else:
        every = scan(corpus(), args.no_exec)
        files = len(corpus())
    findings = [f for f in every if f["severity"] in ("warning", "error")]
    judged: Counter[str] = Counter()
    per_rule: dict[str, Counter[str]] = {}
    unjudged, false = [], []
    seen = set()
    for finding in findings:
        key = (Path(finding["path"]).resolve().relative_to(ROOT).as_posix(), finding["rule"], finding["line"])
        seen.add(key)
        verdict = verdicts.get(key)
        if verdict is None:
            unjudged.append(f"{key[0]}:{key[2]} {key[1]} {finding['message']}")
            continue
        outcome = "true" if verdict["verdict"] else "false"
        judged[outcome] += 1
        per_rule.setdefault(key[1], Counter())[outcome] += 1
        if not verdict["verdict"]:
            false.append(f"{key[0]}:{key[2]} {key[1]}: {verdict['why']}")
    stale = sorted(f"{k[0]}:{k[2]} {k[1]}" for k in verdicts if k not in seen and not (args.no_exec and k[1] < "TC2"))
    total = judged["true"] + judged["false"]
    precision = judged["true"] / total if total else 0.0
    report = {
        "precision": round(precision, 4),
        "true": judged["true"],
        "false": judged["false"],
        "files": files,
        **({"misses": project_misses(every), "projects": len(projects())} if args.projects else {}),
        "model_audit": not args.no_exec,
        "per_rule": {rule: dict(counts) for rule, counts in sorted(per_rule.items())},
        "false_findings": false,
        "unjudged": unjudged,
        "stale_verdicts": stale,
        "command": "python benchmarks/precision.py" + (" --projects" if args.projects else "")
        + (" --no-exec" if args.no_exec else ""),
        "platform": "CPU (the scan needs no GPU; --gpu sm_90 picks the H200 cost table)",
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(f"precision {precision:.1%}: {judged['true']} true, {judged['false']} false of {total} judged warnings "
          f"and errors in {files} files")
    for line in report.get("misses", ()):
        print("  missed:", line)
    for line in false:
        print("  false:", line)
    for line in unjudged:
        print("  unjudged:", line)
    for line in stale:
        print("  stale verdict:", line)
    return 1 if unjudged else 0


if __name__ == "__main__":
    raise SystemExit(main())
