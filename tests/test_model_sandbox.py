"""The audit child and its switches: torch stays out of the scanner, --no-exec, no torch, a broken
torch, and the one-process-per-model path used where fork is not available."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import tcaudit.model as model_audit
import tcaudit.model.sandbox as sandbox
from conftest import FIXTURES, REPO
from tcaudit.config import Settings
from tcaudit.engine import run_model_audit
from tcaudit.model import discover_file
from tcaudit.model.sandbox import Limits, Sandbox, run_once
from tcaudit.source.parsing import read_source

MLP = FIXTURES / "models" / "mlp_4095.py"

PROBE = textwrap.dedent(
    """
    import json, sys
    from tcaudit.cli.main import main

    code = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision", "numpy"))
    print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
    """
)


@pytest.mark.slow
def test_the_scanner_never_imports_torch_even_when_it_audits_a_model():
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "scan", str(MLP), "--select", "TC1", "--format", "json"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert report["code"] == 1
    assert [f["rule"] for f in json.loads(proc.stdout)["findings"]] == ["TC101"] * 3


def test_no_exec_builds_nothing(monkeypatch):
    def forbidden():
        raise AssertionError("the sandbox must not start with exec-models off")

    monkeypatch.setattr(sandbox, "shared_sandbox", forbidden)
    result = run_model_audit([read_source(MLP)], Settings(select=("TC1",), exec_models=False))
    assert (result.findings, result.notes, result.errors) == ([], [], [])


def test_without_torch_one_note(monkeypatch):
    monkeypatch.setattr(model_audit, "torch_available", lambda: False)
    result = run_model_audit([read_source(MLP)], Settings(select=("TC1",)))
    assert result.notes == [model_audit.TORCH_MISSING_NOTE] and not result.findings


def test_no_model_rule_selected_builds_nothing(monkeypatch):
    monkeypatch.setattr(sandbox, "shared_sandbox", lambda: (_ for _ in ()).throw(AssertionError("started")))
    result = run_model_audit([read_source(MLP)], Settings(select=("TC2",)))
    assert not result.findings and not result.notes


@pytest.mark.slow
def test_a_torch_that_cannot_be_imported_is_a_note(monkeypatch, tmp_path):
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    environment = sandbox.child_environment

    def with_broken_torch(*args):
        env = environment(*args)
        env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
        return env

    fresh = Sandbox()
    monkeypatch.setattr(sandbox, "child_environment", with_broken_torch)
    monkeypatch.setattr(sandbox, "shared_sandbox", lambda: fresh)
    result = run_model_audit([read_source(MLP)], Settings(select=("TC1",)))
    fresh.close()
    assert not result.findings and not result.errors
    [note] = result.notes
    assert note.startswith("model checks (TC1) skipped: the audit process could not start torch")
    assert "libtorch_cpu.so" in note


@pytest.mark.slow
def test_one_process_per_model_without_fork():
    pytest.importorskip("torch")
    [(target, failure, _)] = discover_file(read_source(MLP))
    assert failure is None
    facts = run_once({"target": target, "precision": "float16", "limits": {"time_limit": 120}}, Limits(120.0))
    assert facts.status == "ok" and facts.compute_dtype == "float16"
    assert sorted({op.module for op in facts.ops if op.kind == "gemm"}) == ["body.0", "body.2", "body.4", "head"]
