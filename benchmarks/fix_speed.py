"""Fix speed against scan speed (issue 27, item 4: a warm ``fix`` of a file should cost at most twice a
warm ``scan`` of it).

    .venv/bin/python benchmarks/fix_speed.py [--rounds 3] [--out FILE] [--skip-exec]

Three targets, each copied into its own temporary project folder (a ``pyproject.toml`` with an empty
``[tool.tcaudit]`` table, so the cache lives in that folder's ``.tcaudit_cache``):

* ``fixture``: ``fixtures/resnet50/train.py`` (107 lines);
* ``2k-line file``: the same script followed by generated helpers (metric trackers, residual blocks,
  evaluation loops, warm-up schedules, top-k accuracy, checkpoint savers, each a distinct,
  independent function or class) up to about 2,000 lines; the training loop is the fixture's;
* ``50-file folder``: 25 of ``fixtures/scripts/*.py`` and 25 of ``fixtures/fix/*.in.py`` (the ones
  Python 3 parses, picked with a fixed seed), under their own names.

For each target, with the default settings (the model audit on: it builds the scripts' models) and
with ``--no-exec``, four timings of whole ``python -m tcaudit`` processes run in the project folder:

* ``cold scan``: ``scan --no-cache``;
* ``warm scan``: ``scan`` twice, the second timed (the first fills the cache);
* ``cold fix``: ``fix --no-cache`` when ``fix`` has that flag, else ``fix`` after the cache folder
  is deleted;
* ``warm fix``: ``fix`` after a ``scan`` and a ``fix`` (diff only: the files never change).

``fix`` prints the diff (no ``--apply``), so every round sees the same files. The ratio reported is
warm fix ÷ warm scan, in CPU and wall seconds (the issue's bound is 2). tcaudit runs from a copy of
its package and rule catalog taken at the start (its cache is keyed by its own code). Rounds
(``--rounds``, default 3) take turns over the targets; medians are reported. Writes JSON (``--out``,
default ``benchmarks/results/fix_speed.json``) with the machine, the command lines and every run's
times; these are CPU timings, no GPU is used.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scan_speed import code_version, snapshot_code, time_once

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = REPO / "fixtures"
RESULTS = HERE / "results" / "fix_speed.json"
PYPROJECT = "[tool.tcaudit]\n"


# -- targets --------------------------------------------------------------------------------------------
HELPERS = [
    '''

class MetricTracker{k}:
    """Running average of one metric ({k})."""

    def __init__(self, name, fmt=":f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{{name}} {{val" + self.fmt + "}} ({{avg" + self.fmt + "}})").format(**self.__dict__)
''',
    '''

class ResidualBlock{k}(nn.Module):
    """A basic residual block ({k}), kept for experiments."""

    def __init__(self, channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)
''',
    '''

def evaluate_{k}(model, loader, criterion, device):
    """Top-1 accuracy and mean loss on a validation loader ({k})."""
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for images, target in loader:
            images = images.to(device)
            target = target.to(device)
            output = model(images)
            loss_sum += criterion(output, target).item() * images.size(0)
            correct += (output.argmax(1) == target).sum().item()
            total += images.size(0)
    model.train()
    return correct / max(total, 1), loss_sum / max(total, 1)
''',
    '''

def warmup_cosine_{k}(optimizer, warmup_steps, total_steps, min_ratio=0.0):
    """Linear warm-up then cosine decay ({k})."""
    import math

    def factor(step):
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return optim.lr_scheduler.LambdaLR(optimizer, factor)
''',
    '''

def accuracy_{k}(output, target, topk=(1,)):
    """Precision@k for the given values of k ({k})."""
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    res = []
    for k in topk:
        correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
        res.append(correct_k.mul_(100.0 / batch_size))
    return res
''',
    '''

def save_checkpoint_{k}(model, optimizer, epoch, path="checkpoint_{k}.pt"):
    """Model and optimizer state, written atomically ({k})."""
    import os

    state = {{"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}}
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path
''',
]


def two_thousand_line_file(dest: Path, lines: int = 2000) -> Path:
    """The resnet50 fixture with generated helpers inserted before its ``if __name__`` guard."""
    text = (FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8")
    head, guard, tail = text.partition('\n\nif __name__ == "__main__":')
    parts, count, k = [head], head.count("\n") + 4, 0
    while count < lines:
        block = HELPERS[k % len(HELPERS)].format(k=k)
        parts.append(block)
        count += block.count("\n")
        k += 1
    path = dest / "train.py"
    path.write_text("".join(parts) + "\n" + guard + tail, encoding="utf-8")
    ast.parse(path.read_text(encoding="utf-8"))
    return path


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_bytes().decode("utf-8", "replace"))
    except SyntaxError:
        return False
    return True


def fifty_file_folder(dest: Path, count: int = 50, seed: int = 0) -> list[str]:
    """25 fixture scripts and 25 fix inputs, picked with a fixed seed; returns their repository paths."""
    rng = random.Random(seed)
    scripts = [p for p in sorted((FIXTURES / "scripts").glob("*.py")) if _parses(p)]
    inputs = [p for p in sorted((FIXTURES / "fix").glob("*.in.py")) if _parses(p)]
    picked = rng.sample(scripts, count // 2) + rng.sample(inputs, count - count // 2)
    for path in picked:
        shutil.copyfile(path, dest / path.name)
    return [p.relative_to(REPO).as_posix() for p in picked]


def describe(paths: list[Path]) -> dict:
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))]
    return {"files": len(files), "lines": sum(len(f.read_bytes().splitlines()) for f in files)}


# -- timing -----------------------------------------------------------------------------------------------
def fix_has_no_cache(code: Path, env: dict) -> bool:
    proc = subprocess.run([sys.executable, "-m", "tcaudit", "fix", "--help"], cwd=code, env=env,
                          capture_output=True, text=True)
    return "--no-cache" in proc.stdout


def measure(project: Path, target: str, extra: list[str], env: dict, fix_cache_flag: bool) -> dict[str, dict]:
    """The four timings of one target and one variant, once."""
    cli = [sys.executable, "-m", "tcaudit"]
    scan = [*cli, "scan", target, "--format", "concise", *extra]
    fix = [*cli, "fix", target, "--color", "never", *extra]
    cache = project / ".tcaudit_cache"

    def run(command):
        return time_once(command, project, env)

    out = {}
    shutil.rmtree(cache, ignore_errors=True)
    out["cold scan"] = {**run([*scan, "--no-cache"]), "command": " ".join([*scan, "--no-cache"])}
    shutil.rmtree(cache, ignore_errors=True)
    run(scan)
    out["warm scan"] = {**run(scan), "command": " ".join(scan) + "  (second of two)"}
    shutil.rmtree(cache, ignore_errors=True)
    if fix_cache_flag:
        out["cold fix"] = {**run([*fix, "--no-cache"]), "command": " ".join([*fix, "--no-cache"])}
    else:
        out["cold fix"] = {**run(fix), "command": " ".join(fix) + "  (cache folder deleted first)"}
    shutil.rmtree(cache, ignore_errors=True)
    run(scan)
    run(fix)
    out["warm fix"] = {**run(fix), "command": " ".join(fix) + "  (after a scan and a fix)"}
    return out


def summarize(runs: list[dict]) -> dict:
    return {
        "command": runs[-1]["command"],
        "runs": [{k: v for k, v in r.items() if k != "command"} for r in runs],
        "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
        "exit_codes": sorted({r["exit_code"] for r in runs}),
    }


def torch_version() -> str | None:
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--out", metavar="FILE", default=str(RESULTS), help="where to write the JSON results")
    parser.add_argument("--skip-exec", action="store_true",
                        help="time only the --no-exec variant (no model audit)")
    args = parser.parse_args()
    variants = {"--no-exec": ["--no-exec"]} if args.skip_exec else {"default (model audit)": [], "--no-exec": ["--no-exec"]}

    load_before = os.getloadavg()
    timings: dict[str, dict[str, dict[str, list[dict]]]] = {}
    with tempfile.TemporaryDirectory(prefix="tcaudit-fixbench-") as tmp:
        scratch = Path(tmp)
        code = snapshot_code(scratch / "code")
        env = {**os.environ, "PYTHONPATH": str(code)}
        fix_cache_flag = fix_has_no_cache(code, env)
        projects: dict[str, tuple[Path, str, dict]] = {}
        for name in ("fixture", "2k-line file", "50-file folder"):
            project = scratch / name.replace(" ", "_")
            project.mkdir()
            (project / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
            if name == "fixture":
                shutil.copyfile(FIXTURES / "resnet50" / "train.py", project / "train.py")
                projects[name] = (project, "train.py", {"source": "fixtures/resnet50/train.py"})
            elif name == "2k-line file":
                two_thousand_line_file(project)
                projects[name] = (project, "train.py", {"source": "fixtures/resnet50/train.py + generated helpers"})
            else:
                (project / "scripts").mkdir()
                used = fifty_file_folder(project / "scripts")
                projects[name] = (project, "scripts", {"source": "fixtures/scripts + fixtures/fix/*.in.py, seed 0",
                                                       "files_used": used})
            info = describe([project / projects[name][1]])
            projects[name][2].update(info)
            print(f"target {name}: {info['files']} files, {info['lines']} lines", file=sys.stderr)
        # Untimed: compiles the copy's bytecode, so that the first timed run is not the slowest.
        subprocess.run([sys.executable, "-m", "tcaudit", "scan", str(scratch), "--no-exec", "--no-cache", "--isolated"],
                       cwd=code, env=env, capture_output=True)
        for index in range(args.rounds):
            for name, (project, target, _) in projects.items():
                for variant, extra in variants.items():
                    runs = measure(project, target, extra, env, fix_cache_flag)
                    for kind, run in runs.items():
                        timings.setdefault(name, {}).setdefault(variant, {}).setdefault(kind, []).append(run)
                        print(f"  {name} [{variant}] {kind} round {index + 1}/{args.rounds}: {run['wall_s']:.2f} s "
                              f"wall, {run['cpu_s']:.2f} s CPU, exit {run['exit_code']}", file=sys.stderr)
    load_after = os.getloadavg()

    targets = {}
    for name, per_variant in timings.items():
        targets[name] = {"target": projects[name][2], "variants": {}}
        for variant, per_kind in per_variant.items():
            summary = {kind: summarize(runs) for kind, runs in per_kind.items()}
            warm_scan, warm_fix = summary["warm scan"], summary["warm fix"]
            summary["warm fix / warm scan"] = {
                "cpu": round(warm_fix["median_cpu_s"] / max(warm_scan["median_cpu_s"], 1e-9), 2),
                "wall": round(warm_fix["median_wall_s"] / max(warm_scan["median_wall_s"], 1e-9), 2),
            }
            targets[name]["variants"][variant] = summary
            bad = {k: v["exit_codes"] for k, v in summary.items() if "exit_codes" in v and set(v["exit_codes"]) - {0, 1}}
            if bad:
                print(f"warning: tcaudit exited {bad} on {name} [{variant}]", file=sys.stderr)

    results = {
        "benchmark": "fix_speed",
        "timings": "CPU only: wall-clock and CPU seconds of whole processes on this machine; no GPU involved",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(load_after[0], 2),
        },
        "python": platform.python_version(),
        "torch": torch_version(),
        "rounds": args.rounds,
        "fix_has_no_cache_flag": fix_cache_flag,
        "command": " ".join([".venv/bin/python", "benchmarks/fix_speed.py", *sys.argv[1:]]),
        "tcaudit_code": code_version(),
        "targets": targets,
    }
    output = Path(args.out)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    print(f"\nFix speed vs scan speed (CPU timings, no GPU), {os.cpu_count()} CPUs, median of {args.rounds} "
          f"round(s); load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
          + ("" if fix_cache_flag else "; `fix` has no --no-cache: cold fix = fix after deleting the cache"))
    print("\n| target | variant | cold scan | warm scan | cold fix | warm fix | warm fix ÷ warm scan (CPU, wall) |")
    print("|---|---|---|---|---|---|---|")
    for name, data in targets.items():
        for variant, summary in data["variants"].items():
            cells = " | ".join(
                f"{summary[kind]['median_cpu_s']:.2f} / {summary[kind]['median_wall_s']:.2f}"
                for kind in ("cold scan", "warm scan", "cold fix", "warm fix")
            )
            ratio = summary["warm fix / warm scan"]
            print(f"| {name} ({data['target']['lines']} lines) | {variant} | {cells} | "
                  f"{ratio['cpu']:.1f}x, {ratio['wall']:.1f}x |")
    print("\n(cells: CPU s / wall s)")
    shown = output.relative_to(REPO) if output.is_relative_to(REPO) else output
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
