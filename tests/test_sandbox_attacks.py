"""Issue 31's attacks on the model-build sandbox, each a script whose model's constructor tries it.

Every attack here got through the sandbox before the read-only file system view, the capability
drop and the parent-side refusal channel: a file written outside, a socket of the host reached, a
secret echoed, the scan ended. One scan of a folder holding all of them runs per isolation tool the
machine has (bubblewrap, and unshare with the view made by the audit process); each test then
checks that its file, socket, process or secret stayed untouched, and that the rest of the folder
was still reported.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.model import sandbox

SECRET = "tcaudit-test-secret-7f3a9c"

PREAMBLE = '''
import ctypes
import os
import signal
import sys

import torch.nn as nn

OUT = {out!r}
PROJECT = {project!r}
libc = ctypes.CDLL(None, use_errno=True)


def attempt(action):
    try:
        action()
    except Exception:
        pass  # a model that carries on after a refusal is still reported


class Attack(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.attack()

    def forward(self, x):
        return self.fc(x)
'''

ATTACKS = {
    # The hook's state found through the collector and switched off, then a write outside.
    "gc_guard": '''
    def attack(self):
        import gc
        def switch_off():
            for obj in gc.get_objects():
                if type(obj).__name__ == "Guard":
                    obj.active = False
                    obj.private_dir = "/"
        attempt(switch_off)
        attempt(lambda: open(os.path.join(OUT, "gc_guard.txt"), "w").write("x"))
''',
    # A fresh interpreter (multiprocessing's spawn start method) has no hook.
    "mp_spawn": '''
    def attack(self):
        import multiprocessing
        def spawn():
            context = multiprocessing.get_context("spawn")
            process = context.Process(target=open, args=(os.path.join(OUT, "mp_spawn.txt"), "w"))
            process.start()
            process.join(20)
        attempt(spawn)
''',
    # No audit event at all, and reachable from a pickle.
    "spawnv_passfds": '''
    def attack(self):
        from multiprocessing import util
        def spawn():
            code = "open(%r, 'w').write('x'); open(%r, 'w').write('x')" % (
                os.path.join(OUT, "spawnv.txt"), os.path.join(PROJECT, "spawnv.txt"))
            pid = util.spawnv_passfds(sys.executable, [sys.executable, "-c", code], [])
            os.waitpid(pid, 0)
        attempt(spawn)
''',
    # A path relative to a descriptor of a folder outside, from the private folder as working folder.
    "dir_fd": '''
    def attack(self):
        import tempfile
        os.chdir(tempfile.gettempdir())
        for folder in (OUT, PROJECT):
            def write():
                handle = os.open(folder, os.O_RDONLY)
                os.close(os.open("dir_fd.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=handle))
            def delete():
                os.remove("keep.txt", dir_fd=os.open(folder, os.O_RDONLY))
            attempt(write)
            attempt(delete)
''',
    # sqlite opens its files natively.
    "sqlite": '''
    def attack(self):
        import sqlite3
        def write(folder):
            connection = sqlite3.connect(os.path.join(folder, "sqlite.db"))
            connection.execute("create table t (x)")
            connection.commit()
        attempt(lambda: write(OUT))
        attempt(lambda: write(PROJECT))
''',
    # No audit event for a FIFO; native writes into the project pass any hook.
    "native_writes": '''
    def attack(self):
        attempt(lambda: os.mkfifo(os.path.join(OUT, "fifo")))
        attempt(lambda: os.mkfifo(os.path.join(PROJECT, "fifo")))
        libc.creat(os.path.join(PROJECT, "native.txt").encode(), 0o644)
        libc.unlink(os.path.join(PROJECT, "keep.txt").encode())
        libc.creat(os.path.join(OUT, "native.txt").encode(), 0o644)
''',
    # A Unix-domain socket of the host, through ctypes (the network namespace does not isolate
    # the file system): one in a temporary folder, one in the project.
    "host_socket": '''
    def attack(self):
        class Address(ctypes.Structure):
            _fields_ = [("family", ctypes.c_ushort), ("path", ctypes.c_char * 108)]
        for path in ({socket_tmp!r}, {socket_project!r}):
            fd = libc.socket(1, 1, 0)
            address = Address(1, path.encode())
            libc.connect(fd, ctypes.byref(address), ctypes.sizeof(address))
            libc.write(fd, b"hello", 5)
            libc.close(fd)
''',
    # The user's private key (at the home folder's path the scanner runs with: the audit process's
    # own HOME is private), put in the exception's text (and so in CI logs).
    "ssh_key": '''
    def attack(self):
        with open(os.path.join({home!r}, ".ssh", "id_rsa")) as key:
            raise RuntimeError("key: " + key.read())
''',
    # Secrets under names no credential pattern foresees.
    "secret_env": '''
    def attack(self):
        raise RuntimeError("env: " + repr({{n: os.environ.get(n) for n in ("DATABASE_URL", "CI_JOB_JWT")}}))
''',
    # The audit process (the model's parent) killed, by pidfd and by number: the scan must go on.
    "kill_audit": '''
    def attack(self):
        parent = os.getppid()
        attempt(lambda: signal.pidfd_send_signal(os.pidfd_open(parent), signal.SIGKILL))
        libc.kill(parent, signal.SIGKILL)
''',
    # The result faked: a refused write, then json.dump replaced to report a clean model.
    "fake_result": '''
    def attack(self):
        import json
        attempt(lambda: open(os.path.join(OUT, "fake_result.txt"), "w").write("x"))
        original = json.dump
        def dump(data, handle, **kwargs):
            if isinstance(data, dict) and "target" in data:
                data = dict(data, status="audited", reason="")
            return original(data, handle, **kwargs)
        json.dump = dump
''',
    # What the scanner had open (a secret, inheritable) read through an inherited descriptor.
    "inherited_fd": '''
    def attack(self):
        found = []
        for fd in range(3, 1024):
            try:
                found.append(os.pread(fd, 200, 0).decode("utf-8", "replace"))
            except OSError:
                pass
        raise RuntimeError("descriptors: " + repr(found))
''',
    # What the model's process may use, as it sees it.
    "limits": '''
    def attack(self):
        import resource
        names = ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_AS")
        with open("/proc/self/status") as status:
            capabilities = [line.split()[1] for line in status if line.startswith("CapEff:")]
        raise RuntimeError(f"limits: {{[(n, resource.getrlimit(getattr(resource, n))) for n in names]}} "
                           f"capabilities: {{capabilities}}")
''',
    # A daemon left by one model's build (its own session), and the next model looking for it.
    "daemon_first": '''
    def attack(self):
        import time
        if libc.fork() == 0:
            libc.setsid()
            time.sleep(30)
            libc._exit(0)
''',
    "daemon_witness": '''
    def attack(self):
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
        raise RuntimeError(f"others: {{others}}")
''',
    # The capabilities of root in its user namespace used to undo the view.
    "undo_view": '''
    def attack(self):
        libc.umount2(b"/tmp", 2)
        libc.mount(None, b"/", None, 0x20 | 0x1000, None)  # remount writable
        libc.creat(os.path.join(PROJECT, "undo_view.txt").encode(), 0o644)
''',
}

INNOCENT = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"

# A model whose build makes its cache folders, as torch and libraries do: in the scanner's
# $TORCHINDUCTOR_CACHE_DIR (torch sets it in a process that compiled), in ~/.cache. Not an attack: the
# audit process gets private ones, and the model is audited.
CACHES = PREAMBLE + '''
    def attack(self):
        os.makedirs(os.environ["TORCHINDUCTOR_CACHE_DIR"], exist_ok=True)
        os.makedirs(os.path.expanduser("~/.cache/some-library"), exist_ok=True)
        with open(os.path.join(os.environ["XDG_CACHE_HOME"], "note.txt"), "w") as note:
            note.write("cached")


model = Attack()
'''


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    findings: list[dict]
    outside: Path
    project: Path
    accepted: list[str]
    level: str

    def for_file(self, name: str) -> list[dict]:
        return [f for f in self.findings if Path(f["path"]).name == name]


def _unix_server(path: str, accepted: list[str], stop: threading.Event) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    server.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(path)
            connection.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _tools() -> list[str]:
    return ["bwrap", "unshare"]


@pytest.fixture(scope="module", params=_tools())
def outcome(request, tmp_path_factory):
    pytest.importorskip("torch")
    tool = request.param
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("TCAUDIT_SANDBOX_TOOL", tool)
    sandbox.shared_sandbox().close()
    sandbox._isolation.cache_clear()
    if not sandbox.read_only_view():
        level = sandbox.isolation_level()
        monkeypatch.undo()
        sandbox._isolation.cache_clear()
        pytest.skip(f"{tool} cannot make the read-only view here (sandbox level: {level})")
    root = tmp_path_factory.mktemp(f"attacks-{tool}")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    project = home / "code" / "project"  # a project in the user's home, as is usual
    project.mkdir(parents=True)
    outside = root / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (project / "keep.txt").write_text("keep")
    socket_tmp, socket_project = str(root / "host.sock"), str(project / "app.sock")
    accepted: list[str] = []
    stop = threading.Event()
    threads = [_unix_server(p, accepted, stop) for p in (socket_tmp, socket_project)]
    for name, body in ATTACKS.items():
        source = PREAMBLE + body + "\n\nmodel = Attack()\n"
        source = source.format(out=str(outside), project=str(project), socket_tmp=socket_tmp,
                               socket_project=socket_project, home=str(home))
        (project / f"{name}.py").write_text(source)
    (project / "innocent.py").write_text(INNOCENT)
    (project / "caches.py").write_text(CACHES.format(out=str(outside), project=str(project)))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor-cache-of-the-scanner"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DATABASE_URL", f"postgres://user:{SECRET}@db/prod")
    monkeypatch.setenv("CI_JOB_JWT", SECRET)
    monkeypatch.setenv("TCAUDIT_MODEL_TIMEOUT", "40")
    held = os.open(home / ".ssh" / "id_rsa", os.O_RDONLY)
    os.set_inheritable(held, True)
    try:
        code, out, err = run_cli("scan", ".", "--isolated", "--no-cache", "--select", "TC1,TC202",
                                 "--format", "json", cwd=project)
        level = sandbox.isolation_level()
        sandbox.shared_sandbox().close()
    finally:
        os.close(held)
        stop.set()
        for thread in threads:
            thread.join()
        monkeypatch.undo()
        sandbox._isolation.cache_clear()
    findings = json.loads(out)["findings"] if out.strip().startswith("{") else []
    yield Outcome(code, out, err, findings, outside, project, accepted, level)


def test_the_scan_goes_on_and_reports_the_other_files(outcome):
    assert outcome.code in (0, 1), outcome.err
    assert [f["rule"] for f in outcome.for_file("innocent.py")] == ["TC202"]
    # Every attack's model is accounted for: not audited (TC100), or audited with nothing to say.
    for name in ATTACKS:
        rules = {f["rule"] for f in outcome.for_file(f"{name}.py")}
        assert rules <= {"TC100"}, (name, rules)


def test_nothing_is_written_or_deleted_outside(outcome):
    assert sorted(p.name for p in outcome.outside.iterdir()) == ["keep.txt"]
    assert (outcome.outside / "keep.txt").read_text() == "keep"
    project_files = {p.name for p in outcome.project.iterdir()}
    assert project_files == {*(f"{name}.py" for name in ATTACKS), "innocent.py", "caches.py", "keep.txt", "app.sock"}
    assert (outcome.project / "keep.txt").read_text() == "keep"


def test_no_socket_of_the_host_is_reached(outcome):
    assert outcome.accepted == []


def test_no_secret_reaches_the_report(outcome):
    assert SECRET not in outcome.out and SECRET not in outcome.err
    [ssh] = outcome.for_file("ssh_key.py")
    # Refused by the hook, which knows what the view hides (issue 49); beneath it the view has no such file.
    assert "id_rsa, which the sandbox's view hides" in ssh["details"]["reason"]


def _reason(outcome: Outcome, name: str) -> str:
    [finding] = [f for f in outcome.for_file(f"{name}.py") if f["rule"] == "TC100"]
    return finding["details"]["reason"]


@pytest.mark.parametrize("name, refused", [
    ("gc_guard", "gc.get_objects"),
    ("mp_spawn", "_posixsubprocess.fork_exec"),
    ("spawnv_passfds", "_posixsubprocess.fork_exec"),
    ("dir_fd", "os.remove"),
    ("sqlite", "sqlite3.connect"),
    ("fake_result", "writing"),
])
def test_what_the_hook_refused_is_reported_by_the_parent(outcome, name, refused):
    reason = _reason(outcome, name)
    assert "refused it" in reason and refused in reason, reason
    assert outcome.level in reason


def test_a_killed_audit_process_is_a_tc100_not_the_end_of_the_scan(outcome):
    findings = outcome.for_file("kill_audit.py")
    assert all(f["rule"] == "TC100" for f in findings)


def test_the_audit_process_killed_by_the_model_ends_only_that_model_without_namespaces(tmp_path, monkeypatch):
    """Where no PID namespace keeps the audit process out of the model's reach (the hook alone), the
    model's code can kill it: the model is TC100 and the scan goes on (it used to exit 2)."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TCAUDIT_SANDBOX_NAMESPACES", "0")
    sandbox.shared_sandbox().close()
    sandbox._isolation.cache_clear()
    (tmp_path / "kill_audit.py").write_text(PREAMBLE.format(out=str(tmp_path), project=str(tmp_path))
                                            + ATTACKS["kill_audit"] + "\n\nmodel = Attack()\n")
    (tmp_path / "innocent.py").write_text(INNOCENT)
    try:
        code, out, err = run_cli("scan", ".", "--isolated", "--no-cache", "--select", "TC1,TC202", "--format", "json",
                                 cwd=tmp_path)
        sandbox.shared_sandbox().close()
    finally:
        monkeypatch.undo()
        sandbox._isolation.cache_clear()
    assert code == 1, err
    findings = json.loads(out)["findings"]
    assert sorted((Path(f["path"]).name, f["rule"]) for f in findings) == [("innocent.py", "TC202"),
                                                                             ("kill_audit.py", "TC100")]
    [tc100] = [f for f in findings if f["rule"] == "TC100"]
    assert "the audit process ended twice" in tc100["details"]["reason"]
    # Said once per scan: the models were built without the file system view.
    assert [n for n in json.loads(out)["notes"] if "read-only file system view" in n] == [
        'model audit: the models were built without the read-only file system view (sandbox: audit hook); '
        'see "Running on code you do not trust" in the README']


def test_the_model_inherits_no_descriptor_and_runs_within_limits_without_capabilities(outcome):
    from tcaudit.model import worker

    descriptors = _reason(outcome, "inherited_fd")
    assert "descriptors: [" in descriptors and SECRET not in descriptors
    limits = _reason(outcome, "limits")
    for name, value in (("RLIMIT_NOFILE", worker.MAX_OPEN_FILES), ("RLIMIT_FSIZE", worker.MAX_FILE_SIZE),
                        ("RLIMIT_NPROC", worker.MAX_TASKS), ("RLIMIT_CPU", 70)):
        assert f"('{name}', ({value}, {value}))" in limits, (name, limits)
    assert "capabilities: ['0000000000000000']" in limits


def _confined(plan_json: str, code: str) -> "subprocess.CompletedProcess[str]":
    """``code`` run after :func:`tcaudit.model.jail.enter` and ``drop_privileges``, in the user and
    mount namespaces unshare makes (no torch: a plain interpreter)."""
    import shutil
    import subprocess
    import sys

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here")
    prologue = ("import os, sys\nfrom tcaudit.model import jail\n"
                "jail.enter(jail.Plan.from_json(os.environ['PLAN']))\njail.drop_privileges()\n")
    env = {**os.environ, "PLAN": plan_json, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "--", sys.executable, "-c", "pass"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot make user and mount namespaces here: {probe.stderr.decode()[:200]}")
    return subprocess.run([unshare, "--user", "--map-root-user", "--mount", "--", sys.executable, "-c",
                           prologue + code], capture_output=True, text=True, env=env, timeout=60)


def test_a_home_folder_that_is_the_project_keeps_its_secrets_hidden(tmp_path, monkeypatch):
    """``tcaudit scan train.py`` run from the home folder shows the home folder (the project), but
    not ``~/.ssh``, ``~/.aws`` or ``~/.netrc`` in it; the project's own files stay readable."""
    from tcaudit.model import jail

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(SECRET)
    (home / ".netrc").write_text(SECRET)
    (home / "model.py").write_text("WIDTH = 64\n")
    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setenv("HOME", str(home))
    plan = jail.make_plan(str(private), [str(home)])
    assert str(home / ".ssh") in plan.hidden and str(home / ".netrc") in plan.blanked
    result = _confined(plan.to_json(), textwrap.dedent(f'''
        seen = []
        for path in ({str(home / ".ssh" / "id_rsa")!r}, {str(home / ".aws" / "credentials")!r},
                     {str(home / ".netrc")!r}, {str(home / "model.py")!r}):
            try:
                seen.append(open(path).read())
            except OSError as exc:
                seen.append(type(exc).__name__)
        try:
            open({str(home / "written.txt")!r}, "w")
        except OSError as exc:
            seen.append(exc.strerror)
        open({str(private / "ok.txt")!r}, "w").write("ok")
        seen.append(open({str(private / "ok.txt")!r}).read())
        print(seen)
    '''))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['FileNotFoundError', 'FileNotFoundError', '', 'WIDTH = 64\\n', " \
                                    "'Read-only file system', 'ok']"
    # The private folder is a tmpfs of the model's own (issue 49): nothing written there reaches the host.
    assert not (private / "ok.txt").exists() and not (home / "written.txt").exists()
    assert SECRET not in result.stdout


def test_nothing_of_one_models_build_reaches_the_next(outcome):
    """A daemon the first model's code left (setsid, out of its process group) is gone before the
    next model is built: that model's process sees no other process in the namespace."""
    assert "others: []" in _reason(outcome, "daemon_witness")


def test_a_build_that_makes_its_cache_folders_is_audited(outcome):
    assert outcome.for_file("caches.py") == [], outcome.for_file("caches.py")
