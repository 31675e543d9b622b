from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = REPO / "fixtures"


@pytest.fixture
def write(tmp_path):
    """Write a dedented script into tmp_path and return its path."""

    def _write(code: str, name: str = "train.py") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
        return path

    return _write


def run_cli(*args: str, cwd: Path | None = None):
    """Run tcaudit in-process; returns (exit code, stdout, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from tcaudit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    if cwd is not None:
        import os

        os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(list(args))
    finally:
        if cwd is not None:
            import os

            os.chdir(old)
    return code, out.getvalue(), err.getvalue()
