"""Shared test helpers: scan a snippet or a file with a chosen rule set."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tcaudit.config import Settings
from tcaudit.engine import scan


def scan_code(tmp_path: Path, code: str, select: tuple[str, ...] = ("ALL",), name: str = "train.py", **settings):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return scan_paths([str(path)], select=select, root=tmp_path, **settings)


def scan_paths(paths: list[str], select: tuple[str, ...] = ("ALL",), model_audit: bool = False, **settings):
    settings.setdefault("root", Path(paths[0]).parent)
    result = scan(paths, Settings(select=select, **settings), model_audit=model_audit)
    assert not result.errors, result.errors
    return result


def rules_of(result) -> list[str]:
    return [f.rule for f in result.findings]


def lines_of(result, rule: str) -> list[int]:
    return [f.location.line for f in result.findings if f.rule == rule]


# torch's gloo backend sometimes aborts a process as it shuts down ("terminate called without an active
# exception", SIGABRT), after the script has done all its work. It is upstream: a minimal
# init_process_group / DDP / backward / destroy_process_group script under `torchrun --nproc_per_node 2`
# aborted 4 times in 40 runs on this 2-core machine under load (torch 2.14.1). Such a run is repeated
# once, from a clean folder state, and then judged by the same assertions.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_training(command: list[str], cwd: Path, env: dict, timeout: float = 300, outputs: tuple[str, ...] = ()):
    import subprocess

    for attempt in range(2):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
        if proc.returncode == 0 or GLOO_TEARDOWN_ABORT not in proc.stderr + proc.stdout or attempt:
            return proc
        for pattern in outputs:  # what the aborted run wrote would be counted twice
            for stale in cwd.glob(pattern):
                stale.unlink()
    return proc


def audited_fixture_models(path: Path):
    """``fixtures/fix/compile_small_x.in.py`` (and its ``.out.py``) is fixed with what the model audit
    measures about its models, as ``tcaudit fix --compile`` does (a small step chooses CUDA graphs where
    it is safe); every other fixture without (None). The audit builds the models in a subprocess."""
    if not path.name.startswith("compile_small_"):
        return None
    import os

    from tcaudit.engine import audited_models_for

    return audited_models_for([path], Settings(select=("ALL",), root=path.parent)).get(os.path.realpath(path))
