"""What LibCST's pieces cost on a real corpus, to justify the scanner's design.

    .venv/bin/python benchmarks/cst_costs.py [DIR]   # default: torchvision's installed package

Times (CPU, single process): reading, ``ast.parse``, ``libcst.parse_module``, PositionProvider,
ParentNodeProvider, ScopeProvider, QualifiedNameProvider, and tcaudit's own ScriptFacts pass.
Writes benchmarks/results/cst_costs.json.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from tcaudit.script.facts import ScriptFacts
from tcaudit.source.parsing import SourceFile


def corpus_dir() -> Path:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchvision is not installed; pass a folder")
    return Path(list(spec.submodule_search_locations)[0])


def timed(label, fn, results):
    start = time.perf_counter()
    value = fn()
    results[label] = round(time.perf_counter() - start, 3)
    print(f"{label:<28} {results[label]:>8.2f} s", flush=True)
    return value


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else corpus_dir()
    files = sorted(root.rglob("*.py"))
    results: dict[str, float] = {}
    texts = timed("read", lambda: [f.read_text(encoding="utf-8", errors="replace") for f in files], results)
    lines = sum(t.count("\n") for t in texts)
    print(f"{len(files)} files, {lines} lines under {root}")
    timed("ast.parse", lambda: [ast.parse(t) for t in texts], results)
    modules = timed("libcst.parse_module", lambda: [cst.parse_module(t) for t in texts], results)
    for label, provider in (
        ("+ PositionProvider", PositionProvider),
        ("+ ParentNodeProvider", ParentNodeProvider),
        ("+ ScopeProvider", ScopeProvider),
        ("+ QualifiedNameProvider", QualifiedNameProvider),
    ):
        timed(label, lambda p=provider: [MetadataWrapper(m, unsafe_skip_copy=True).resolve(p) for m in modules], results)

    def facts():
        for path, text, module in zip(files, texts, modules):
            source = SourceFile(path=path, display_path=str(path), raw=b"", text=text, encoding="utf-8")
            source._module = module
            ScriptFacts(source).training_steps

    timed("+ ScriptFacts (one pass)", facts, results)
    out = {
        "corpus": str(root),
        "files": len(files),
        "lines": lines,
        "seconds": results,
        "python": platform.python_version(),
        "libcst": cst.__version__ if hasattr(cst, "__version__") else "",
        "cpu_count": os.cpu_count(),
        "machine": "CPU (no GPU)",
        "command": "python benchmarks/cst_costs.py " + " ".join(sys.argv[1:]),
    }
    target = Path(__file__).resolve().parent / "results" / "cst_costs.json"
    target.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
