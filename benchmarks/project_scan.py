"""Cold and warm scans of a 50-module project (issue 46): what following a project's imports costs.

Writes a synthetic project (5 training scripts, 45 modules in four packages: models, losses, data,
utilities; each script imports nine of them, the modules import each other),
then times ``tcaudit scan DIR --no-exec`` in a fresh process, cold (``--no-cache``) and warm (a
second scan answered by the cache it filled), for each checkout given, alternating rounds so the
machine's load falls on all of them alike. CPU numbers, on whatever machine runs it.

    python benchmarks/project_scan.py --rounds 5 --out benchmarks/results/project_scan.json CHECKOUT...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELPER = '''"""Helper module {i} of package {pkg}."""
import torch
import torch.nn as nn
{imports}


def helper_{i}(x):
    y = torch.relu(x) * {i}
    return y.sum()


def loss_{i}(pred, target):
    loss = nn.functional.mse_loss(pred, target)
    return loss, loss.detach().cpu()


class Block{i}(nn.Module):
    def __init__(self, width={width}):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x) + helper_{i}(x)
'''

DATA = '''"""Data helpers {i}."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_data(batch_size, workers=0):
    ds = TensorDataset(torch.randn(64, 32), torch.randn(64, 32))
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers)
'''

ENTRY = '''"""Training script {i}."""
import argparse

import torch

{imports}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = models.m{i}.Block{m}().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    loader = data.d{i}.get_data(32, args.workers)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss, host = losses.l{i}.loss_{l}(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())


if __name__ == "__main__":
    main()
'''


def write_project(root: Path) -> int:
    """45 modules in packages and 5 entry scripts; returns the number of Python files."""
    (root / "pyproject.toml").write_text('[project]\nname = "bench"\nversion = "0"\n')
    count = 0
    for pkg, n in (("models", 15), ("losses", 10), ("utils", 14), ("data", 5)):
        folder = root / pkg
        folder.mkdir()
        (folder / "__init__.py").write_text("")
        count += 1
        for j in range(n - 1 if pkg != "data" else n):
            prefix = {"models": "m", "losses": "l", "utils": "u", "data": "d"}[pkg]
            if pkg == "data":
                text = DATA.format(i=j)
            else:
                imports = f"from utils.u{(j + 1) % 9} import helper_{(j + 1) % 9}" if pkg != "utils" else ""
                text = HELPER.format(i=j, pkg=pkg, imports=imports, width=32)
            (folder / f"{prefix}{j}.py").write_text(text)
            count += 1
    for i in range(5):
        imports = "\n".join([f"import models.m{i}", f"import losses.l{i}", f"import data.d{i}",
                             *(f"import utils.u{k}" for k in range(i, i + 6))])
        (root / f"train_{i}.py").write_text(ENTRY.format(i=i, m=i, l=i, imports=imports))
        count += 1
    return count


FINDINGS: dict[str, int] = {}


def timed(checkout: Path, project: Path, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tcaudit", "scan", ".", "--no-exec", "--isolated",
                           "--format", "concise", *args], cwd=project, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{checkout}: scan failed ({proc.returncode})\n{proc.stderr[-3000:]}")
    FINDINGS[str(checkout)] = sum(1 for line in proc.stdout.splitlines() if ": TC" in line)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        files = write_project(project)
        results: dict[str, dict[str, list[float]]] = {str(c): {"cold": [], "warm": []} for c in args.checkouts}
        for _ in range(args.rounds):
            for checkout in args.checkouts:
                cache = Path(tmp) / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                results[str(checkout)]["cold"].append(timed(checkout, project, "--no-cache"))
                timed(checkout, project, "--cache-dir", str(cache))  # fills the cache
                results[str(checkout)]["warm"].append(timed(checkout, project, "--cache-dir", str(cache)))
    summary = {
        "what": f"tcaudit scan of a {files}-file project, --no-exec, fresh process each (CPU, this machine)",
        "rounds": args.rounds,
        "checkouts": {
            name: {**{kind: {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                             "max_s": round(max(times), 3)} for kind, times in runs.items()},
                   "findings": FINDINGS.get(name)}
            for name, runs in results.items()
        },
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
