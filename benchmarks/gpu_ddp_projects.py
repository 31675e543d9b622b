"""The `fix --ddp` project fixtures on a CUDA GPU (issue 48): each project of fixtures/projects whose entry
`tcaudit fix . --ddp --apply` converts is run as it was (one process) and converted, under
`torchrun --standalone --nproc_per_node=N` (NCCL, one rank per GPU; N = the GPUs present, at most 2), and
both must exit 0. Writes a JSON record with the GPU name, torch version and the command.

    python3 benchmarks/gpu_ddp_projects.py OUT.json [PROJECT ...]

The CPU suite runs the same conversions as two gloo ranks (tests/test_projects.py); this run checks what the
CPU cannot: NCCL, `torch.cuda.set_device(LOCAL_RANK)`, the CUDA branches of each patch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "fixtures" / "projects"


def main(out: Path, names: list[str]) -> int:
    import torch

    gpus = torch.cuda.device_count()
    nproc = max(1, min(gpus, 2))
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    record = {
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
        "nproc_per_node": nproc,
        "torch": torch.__version__,
        "command": "python3 benchmarks/gpu_ddp_projects.py OUT.json " + " ".join(names),
        "projects": rows,
    }
    for folder in sorted(p for p in PROJECTS.iterdir() if (p / "expect.toml").is_file()):
        if names and folder.name not in names:
            continue
        entry = tomllib.loads((folder / "expect.toml").read_text())["entry"]
        if not entry.endswith(".py"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / folder.name
            shutil.copytree(folder, work, ignore=shutil.ignore_patterns(".tcaudit_cache", "__pycache__"))
            fix = subprocess.run([sys.executable, "-m", "tcaudit", "fix", ".", "--ddp", "--apply", "--no-exec",
                                  "--isolated", "--no-cache"], cwd=work, env=env, capture_output=True, text=True)
            converted = bool(re.search(rf"^{re.escape(entry)}: --ddp: converted", fix.stderr, re.MULTILINE))
            row = {"project": folder.name, "entry": entry, "converted": converted,
                   "fix_lines": [line for line in fix.stderr.splitlines() if "--ddp" in line or "no fix" in line]}
            if converted:
                original = Path(tmp) / "original"
                shutil.copytree(folder, original, ignore=shutil.ignore_patterns(".tcaudit_cache", "__pycache__"))
                path = ["src"] if (work / "src").is_dir() else []
                for label, cwd, command in (
                    ("original", original, [sys.executable, entry]),
                    ("ddp", work, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         f"--nproc_per_node={nproc}", entry]),
                ):
                    run_env = {**env, "PYTHONPATH": os.pathsep.join([*(str(cwd / p) for p in path), str(cwd),
                                                                     env["PYTHONPATH"]])}
                    start = time.perf_counter()
                    proc = subprocess.run(command, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=600)
                    row[label] = {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1),
                                  "tail": (proc.stdout + proc.stderr)[-1500:]}
            rows.append(row)
            out.write_text(json.dumps(record, indent=2) + "\n")  # what ran so far, should the run be cut off
            print(json.dumps({k: v for k, v in row.items() if k in ("project", "converted")}
                             | {f"{k}_rc": row[k]["rc"] for k in ("original", "ddp") if k in row}), flush=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    failed = [r["project"] for r in rows if r.get("converted") and (r["original"]["rc"] or r["ddp"]["rc"])]
    print("failed:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
