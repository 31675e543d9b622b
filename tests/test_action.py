"""action.yml (the GitHub Action): its YAML, the README's workflow that uses it, and its steps run here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

ACTION = REPO / "action.yml"
RUN = REPO / "action" / "run.sh"
FIXTURE = REPO / "fixtures" / "resnet50" / "train.py"


def _action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def test_action_is_a_composite_action_whose_steps_use_its_inputs():
    action = _action()
    assert action["runs"]["using"] == "composite"
    inputs = action["inputs"]
    assert {"paths", "args", "fail-on-findings", "upload-sarif", "sarif-file", "python-version"} <= set(inputs)
    assert all("description" in spec and "default" in spec for spec in inputs.values())
    text = ACTION.read_text()
    used = set(re.findall(r"inputs\.([\w-]+)", text))
    assert used == set(inputs), f"inputs used but not declared, or declared but unused: {used ^ set(inputs)}"
    steps = action["runs"]["steps"]
    assert all("shell" in step for step in steps if "run" in step)  # composite run steps need a shell
    upload = next(step for step in steps if step.get("uses", "").startswith("github/codeql-action/upload-sarif@"))
    assert "always()" in upload["if"]  # the SARIF is uploaded even when the scan found something
    scan = next(step for step in steps if step.get("id") == "scan")
    assert "action/run.sh" in scan["run"]
    assert set(scan["env"]) == {"INPUT_PATHS", "INPUT_ARGS", "INPUT_SARIF_FILE"}
    assert set(re.findall(r"steps\.scan\.outputs\.([\w-]+)", text)) <= {"sarif-file", "exit-code", "findings"}
    assert "--no-exec" in RUN.read_text()


def test_the_readme_workflow_uses_the_action_as_it_is_declared():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## GitHub Actions", 1)[1].split("\n## ", 1)[0]
    workflow = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    steps = workflow["jobs"]["tcaudit"]["steps"]
    ours = next(step for step in steps if step.get("uses") == "./tools/tcaudit")
    assert set(ours["with"]) <= set(_action()["inputs"])
    assert workflow["permissions"]["security-events"] == "write"
    for name in _action()["inputs"]:
        assert f"`{name}`" in section, f"the README does not document input {name}"


def _run(step: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    tcaudit = shutil.which("tcaudit", path=str(Path(sys.executable).parent))
    command = tcaudit if tcaudit else None
    full = {**os.environ, **env}
    if command is None:  # no console script beside this Python: run the module
        wrapper = cwd / "tcaudit-bin"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tcaudit "$@"\n')
        wrapper.chmod(0o755)
        command = str(wrapper)
    full["TCAUDIT"] = command
    full["PYTHONPATH"] = str(REPO)
    return subprocess.run(["bash", str(RUN), step], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def _outputs(path: Path) -> dict:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.slow
def test_the_scan_step_writes_valid_sarif_annotations_and_outputs(tmp_path):
    from test_reports import assert_valid_sarif

    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    shutil.copy(FIXTURE, project / "src" / "train.py")
    (project / "scripts").mkdir()
    (project / "scripts" / "clean.py").write_text("x = 1\n")
    out = tmp_path / "github_output"
    scan = _run("scan", project, {"INPUT_PATHS": "src scripts", "INPUT_ARGS": "--select TC2 --gpu a100",
                                  "INPUT_SARIF_FILE": "out.sarif", "GITHUB_OUTPUT": str(out)})
    assert scan.returncode == 0, scan.stderr
    outputs = _outputs(out)
    assert outputs["sarif-file"] == "out.sarif" and outputs["exit-code"] == "1"
    log = json.loads((project / "out.sarif").read_text())
    assert_valid_sarif(log)
    rules = {r["ruleId"] for r in log["runs"][0]["results"]}
    assert rules and all(rule.startswith("TC2") for rule in rules)
    assert int(outputs["findings"]) == len(log["runs"][0]["results"])
    assert "::warning file=src/train.py" in scan.stdout  # annotations in the log
    failing = _run("verdict", project, {"SCAN_EXIT": outputs["exit-code"]})
    assert failing.returncode == 1 and "fail-on-findings" in failing.stderr

    clean_out = tmp_path / "clean_output"
    clean = _run("scan", project, {"INPUT_PATHS": "scripts", "INPUT_ARGS": "", "GITHUB_OUTPUT": str(clean_out)})
    assert clean.returncode == 0, clean.stderr
    assert _outputs(clean_out)["exit-code"] == "0" and _outputs(clean_out)["findings"] == "0"
    assert _run("verdict", project, {"SCAN_EXIT": "0"}).returncode == 0


def test_a_usage_error_fails_the_scan_step(tmp_path):
    out = tmp_path / "github_output"
    bad = _run("scan", tmp_path, {"INPUT_PATHS": "missing", "INPUT_ARGS": "", "GITHUB_OUTPUT": str(out)})
    assert bad.returncode == 2 and "no such file or directory: missing" in bad.stderr
    assert _outputs(out)["exit-code"] == "2"


def test_args_and_paths_are_split_as_a_shell_splits_them(tmp_path):
    """Issue 51: `args: --config "fail-on = 'error'"` was cut at each space."""
    project = tmp_path / "my project"
    (project / "src dir").mkdir(parents=True)
    (project / "src dir" / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    out = tmp_path / "github_output"
    scan = _run("scan", project, {"INPUT_PATHS": "'src dir'", "GITHUB_OUTPUT": str(out),
                                  "INPUT_ARGS": "--select TC202 --config \"fail-on = 'error'\""})
    assert scan.returncode == 0, scan.stderr
    assert _outputs(out)["exit-code"] == "0" and _outputs(out)["findings"] == "1"  # a warning, under fail-on error
    bad_out = tmp_path / "bad_output"
    bad = _run("scan", project, {"INPUT_PATHS": ".", "INPUT_ARGS": "--config \"fail-on", "GITHUB_OUTPUT": str(bad_out)})
    assert bad.returncode == 2 and "the action input args cannot be split into arguments" in bad.stderr
    assert _outputs(bad_out)["exit-code"] == "2"
