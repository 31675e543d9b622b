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
    from tcaudit.model.guard import Guard, SandboxRefusal

    guard = Guard(str(tmp_path))
    guard.active = True
    guard("open", (str(tmp_path / "result.json"), "w", 0))
    guard("open", ("/etc/hostname", "r", os.O_RDONLY))
    guard("os.rename", (str(tmp_path / "a"), str(tmp_path / "b"), -1, -1))
    with pytest.raises(SandboxRefusal):
        guard("open", (str(tmp_path / ".." / "escape.txt"), None, os.O_WRONLY | os.O_CREAT))
    with pytest.raises(SandboxRefusal):
        guard("os.symlink", (str(tmp_path / "link"), "/etc/passwd", -1))
    assert len(guard.refused) == 2
