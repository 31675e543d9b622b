"""No input crashes a scan: deep nesting, special files, symlink loops, unreadable files and folders,
non-UTF-8 names. Each gives one finding (TC000) or one warning, the other files are scanned as usual,
and the exit code says only whether there were findings (0/1), in-process and with --jobs workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_cli

GRADSCALER = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"  # one TC202
DEPTHS = (150, 199, 300, 1000, 2500)


def tcaudit(*args: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """A real process: a segfault or a hang must fail the test, not end the test run."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "tcaudit", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout)


def by_path(stdout: bytes) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for finding in json.loads(stdout)["findings"]:
        out.setdefault(finding["path"], []).append(finding["rule"])
    return out


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory):
    """One folder with every kind of odd input, and enough plain files that --jobs uses workers."""
    root = tmp_path_factory.mktemp("odd")
    for depth in DEPTHS:
        (root / f"deep_{depth}.py").write_text(GRADSCALER + "x = " + "[" * depth + "]" * depth + "\n")
    for index in range(16):
        (root / f"plain_{index:02d}.py").write_text(GRADSCALER)
    os.mkfifo(root / "fifo.py")
    os.symlink("loop_b.py", root / "loop_a.py")
    os.symlink("loop_a.py", root / "loop_b.py")
    os.symlink("missing_target.py", root / "dangling.py")
    os.mkdir(root / "folder_loop")
    os.symlink("..", root / "folder_loop" / "up")
    (root / os.fsdecode(b"name_\xff.py")).write_text(GRADSCALER)
    return root


@pytest.mark.parametrize("jobs", ["1", "4"])
def test_odd_inputs_each_get_one_finding_and_the_rest_is_scanned(odd_tree, jobs):
    proc = tcaudit("scan", ".", "--format", "json", "--no-cache", "--jobs", jobs, cwd=odd_tree)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    found = by_path(proc.stdout)
    for index in range(16):
        assert found[f"plain_{index:02d}.py"] == ["TC202"]
    for depth in (150, 199):  # Python accepts these: analysed like any other file
        assert found[f"deep_{depth}.py"] == ["TC202"]
    for depth in (300, 1000, 2500):  # Python refuses these: one TC000 saying why
        assert found[f"deep_{depth}.py"] == ["TC000"]
    for name in ("fifo.py", "loop_a.py", "loop_b.py"):
        assert found[name] == ["TC000"], name
    assert found["dangling.py"] == ["TC000"]  # a symlink to nothing, under its own name (issue 31)
    assert "missing_target.py" not in found
    odd_name = [path for path in found if path.startswith("name_")]
    assert len(odd_name) == 1 and found[odd_name[0]] == ["TC202"]


@pytest.mark.parametrize("report", ["text", "concise", "sarif", "github", "junit"])
def test_a_non_utf8_file_name_in_every_report_format(odd_tree, tmp_path, report):
    (tmp_path / os.fsdecode(b"name_\xff.py")).write_text(GRADSCALER)
    proc = tcaudit("scan", ".", "--format", report, "--no-cache", "--no-exec", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr


def test_a_fifo_named_on_the_command_line_is_a_finding_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    proc = tcaudit("scan", "pipe.py", "--format", "json", "--no-cache", cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    [finding] = json.loads(proc.stdout)["findings"]
    assert finding["rule"] == "TC000" and "not a regular file" in finding["message"]


def test_an_unreadable_folder_is_one_warning(tmp_path, monkeypatch):
    (tmp_path / "ok.py").write_text(GRADSCALER)
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "hidden.py").write_text(GRADSCALER)
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, out, err = run_cli("scan", ".", "--format", "json", "--no-cache", "--select", "TC202", cwd=tmp_path)
    assert code == 1, err
    assert by_path(out.encode()) == {"ok.py": ["TC202"]}
    assert "cannot read folder locked: Permission denied" in out + err


def test_an_unreadable_file_is_one_finding(tmp_path, monkeypatch):
    (tmp_path / "ok.py").write_text(GRADSCALER)
    (tmp_path / "secret.py").write_text(GRADSCALER)
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if os.fspath(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    code, out, err = run_cli("scan", ".", "--format", "json", "--no-cache", "--select", "TC000,TC202", cwd=tmp_path)
    assert code == 1, err
    assert by_path(out.encode()) == {"ok.py": ["TC202"], "secret.py": ["TC000"]}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_by_mode(tmp_path):
    (tmp_path / "ok.py").write_text(GRADSCALER)
    (tmp_path / "secret.py").write_text(GRADSCALER)
    (tmp_path / "locked").mkdir()
    os.chmod(tmp_path / "secret.py", 0)
    os.chmod(tmp_path / "locked", 0)
    try:
        proc = tcaudit("scan", ".", "--format", "json", "--no-cache", "--select", "TC000,TC202", cwd=tmp_path)
    finally:
        os.chmod(tmp_path / "locked", 0o755)
    assert proc.returncode == 1, proc.stderr
    assert by_path(proc.stdout) == {"ok.py": ["TC202"], "secret.py": ["TC000"]}


def test_a_fifo_in_the_text_report_is_a_finding_not_a_hang(tmp_path):
    """The text report's code frame must not read the FIFO either (it waited for a writer forever)."""
    os.mkfifo(tmp_path / "pipe.py")
    proc = tcaudit("scan", "pipe.py", "--no-cache", "--no-exec", cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert b"pipe.py:1:1: TC000" in proc.stdout and b"not a regular file" in proc.stdout


def test_fix_on_a_folder_notes_odd_entries_and_fixes_the_rest(tmp_path):
    (tmp_path / "good.py").write_text(GRADSCALER)
    os.mkfifo(tmp_path / "pipe.py")
    os.symlink("missing_target.py", tmp_path / "dangling.py")
    proc = tcaudit("fix", ".", "--apply", "--isolated", "--no-exec", cwd=tmp_path, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err  # the unreadable entries are TC000s in scan: they remain
    assert "dangling.py: not fixed: cannot read file: a symlink to nothing (missing_target.py)" in err
    assert "pipe.py: not fixed: cannot read file: not a regular file" in err
    assert "torch.amp.GradScaler" in (tmp_path / "good.py").read_text()
    assert os.path.islink(tmp_path / "dangling.py") and not (tmp_path / "missing_target.py").exists()


@pytest.mark.parametrize("ending", ["\r", "\n", "\r\n"])
def test_fix_keeps_every_line_ending_to_the_last(tmp_path, ending):
    """LibCST drops a file's last lone CR (classic Mac OS endings): the fixed file keeps it."""
    path = tmp_path / "train.py"
    path.write_bytes(GRADSCALER.replace("\n", ending).encode())
    code, _, err = run_cli("fix", "train.py", "--apply", "--isolated", "--no-exec", "--select", "TC202", cwd=tmp_path)
    assert code == 0, err
    fixed = path.read_bytes()
    assert fixed.endswith(ending.encode()) and b"torch.amp.GradScaler" in fixed
    assert fixed.count(ending.encode()) == GRADSCALER.count("\n")


def test_an_unchanged_lone_cr_file_stays_byte_for_byte(tmp_path):
    path = tmp_path / "train.py"
    original = b"import torch\rx = torch.ones(3)\r"
    path.write_bytes(original)
    code, _, err = run_cli("fix", "train.py", "--apply", "--isolated", "--no-exec", cwd=tmp_path)
    assert code == 0, err
    assert path.read_bytes() == original
