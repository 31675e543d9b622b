"""Progress on a terminal only: files scanned, models audited, the file being fixed, verify's rounds.

Absent where no one watches (not a terminal, a machine format, CI); present on a terminal, checked
both with a rich Console forced to be a terminal and through a real pseudo-terminal on stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from tcaudit import progress
from tcaudit.config import Settings
from tcaudit.engine import scan

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
FIXED = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
SELECT = ("--select", "TC000,TC202", "--no-exec", "--no-cache")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def forced_console():
    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=True, width=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("y = 2\n", encoding="utf-8")
    return tmp_path


def test_wanted_only_for_a_person_at_a_terminal():
    assert progress.wanted("text", Terminal(), {})
    assert progress.wanted("concise", Terminal(), {"TERM": "xterm"})
    assert progress.wanted(None, Terminal(), {})  # fix and verify have no format
    for fmt in ("json", "sarif", "junit", "github"):
        assert not progress.wanted(fmt, Terminal(), {})
    assert not progress.wanted("text", io.StringIO(), {})  # piped or redirected
    assert not progress.wanted("text", Terminal(), {"CI": "true"})
    assert not progress.wanted("text", Terminal(), {"TERM": "dumb"})


def test_no_progress_when_stderr_is_not_a_terminal(project):
    code, out, err = run_cli("scan", ".", "--format", "concise", *SELECT, cwd=project)
    assert code == 1
    assert out.startswith("bad.py:2:10: TC202 ")
    assert "scanning" not in err and "\x1b[" not in err
    assert progress.current() is progress._NO_PROGRESS


def test_no_progress_for_machine_formats_even_on_a_terminal(project, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for fmt in ("json", "sarif"):
        with progress.showing(fmt) as shown:
            assert shown is progress._NO_PROGRESS
            assert shown.rich is None and shown.console is None


def test_scan_shows_files_scanned_on_a_terminal(project):
    console = forced_console()
    with progress.showing("text", console=console) as shown:
        assert progress.current() is shown
        result = scan([str(project)], Settings(root=project, select=("TC202",)))
    assert progress.current() is progress._NO_PROGRESS  # and the display is gone with the block
    assert [f.rule for f in result.findings] == ["TC202"]
    drawn = console.file.getvalue()
    assert "scanning" in drawn and "3/3" in drawn and "files" in drawn


def test_model_audit_shows_each_model(monkeypatch):
    from tcaudit import model
    from tcaudit.model import sandbox
    from tcaudit.model.facts import ModelFacts

    built = []

    class FakeSandbox:
        def run(self, jobs, limits, preload):
            drawn = console.file.getvalue()
            built.append(("auditing" in drawn, "models" in drawn))
            return [ModelFacts.failed(job["target"], "fake") for job in jobs]

    monkeypatch.setattr(sandbox, "shared_sandbox", lambda: FakeSandbox())
    jobs = [{"target": {"kind": "script", "label": name, "path": "/p/train.py"}} for name in ("Net", "Head")]
    console = forced_console()
    with progress.showing("text", console=console):
        facts = model._run_within_budget(jobs, 300.0, None, None, [], model.ModelAuditResult())
    assert [f.status for f in facts] == ["failed", "failed"]
    assert built == [(True, True), (True, True)]  # the line was up before the first model was built
    drawn = console.file.getvalue()
    assert "2/2" in drawn and "train.py: Head" in drawn


# -- through a real terminal: stderr is a pseudo-terminal, stdout a pipe ------------------------------


def run_on_a_terminal(*args: str, cwd: Path, env_extra: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, what was drawn on the terminal) of ``python -m tcaudit ARGS``."""
    import pty
    import select

    master, slave = pty.openpty()
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env.update(PYTHONPATH=str(REPO), TERM="xterm", COLUMNS="120", **(env_extra or {}))
    proc = subprocess.Popen([sys.executable, "-m", "tcaudit", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            drawn += data
        elif proc.poll() is not None:
            break
    os.close(master)
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=120), stdout, drawn.decode(errors="replace")


needs_pty = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")


@needs_pty
def test_scan_on_a_terminal_draws_progress_and_keeps_stdout_clean(project):
    code, out, drawn = run_on_a_terminal("scan", ".", "--format", "concise", *SELECT, cwd=project)
    assert code == 1
    assert out.startswith("bad.py:2:10: TC202 ") and "\x1b[" not in out
    assert "scanning" in drawn and "3/3" in drawn


@needs_pty
def test_no_progress_on_a_terminal_in_ci_or_for_json(project):
    code, out, drawn = run_on_a_terminal("scan", ".", "--format", "concise", *SELECT, cwd=project,
                                         env_extra={"CI": "true"})
    assert code == 1 and "scanning" not in drawn
    code, out, drawn = run_on_a_terminal("scan", ".", "--format", "json", *SELECT, cwd=project)
    assert code == 1 and "scanning" not in drawn
    assert out.lstrip().startswith("{")


@needs_pty
def test_fix_on_a_terminal_shows_the_file_and_keeps_the_diff_on_stdout(project):
    plain = run_cli("fix", ".", *SELECT, cwd=project)
    code, out, drawn = run_on_a_terminal("fix", ".", *SELECT, cwd=project)
    assert code == plain[0] == 1 and out == plain[1]  # the diff, unchanged by the display
    assert "+scaler = torch.amp.GradScaler(\"cuda\")" in out
    assert "fixing" in drawn and "bad.py" in drawn
    assert "1 file would change" in drawn
    code, out, drawn = run_on_a_terminal("fix", ".", "--apply", *SELECT, cwd=project)
    assert code == 0 and (project / "bad.py").read_text(encoding="utf-8") == FIXED
    assert "fixed bad.py (TC202)" in drawn


@needs_pty
def test_verify_on_a_terminal_shows_rounds_and_steps(tmp_path):
    pytest.importorskip("torch")
    tiny = REPO / "fixtures" / "verify" / "tiny_train.py"
    code, out, drawn = run_on_a_terminal(
        "verify", str(tiny), "--steps", "2", "--warmup", "0", "--rounds", "2", "--out", str(tmp_path / "out"),
        "--", "--steps", "50", "--batch-size", "12", cwd=tmp_path)
    assert code in (0, 1), out + drawn
    assert "rounds" in drawn and "round 2 of 2" in drawn
    assert "original r1" in drawn and "patched r2" in drawn and "steps" in drawn


def test_parallel_scan_counts_every_file(tmp_path):
    from tcaudit.engine import PARALLEL_MIN_FILES

    count = PARALLEL_MIN_FILES + 2
    for number in range(count):
        (tmp_path / f"m{number}.py").write_text(BAD if number == 0 else f"x = {number}\n", encoding="utf-8")
    console = forced_console()
    with progress.showing("text", console=console):
        result = scan([str(tmp_path)], Settings(root=tmp_path, select=("TC202",)), jobs=2)
    assert [f.rule for f in result.findings] == ["TC202"]
    assert f"{count}/{count}" in console.file.getvalue()
