"""Scan speed: ``tcaudit scan`` against TorchFix 0.7, cold and warm, plus the pre-commit hook.

    .venv/bin/python benchmarks/scan_speed.py [--repeat 3] [--torchfix PATH] [--skip-precommit]

Two targets, scanned by both tools in the same run:

* ``torchvision``: torchvision's installed package (located in a child process, so this one never
  imports torch), 185 library files, none of them a training script;
* ``scripts``: a corpus of generated training scripts: each concatenates 2-5 of the repository's
  ``fixtures/scripts/*.py`` (the ones Python 3 can parse), picked with a fixed seed, so every script
  is different and every rule family fires somewhere (``--corpus-size``, default 200).

Every run is a fresh process, timed from outside. tcaudit runs ``scan --no-exec --format concise
--isolated`` with every rule, three ways: cold with the default ``--jobs`` (one worker per core;
an empty cache folder, so the time includes writing it), cold with ``--jobs 1`` (in-process), and
warm (the cache filled by the cold run, nothing changed). TorchFix runs ``torchfix --select ALL``
with its default job count (one per core). tcaudit runs from a copy of its package and rule
catalog taken at the start (its cache is keyed by its own code: edits to the working tree during
the run would otherwise turn warm scans cold). The tools take turns, round by round, so that other
work on the machine slows them alike; the 1-minute load average before and after is recorded.

TorchFix pins an older LibCST, so it lives in its own virtualenv, never in the project's:
``--torchfix PATH``, else ``$TCAUDIT_BENCH_TORCHFIX``, else ``/tmp/tfvenv/bin/torchfix``,
``/tmp/torchfix-venv/bin/torchfix``, beside this Python, or on PATH. When none is found it is
skipped with a message and the ratios are left out.

The pre-commit part installs this working tree (a snapshot committed to a throwaway git repository)
as a pre-commit hook repository in a throwaway project, using the repository's own
``.pre-commit-hooks.yaml`` (hook ``tcaudit``), and times ``pre-commit run tcaudit --files train.py``
after editing ``train.py`` each time (so tcaudit's cache misses on it, as on a real commit), next to
the same ``tcaudit scan`` command run directly from the hook's environment, which shows what
pre-commit itself adds. Installing the hook's environment needs the package index; it is timed
apart and not counted.

One large file: ``scan`` (``--jobs 1``, no cache) and ``fix`` (the diff) of one generated file of
training-step functions at 2,000 and 20,000 lines (``--large-file-lines``), with ``ruff check`` of
the same file for scale; the CPU ratio largest/smallest shows whether time grows linearly with the
file. ``--large-file-only`` times just this case (into ``results/scan_speed_large_file.json``);
``--tcaudit-code DIR`` runs another checkout's tcaudit for before/after numbers.

Prints tables and writes ``benchmarks/results/scan_speed.json`` (CPU timings: no GPU is involved).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "scan_speed.json"
TORCHFIX_CANDIDATES = ("/tmp/tfvenv/bin/torchfix", "/tmp/torchfix-venv/bin/torchfix")


# -- targets --------------------------------------------------------------------------------------------
def locate_torchvision() -> Path:
    """torchvision's package folder, found in a child process so this one never imports torch."""
    proc = subprocess.run(
        [sys.executable, "-c", "import pathlib, torchvision; print(pathlib.Path(torchvision.__file__).parent)"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"torchvision is not importable here ({proc.stderr.strip().splitlines()[-1:]}); pass --target DIR")
    return Path(proc.stdout.strip())


def generate_corpus(dest: Path, count: int = 200, seed: int = 0) -> list[str]:
    """Write ``count`` training scripts into ``dest``; returns the fixture names used."""
    sources = []
    for path in sorted((REPO / "fixtures" / "scripts").glob("*.py")):
        text = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
        try:
            ast.parse(text)
        except SyntaxError:
            continue  # the Python 2 fixture: one TC000 and nothing else to analyse
        sources.append((path.name, text))
    dest.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        rng = random.Random(seed * 100_003 + index)
        parts = rng.sample(sources, rng.randint(2, 5))
        body = "\n\n".join(f"# --- from fixtures/scripts/{name} ---\n{text}" for name, text in parts)
        (dest / f"train_{index:03d}.py").write_text(
            f'"""Generated training script {index} (benchmarks/scan_speed.py)."""\n{body}', encoding="utf-8"
        )
    return [name for name, _ in sources]


def describe(target: Path) -> dict:
    files = sorted(target.rglob("*.py"))
    return {"path": str(target), "files": len(files), "lines": sum(len(f.read_bytes().splitlines()) for f in files)}


# -- tools ------------------------------------------------------------------------------------------------
def version_of(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def find_torchfix(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    candidates = [os.environ.get("TCAUDIT_BENCH_TORCHFIX", ""), *TORCHFIX_CANDIDATES,
                  str(Path(sys.executable).with_name("torchfix"))]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    return shutil.which("torchfix")


def tool_version(command: list[str]) -> str:
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True)
    return (proc.stdout or proc.stderr).strip().splitlines()[-1] if proc.returncode == 0 else "unknown"


# -- timing -----------------------------------------------------------------------------------------------
def time_once(command: list[str], cwd: Path, env: dict | None = None) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "exit_code": proc.returncode,
        "output_lines": len(proc.stdout.splitlines()),
        "stderr_tail": proc.stderr.strip().splitlines()[-3:],
    }


def summarize(command: list[str], runs: list[dict]) -> dict:
    return {
        "command": " ".join(command),
        "runs": runs,
        "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
        "output_lines": runs[-1]["output_lines"],
        "exit_codes": sorted({r["exit_code"] for r in runs}),
    }


def snapshot_code(dest: Path) -> Path:
    """A copy of tcaudit's package and rule catalog, run from there (``python -m tcaudit`` in it).

    tcaudit's cache is keyed by its own code, so an edit to the working tree in the middle of a
    run would turn a warm scan cold; the copy keeps one version of the code for the whole run."""
    shutil.copytree(REPO / "tcaudit", dest / "tcaudit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "rules", dest / "rules")
    return dest


def measure_target(target: Path, repeat: int, torchfix: str | None, scratch: Path, code: Path) -> dict[str, dict]:
    """One target: tcaudit cold (default jobs), cold --jobs 1, warm; TorchFix. ``repeat`` rounds."""
    cache = scratch / "cache"
    base = [sys.executable, "-m", "tcaudit", "scan", str(target), "--no-exec", "--format", "concise", "--isolated",
            "--cache-dir", str(cache)]
    variants = {
        "tcaudit cold": base,
        "tcaudit cold --jobs 1": [*base, "--jobs", "1"],
        "tcaudit warm": base,
    }
    commands = dict(variants)
    if torchfix:
        commands["TorchFix"] = [torchfix, "--select", "ALL", str(target)]
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for index in range(repeat):
        for name, command in commands.items():
            if name.startswith("tcaudit cold"):
                shutil.rmtree(cache, ignore_errors=True)  # cold: nothing cached (the warm run follows a cold one)
            run = time_once(command, code if name.startswith("tcaudit") else REPO)
            runs[name].append(run)
            print(f"  {target.name}: {name} run {index + 1}/{repeat}: {run['wall_s']:.2f} s wall, "
                  f"{run['cpu_s']:.2f} s CPU, exit {run['exit_code']}, {run['output_lines']} lines", file=sys.stderr)
    return {name: summarize(commands[name], runs[name]) for name in commands}


# -- one large file ---------------------------------------------------------------------------------------
TRAINING_STEP = """
def train_step_{index}(model, batch, optimizer, scaler):
    images, labels = batch
    images = images.cuda()
    labels = labels.cuda()
    optimizer.zero_grad()
    with torch.cuda.amp.autocast():
        out = model(images)
        loss = F.cross_entropy(out, labels)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()
"""


def training_steps_file(dest: Path, lines: int) -> Path:
    """A file of ``lines`` lines, all training-step functions (a TC202 finding and fix in each)."""
    parts = ["import torch\nimport torch.nn.functional as F\n\nscaler = torch.cuda.amp.GradScaler()\n"]
    count = parts[0].count("\n")
    index = 0
    while count < lines:
        step = TRAINING_STEP.format(index=index)
        parts.append(step)
        count += step.count("\n")
        index += 1
    path = dest / f"steps_{lines}.py"
    path.write_text("".join(parts), encoding="utf-8")
    return path


def measure_large_file(sizes: list[int], repeat: int, scratch: Path, code: Path) -> dict:
    """scan and fix (diff only) of one file of training steps per size, in-process (--jobs 1, no
    cache), with ruff on the same file for scale; the ratio largest/smallest says whether the time
    grows linearly with the file."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).is_file() and not shutil.which(ruff):
        ruff = None
    out: dict = {"sizes": sizes, "tools": {}}
    for lines in sizes:
        path = training_steps_file(scratch, lines)
        commands = {
            "tcaudit scan": [sys.executable, "-m", "tcaudit", "scan", str(path), "--no-exec", "--no-cache",
                             "--isolated", "--jobs", "1", "--format", "concise"],
            "tcaudit fix": [sys.executable, "-m", "tcaudit", "fix", str(path), "--isolated", "--color", "never"],
        }
        if ruff:
            commands["ruff check"] = [ruff, "check", "--no-cache", "--isolated", "--quiet", str(path)]
        for name, command in commands.items():
            runs = []
            for index in range(repeat):
                run = time_once(command, code if name.startswith("tcaudit") else REPO)
                runs.append(run)
                print(f"  steps_{lines}.py: {name} run {index + 1}/{repeat}: {run['wall_s']:.2f} s wall, "
                      f"{run['cpu_s']:.2f} s CPU, exit {run['exit_code']}", file=sys.stderr)
            out["tools"].setdefault(name, {})[str(lines)] = summarize(command, runs)
    small, large = str(min(sizes)), str(max(sizes))
    out["cpu_ratio_largest_to_smallest"] = {
        name: round(data[large]["median_cpu_s"] / max(data[small]["median_cpu_s"], 1e-9), 2)
        for name, data in out["tools"].items()
    }
    return out


def large_file_table(data: dict) -> list[str]:
    sizes = [str(size) for size in data["sizes"]]
    lines = ["\nOne file of training-step functions (CPU seconds, median):\n",
             "| command | " + " | ".join(f"{size} lines" for size in sizes) + " | ratio |",
             "|---|" + "---|" * (len(sizes) + 1)]
    for name, per_size in data["tools"].items():
        cells = " | ".join(f"{per_size[size]['median_cpu_s']:.2f}" for size in sizes)
        lines.append(f"| {name} | {cells} | {data['cpu_ratio_largest_to_smallest'][name]:.1f}x |")
    return lines


# -- pre-commit -------------------------------------------------------------------------------------------
def git(*args: str, cwd: Path, env: dict) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def measure_precommit(repeat: int, scratch: Path) -> dict:
    """``pre-commit run tcaudit --files train.py`` with this working tree as the hook repository."""
    pre_commit = Path(sys.executable).with_name("pre-commit")
    if not pre_commit.is_file():
        found = shutil.which("pre-commit")
        if found is None:
            return {"skipped": "pre-commit is not installed (pip install pre-commit)"}
        pre_commit = Path(found)
    if shutil.which("git") is None:
        return {"skipped": "git is not installed"}
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PRE_COMMIT")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="bench",
               GIT_AUTHOR_EMAIL="bench@example.invalid", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@example.invalid", PRE_COMMIT_HOME=str(scratch / "pre-commit-home"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    # The hook repository: this working tree (tracked and untracked files git does not ignore).
    hooks = scratch / "tcaudit-snapshot"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (hooks / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, hooks / name)
    git("init", "-q", cwd=hooks, env=env)
    git("add", "-A", cwd=hooks, env=env)
    git("commit", "-q", "-m", "snapshot", cwd=hooks, env=env)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hooks, capture_output=True, text=True, check=True).stdout
    # The project: one training script, committed, then edited before every timed run.
    project = scratch / "project"
    project.mkdir()
    script = project / "train.py"
    script.write_bytes((REPO / "fixtures" / "resnet50" / "train.py").read_bytes())
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hooks}\n    rev: {rev.strip()}\n    hooks:\n      - id: tcaudit\n", encoding="utf-8"
    )
    git("init", "-q", cwd=project, env=env)
    git("add", "-A", cwd=project, env=env)
    git("commit", "-q", "-m", "start", cwd=project, env=env)
    start = time.perf_counter()
    install = subprocess.run([str(pre_commit), "install-hooks"], cwd=project, env=env, capture_output=True, text=True)
    install_s = round(time.perf_counter() - start, 1)
    if install.returncode != 0:
        return {"skipped": f"pre-commit install-hooks failed: {install.stderr.strip().splitlines()[-1:]}"}
    hook_tcaudit = next((scratch / "pre-commit-home").glob("repo*/py_env-*/bin/tcaudit"), None)
    hook_entry = ["scan", "--no-exec", "--force-exclude", "--format", "concise"]  # .pre-commit-hooks.yaml
    commands = {"pre-commit run": [str(pre_commit), "run", "tcaudit", "--files", "train.py"]}
    if hook_tcaudit is not None:
        commands["tcaudit scan (hook's env)"] = [str(hook_tcaudit), *hook_entry, "train.py"]
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    edit = 0
    for index in range(repeat + 1):  # the first round warms the disk and pre-commit's own caches
        for name, command in commands.items():
            edit += 1
            with script.open("a", encoding="utf-8") as out:
                out.write(f"# edit {edit}\n")  # a changed file: tcaudit's cache misses on it
            run = time_once(command, project, env)
            if index:
                runs[name].append(run)
            print(f"  pre-commit: {name} run {index}/{repeat}{' (warm-up)' if not index else ''}: "
                  f"{run['wall_s']:.2f} s wall, exit {run['exit_code']}", file=sys.stderr)
    return {
        "hook": "tcaudit (.pre-commit-hooks.yaml)",
        "pre_commit_version": tool_version([str(pre_commit)]),
        "install_hooks_s": install_s,
        "file": "fixtures/resnet50/train.py, edited before each run",
        **{name: summarize(commands[name], runs[name]) for name in commands},
    }


def code_version() -> str:
    """The commit the measured code is based on, and whether the working tree differed from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "tcaudit", "rules"], cwd=REPO, capture_output=True,
                           text=True)
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    changed = len(dirty.stdout.splitlines())
    return f"{head.stdout.strip()}" + (f" + {changed} changed files under tcaudit/ and rules/" if changed else "")


# -- report -----------------------------------------------------------------------------------------------
def table(name: str, info: dict, tools: dict[str, dict]) -> list[str]:
    lines = [f"\n{name}: {info['files']} files, {info['lines']} lines", "",
             "| run | wall (s) | CPU (s) | files/s (wall) | output lines | TorchFix wall ÷ this |",
             "|---|---|---|---|---|---|"]
    torchfix = tools.get("TorchFix", {}).get("median_wall_s")
    for run, data in tools.items():
        wall = data["median_wall_s"]
        rate = info["files"] / wall if wall else float("inf")
        ratio = f"{torchfix / wall:.1f}x" if torchfix and run != "TorchFix" else "-"
        lines.append(f"| {run} | {wall:.2f} | {data['median_cpu_s']:.2f} | {rate:.0f} | {data['output_lines']} | "
                     f"{ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--torchfix", metavar="PATH", help="the torchfix executable (see above for the default)")
    parser.add_argument("--target", metavar="DIR", help="scan this folder instead of torchvision's package")
    parser.add_argument("--corpus-size", type=int, default=200, help="generated training scripts (default 200)")
    parser.add_argument("--skip-precommit", action="store_true", help="leave out the pre-commit timing")
    parser.add_argument("--output", metavar="FILE", default=str(RESULTS), help="where to write the JSON results")
    parser.add_argument("--large-file-lines", default="2000,20000", metavar="N,N",
                        help="sizes of the one-large-file case (default 2000,20000)")
    parser.add_argument("--large-file-only", action="store_true",
                        help="time only the one-large-file case (scan, fix, ruff); writes scan_speed_large_file.json")
    parser.add_argument("--tcaudit-code", metavar="DIR",
                        help="run tcaudit from this checkout instead of this one (for before/after numbers)")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.large_file_lines.split(","))
    if args.large_file_only:
        return main_large_file(args, sizes)

    torchfix = find_torchfix(args.torchfix)
    versions = {"tcaudit": version_of("tcaudit"), "libcst": version_of("libcst")}
    if torchfix is None:
        print("TorchFix skipped: no torchfix executable found. Install it into its own virtualenv (it pins an "
              "older LibCST): python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install torchfix==0.7.0; "
              "or pass --torchfix PATH / set TCAUDIT_BENCH_TORCHFIX", file=sys.stderr)
    else:
        versions["torchfix"] = tool_version([torchfix])

    load_before = os.getloadavg()
    targets: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tcaudit-bench-") as tmp:
        scratch = Path(tmp)
        vision = Path(args.target).resolve() if args.target else locate_torchvision()
        corpus = scratch / "scripts"
        used = generate_corpus(corpus, args.corpus_size)
        code = snapshot_code(scratch / "code")
        # Untimed: compiles the copy's bytecode, so that the first timed run is not the slowest.
        subprocess.run([sys.executable, "-m", "tcaudit", "scan", str(corpus), "--no-exec", "--no-cache", "--isolated"],
                       cwd=code, capture_output=True)
        plan = {
            "torchvision" if not args.target else vision.name: (vision, {"package": "torchvision",
                                                                         "version": version_of("torchvision")}),
            "scripts": (corpus, {"generated_from": f"{len(used)} fixtures/scripts/*.py, 2-5 per script, seed 0"}),
        }
        for name, (target, extra) in plan.items():
            info = {**describe(target), **extra}
            print(f"target {name}: {info['path']} ({info['files']} files, {info['lines']} lines)", file=sys.stderr)
            (scratch / name).mkdir(exist_ok=True)
            tools = measure_target(target, args.repeat, torchfix, scratch / name, code)
            targets[name] = {"target": info, "tools": tools}
        large_file = measure_large_file(sizes, args.repeat, scratch, code)
        precommit = {"skipped": "--skip-precommit"} if args.skip_precommit else measure_precommit(args.repeat, scratch)
    load_after = os.getloadavg()

    for name, data in targets.items():
        code_runs = {k: v["exit_codes"] for k, v in data["tools"].items() if k.startswith("tcaudit")}
        if any(code not in (0, 1) for codes in code_runs.values() for code in codes):
            print(f"warning: tcaudit exited {code_runs} on {name}", file=sys.stderr)
    results = {
        "benchmark": "scan_speed",
        "timings": "CPU only: wall-clock and CPU seconds of whole processes on this machine; no GPU involved",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            # Other work on the machine skews wall times; the 1-minute load average shows how much.
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(load_after[0], 2),
        },
        "python": platform.python_version(),
        "versions": versions,
        "repeat": args.repeat,
        "command": " ".join([".venv/bin/python", "benchmarks/scan_speed.py", *sys.argv[1:]]),
        "tcaudit_code": code_version(),
        "targets": targets,
        "large_file": large_file,
        "pre_commit": precommit,
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    print(f"\nScan speed (CPU timings), {os.cpu_count()} CPUs, median of {args.repeat} runs; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    for name, data in targets.items():
        print("\n".join(table(name, data["target"], data["tools"])))
    print("\n".join(large_file_table(large_file)))
    if "skipped" in precommit:
        print(f"\npre-commit: skipped ({precommit['skipped']})")
    else:
        print(f"\npre-commit on one changed file ({precommit['pre_commit_version']}; hook environment installed "
              f"in {precommit['install_hooks_s']} s, not counted):\n")
        print("| command | wall (s) | CPU (s) |\n|---|---|---|")
        for name in ("pre-commit run", "tcaudit scan (hook's env)"):
            if name in precommit:
                print(f"| {name} | {precommit[name]['median_wall_s']:.2f} | {precommit[name]['median_cpu_s']:.2f} |")
    shown = output.relative_to(REPO) if output.is_relative_to(REPO) else output
    print(f"\nwrote {shown}")
    return 0


def main_large_file(args, sizes: list[int]) -> int:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tcaudit-bench-") as tmp:
        scratch = Path(tmp)
        code = Path(args.tcaudit_code).resolve() if args.tcaudit_code else snapshot_code(scratch / "code")
        data = measure_large_file(sizes, args.repeat, scratch, code)
    load_after = os.getloadavg()
    data.update({
        "benchmark": "scan_speed large file",
        "timings": "CPU only: CPU seconds of whole processes (--jobs 1); no GPU involved",
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m_before": round(load_before[0], 2),
        "loadavg_1m_after": round(load_after[0], 2),
        "tcaudit_code": args.tcaudit_code or code_version(),
        "command": " ".join([".venv/bin/python", "benchmarks/scan_speed.py", *sys.argv[1:]]),
    })
    output = Path(args.output) if args.output != str(RESULTS) else RESULTS.with_name("scan_speed_large_file.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print("\n".join(large_file_table(data)))
    print(f"\nload average {load_before[0]:.2f} before, {load_after[0]:.2f} after; wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
