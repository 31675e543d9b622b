"""The model-build sandbox contains side effects: a hostile constructor leaves no file, no process
and no network connection behind, and the model is reported (TC100) naming what was refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import threading

import pytest

from conftest import run_cli
from tcaudit.model import sandbox

MARKER = "tcaudit-hostile-constructor-marker"

HOSTILE = '''
import os
import shutil
import socket
import subprocess
import sys

import torch.nn as nn

OUT = {out!r}


def attempt(action):
    try:
        action()
    except Exception:
        pass  # a model that carries on after a refusal is still reported


class Hostile(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        attempt(lambda: open(os.path.join(OUT, "written.txt"), "w").write("x"))
        attempt(lambda: os.system("touch " + os.path.join(OUT, "system.txt")))
        attempt(lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", {marker!r}]))
        attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
        attempt(lambda: os.remove(os.path.join(OUT, "keep.txt")))
        attempt(lambda: os.rename(os.path.join(OUT, "keep.txt"), os.path.join(OUT, "moved.txt")))
        attempt(lambda: shutil.rmtree(os.path.join(OUT, "folder")))
        attempt(lambda: os.fork() == 0 and os._exit(0))
        attempt(lambda: os.kill(os.getppid(), 0))

    def forward(self, x):
        return self.fc(x)


model = Hostile()
'''


def _marked_processes() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if MARKER.encode() in handle.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.fixture
def listener():
    """A local server that counts the connections it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.mark.slow
def test_a_hostile_constructor_leaves_nothing_behind(tmp_path, listener):
    pytest.importorskip("torch")
    port, accepted = listener
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    (out / "folder").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent(HOSTILE).format(out=str(out), marker=MARKER, port=port))
    try:
        code, stdout, err = run_cli("scan", "train.py", "--isolated", "--no-cache", "--select", "TC1",
                                    "--format", "json", cwd=project)
        sandbox.shared_sandbox().close()  # the end of the audit, as at the scanner's exit
        left = _marked_processes()
    finally:
        for pid in _marked_processes():  # only what this test's hostile model started
            os.kill(pid, signal.SIGKILL)
    assert sorted(p.name for p in out.iterdir()) == ["folder", "keep.txt"]
    assert (out / "keep.txt").read_text() == "keep"
    assert left == []
    assert accepted == []
    [finding] = json.loads(stdout)["findings"]
    assert finding["rule"] == "TC100", finding
    # The message is one line (it says the build was refused); the finding's details hold the whole
    # account of what was refused and under which sandbox level.
    message = finding["message"]
    assert "tried to do what a model build must not" in message
    account = finding["details"]["reason"]
    for refused in ("writing", "os.system", "subprocess.Popen", "network access", "os.remove", "os.rename",
                    "shutil.rmtree", "os.fork", "os.kill"):
        assert refused in account, (refused, account)
    assert "sandbox (audit hook" in account
    assert code in (0, 1), err  # TC100 is an info finding


def test_credentials_do_not_reach_the_model(monkeypatch):
    for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "MY_API_KEY", "DB_PASSWORD",
                 "HF_TOKEN", "SSH_AUTH_SOCK", "OPENAI_API_KEY", "ACTIONS_RUNTIME_TOKEN", "SIGNING_KEY"):
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("TCAUDIT_MODEL_TIMEOUT", "30")
    env = sandbox.child_environment()
    assert not [name for name in env if env[name] == "secret"]
    assert env["TCAUDIT_MODEL_TIMEOUT"] == "30" and "PATH" in env and "PYTHONPATH" in env


def test_the_guard_allows_its_private_folder_and_reads(tmp_path):
    from tcaudit.model.guard import SandboxRefusal, make_hook

    read, write = os.pipe()
    hook = make_hook(str(tmp_path), write)
    hook("open", (str(tmp_path / "result.json"), "w", 0))
    hook("open", ("/etc/hostname", "r", os.O_RDONLY))
    hook("os.rename", (str(tmp_path / "a"), str(tmp_path / "b"), -1, -1))
    hook("sqlite3.connect", (":memory:",))
    with pytest.raises(SandboxRefusal):
        hook("open", (str(tmp_path / ".." / "escape.txt"), None, os.O_WRONLY | os.O_CREAT))
    with pytest.raises(SandboxRefusal):
        hook("os.symlink", (str(tmp_path / "link"), "/etc/passwd", -1))
    with pytest.raises(SandboxRefusal):  # relative to a descriptor of a folder outside
        outside = os.open(str(tmp_path.parent), os.O_RDONLY)
        try:
            hook("os.remove", ("victim.txt", outside))
        finally:
            os.close(outside)
    with pytest.raises(SandboxRefusal):  # ``open`` does not say which folder a relative path is in
        hook("open", ("relative.txt", "w", 0))
    with pytest.raises(SandboxRefusal):
        hook("gc.get_objects", (-1,))
    with pytest.raises(SandboxRefusal):
        hook("sqlite3.connect", (str(tmp_path.parent / "x.db"),))
    with pytest.raises(SandboxRefusal):
        hook("object.__setattr__", (hook, "__code__", None))
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert len(lines) == 7 and lines[0].startswith("writing ") and "gc.get_objects" in lines[4], lines


# -- OS-level isolation (issue 31): what the audit hook cannot stop, the namespaces do ---------------

DAEMON = '''
import ctypes
import os
import time

import torch.nn as nn

libc = ctypes.CDLL(None, use_errno=True)
SCANNER = int(os.environ.get("TCAUDIT_TEST_SCANNER_PID", "0"))


class Daemon(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        # Native calls raise no audit event: a libc fork, setsid and creat pass the hook.
        if libc.fork() == 0:
            libc.setsid()
            time.sleep(3)
            libc.creat({mark!r}.encode(), 0o644)
            libc._exit(0)
        reached = libc.kill(SCANNER, 0)  # signal 0: only asks whether the scanner can be signalled
        raise RuntimeError(f"scanner reachable: {{reached == 0}}")

    def forward(self, x):
        return self.fc(x)


model = Daemon()
'''


@pytest.mark.slow
def test_a_setsid_daemon_does_not_outlive_the_scan_and_the_scanner_is_out_of_reach(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    if not sandbox.own_pid_namespace():
        pytest.skip(f"no PID namespace here (sandbox level: {sandbox.isolation_level()})")
    mark = tmp_path / "daemon-was-here"
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent(DAEMON).format(mark=str(mark)))
    (project / "other.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    monkeypatch.setenv("TCAUDIT_TEST_SCANNER_PID", str(os.getpid()))
    code, stdout, err = run_cli("scan", ".", "--isolated", "--no-cache", "--select", "TC1,TC202",
                                "--format", "json", cwd=project)
    sandbox.shared_sandbox().close()  # the end of the audit, as at the scanner's exit
    findings = json.loads(stdout)["findings"]
    assert {f["rule"] for f in findings} == {"TC100", "TC202"}, err
    [tc100] = [f for f in findings if f["rule"] == "TC100"]
    assert "scanner reachable: False" in tc100["details"]["reason"]
    import time

    time.sleep(6)  # the daemon would have written its mark after 3 s
    assert not mark.exists()


def test_only_allowlisted_variables_reach_the_model(monkeypatch):
    for name in ("DATABASE_URL", "CI_JOB_JWT", "SENTRY_DSN", "KUBECONFIG", "npm_config__auth", "RANDOM_THING"):
        monkeypatch.setenv(name, "secret")
    for name in ("LANG", "LC_ALL", "TORCH_HOME", "CUDA_HOME", "HF_HOME", "OMP_SCHEDULE"):
        monkeypatch.setenv(name, "kept")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "secret")  # an allowed prefix, but a credential's name
    env = sandbox.child_environment()
    assert not [name for name in env if env[name] == "secret"]
    assert all(env[name] == "kept" for name in ("LANG", "LC_ALL", "TORCH_HOME", "CUDA_HOME", "HF_HOME",
                                                  "OMP_SCHEDULE"))
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_models_exception_text_cannot_drive_the_terminal(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import torch.nn as nn

        ESC, BEL = chr(27), chr(7)


        class Loud(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
                raise RuntimeError(ESC + "[31mred" + ESC + "[0m " + ESC + "]0;owned" + BEL + " done" + chr(0) + "x" * 9000)

            def forward(self, x):
                return self.fc(x)


        model = Loud()
    '''))
    code, stdout, err = run_cli("scan", "train.py", "--isolated", "--no-cache", "--select", "TC1", "--format", "json",
                                cwd=tmp_path)
    [finding] = json.loads(stdout)["findings"]
    texts = [finding["message"], finding.get("explanation", ""), finding["details"]["reason"]]
    assert not any(ch in text for text in texts for ch in (chr(27), chr(7), chr(0)))
    assert "red  done" in finding["details"]["reason"] and len(finding["details"]["reason"]) <= sandbox.MAX_TEXT


def test_clean_text_keeps_lines_and_drops_escapes():
    assert sandbox.clean_text("a\x1b[1;31mb\x1b[0m\tc\nd\x9be\x07") == "ab\tc\nde"
    assert len(sandbox.clean_text("y" * 10_000)) == sandbox.MAX_TEXT
