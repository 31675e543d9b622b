"""A scan that needs no model must not import torch (PERF.md: importing torch costs more than
scanning a file). Each check runs in a fresh interpreter, so nothing else in the test session can
have imported torch first."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import FIXTURES, REPO

PROBE = textwrap.dedent(
    """
    import json, sys
    from tcaudit.cli.main import main

    code = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision", "numpy"))
    print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
    """
)


def run_scan(*args: str, cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "scan", *args, "--format", "concise"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, 1), proc.stderr
    return report


def test_training_script_fixture_with_no_exec():
    fixture = FIXTURES / "resnet50" / "train.py"
    report = run_scan(str(fixture), "--no-exec", cwd=REPO)
    assert report["heavy"] == []


def test_script_without_model_construction_with_model_audit_on(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler()


            def step(model, batch, optimizer):
                loss = model(batch).sum()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ).lstrip(),
        encoding="utf-8",
    )
    report = run_scan("train.py", cwd=tmp_path)
    assert report["code"] == 1  # TC202 at least
    assert report["heavy"] == []
