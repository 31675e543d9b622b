"""Issue 49: the scanner's own side of the model sandbox's boundary.

The model's process shares a private folder with the scanner. Before, the scanner opened
``model-N.job.json``, ``model-N.result.json`` and ``model-N.log`` there by name: a symlink planted under
the next job's name made it overwrite a file outside (``~/.bashrc``) with the script's text, a symlink
as the log put a key's last line into TC100, a FIFO as the result hung the scan forever, a fake clean
result planted for the next model hid that model's TC100, and a result naming ``/dev/zero`` or nested
100,000 deep ended the scan. Each attack below is a model's constructor; one scan of a folder holding
all of them runs under each isolation this machine has (bubblewrap, unshare, the audit hook alone), and
the tests check that the effect did not happen, that the report finished, and the exit code. The
channel itself (tcaudit/model/channel.py) is fuzzed without torch.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from tcaudit.model import channel, sandbox
from tcaudit.model.facts import ModelFacts

SECRET = "tcaudit-issue49-secret-c41d"
BASHRC = "# the user's shell start-up file\n"

PREAMBLE = '''
import json
import os

import torch.nn as nn

HOME = {home!r}
FOLDER = os.environ.get("TMPDIR", "")


def attempt(action):
    try:
        action()
    except Exception:
        pass


class Attack(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.attack()

    def forward(self, x):
        return self.fc(x)
'''

ATTACKS = {
    # Symlinks under every name the scanner used to open in the folder, for the models to come:
    # the job (written by the scanner: ~/.bashrc overwritten with the script's text), the log (a
    # key's last line in TC100), and FIFOs as results (a read that never ends).
    "a_plant_links": '''
    def attack(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)  # beneath the audit hook: the plants are made
        planted = 0
        for n in range(1, 12):
            base = os.path.join(FOLDER, f"model-{{n}}")
            planted += libc.symlink(os.path.join(HOME, ".bashrc").encode(), (base + ".job.json").encode()) == 0
            planted += libc.symlink(os.path.join(HOME, ".ssh", "id_rsa").encode(), (base + ".log").encode()) == 0
            planted += libc.mkfifo((base + ".result.json").encode(), 0o600) == 0
        for name in ("job.json", "model.log"):
            planted += libc.symlink(os.path.join(HOME, ".ssh", "id_rsa").encode(),
                                    os.path.join(FOLDER, name).encode()) == 0
        planted += libc.mkfifo(os.path.join(FOLDER, "result.json").encode(), 0o600) == 0
        raise RuntimeError(f"planted {{planted}}")
''',
    # A clean result planted for the models to come: the crashing model below must still be TC100.
    "b_plant_clean": '''
    def attack(self):
        clean = json.dumps({{"status": "ok", "modules": [], "ops": []}})
        planted = 0
        for n in range(1, 12):
            path = os.path.join(FOLDER, f"model-{{n}}.result.json")
            if not os.path.lexists(path):
                with open(path, "w") as out:
                    out.write(clean)
                planted += 1
        raise RuntimeError(f"planted {{planted}} clean results")
''',
    # The model's own process replaces what writes its result: devices and the scanner's stdin as
    # the files the build depends on, a key as a construction site.
    "c_depends_on_devices": '''
    def attack(self):
        original = json.dumps
        def dumps(data, *args, **kwargs):
            if isinstance(data, dict) and "depends_on" in data:
                data = {{**data, "depends_on": ["/dev/zero", "/proc/self/fd/0", "/dev/stdin",
                                                 os.path.join(HOME, ".ssh", "id_rsa")],
                        "construction": [os.path.join(HOME, ".ssh", "id_rsa"), 1, 1, 1, 2]}}
            return original(data, *args, **kwargs)
        json.dumps = dumps
''',
    # A result nested 100,000 deep.
    "d_deep_result": '''
    def attack(self):
        json.dumps = lambda *args, **kwargs: "[" * 100_000 + "]" * 100_000
''',
    # A result of 80 MiB.
    "e_huge_result": '''
    def attack(self):
        json.dumps = lambda *args, **kwargs: " " * (80 << 20)
''',
    # Not JSON: NaN (which Python's json writes and JSON has no word for), beside an escaped lone surrogate.
    "f_garbage_result": '''
    def attack(self):
        json.dumps = lambda *args, **kwargs: '{{"status": "ok", "reason": "\\\\ud800", "total_flops": NaN}}'
''',
}

# Secrets the model's code must not read: the Hugging Face token beside a cache it may read, and
# credential files of the home folder that no deny list names; the scan runs from the home folder.
SECRET_FILES = ("{hf_home}/token", "{home}/.kaggle/kaggle.json", "{home}/.npmrc", "{home}/.pgpass",
                "{home}/notes-with-password.txt")
READ_SECRETS = PREAMBLE + '''
    def attack(self):
        found = []
        for path in {files!r}:
            try:
                with open(path) as handle:
                    found.append(handle.read())
            except OSError as exc:
                found.append(type(exc).__name__)
        raise RuntimeError("read: " + " | ".join(found))


model = Attack()
'''
# The same beneath the hook (libc's open and read): only a file system view holds against it.
READ_SECRETS_NATIVE = PREAMBLE + '''
    def attack(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        found = []
        for path in {files!r}:
            fd = libc.open(path.encode(), 0)
            if fd < 0:
                found.append(f"errno {{ctypes.get_errno()}}")
                continue
            buffer = ctypes.create_string_buffer(4096)
            size = libc.read(fd, buffer, 4096)
            found.append(buffer.raw[:max(size, 0)].decode(errors="replace"))
        raise RuntimeError("read: " + " | ".join(found))


model = Attack()
'''
# Built after the plants: its process ends without a result, so it must be TC100 whatever was planted.
CRASH = PREAMBLE + '''
    def attack(self):
        os._exit(3)


model = Attack()
'''
# A model with something to report (TC101), built after the plants: its findings must survive them.
INNOCENT = '''
import torch.nn as nn

model = nn.Sequential(nn.Linear(1024, 4095), nn.ReLU(), nn.Linear(4095, 1024))
'''


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float
    findings: list[dict]
    home: Path
    level: str

    def for_file(self, name: str) -> list[dict]:
        return [f for f in self.findings if Path(f["path"]).name == name]


def _levels() -> list[str]:
    return ["bwrap", "unshare", "hook"]


def _level_env(tool: str) -> dict[str, str]:
    if tool == "hook":
        return {"TCAUDIT_SANDBOX_NAMESPACES": "0"}
    return {"TCAUDIT_SANDBOX_TOOL": tool}


@pytest.fixture(scope="module", params=_levels())
def outcome(request, tmp_path_factory):
    pytest.importorskip("torch")
    tool = request.param
    monkeypatch = pytest.MonkeyPatch()
    for name, value in _level_env(tool).items():
        monkeypatch.setenv(name, value)
    sandbox._isolation.cache_clear()
    try:
        level = sandbox.isolation_level()
    finally:
        monkeypatch.undo()
        sandbox._isolation.cache_clear()
    if tool != "hook" and level not in (sandbox.BWRAP_LEVEL, sandbox.UNSHARE_LEVEL):
        pytest.skip(f"{tool} cannot make the read-only view here (sandbox level: {level}); the hook-only "
                    "run and the channel's own tests cover the same path")
    root = tmp_path_factory.mktemp(f"trust-{tool}")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN KEY-----\n{SECRET}\n")
    (home / ".bashrc").write_text(BASHRC)
    project = home / "project"
    project.mkdir()
    for name, body in ATTACKS.items():
        (project / f"{name}.py").write_text((PREAMBLE + body + "\n\nmodel = Attack()\n").format(home=str(home)))
    (project / "m_innocent.py").write_text(INNOCENT)
    (project / "z_crash.py").write_text(CRASH.format(home=str(home)))
    hf_home = home / ".cache" / "huggingface"
    hf_home.mkdir(parents=True)
    (hf_home / "config.json").write_text("{}")
    files = [p.format(home=home, hf_home=hf_home) for p in SECRET_FILES]
    for path in files:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(f"{SECRET}-{Path(path).name}")
    (project / "g_read_secrets.py").write_text(READ_SECRETS.format(home=str(home), files=files))
    if tool != "hook":
        (project / "h_read_secrets_native.py").write_text(READ_SECRETS_NATIVE.format(home=str(home), files=files))
    env = {**os.environ, **_level_env(tool), "HOME": str(home), "HF_HOME": str(hf_home), "PYTHONPATH": str(REPO),
           "TCAUDIT_MODEL_TIMEOUT": "60"}
    started = time.monotonic()
    # From the home folder, as the red team ran it: the home around the project is not the project.
    proc = subprocess.run([sys.executable, "-m", "tcaudit", "scan", "project", "--isolated", "--select", "TC1",
                           "--format", "json"], cwd=home, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    findings = json.loads(proc.stdout)["findings"] if proc.stdout.strip().startswith("{") else []
    yield Outcome(proc.returncode, proc.stdout, proc.stderr, seconds, findings, home, level)


def test_the_report_finishes_with_every_file_and_its_exit_code(outcome):
    # Exit 1 exactly when a finding is at or above the default --fail-on (warning): never 2.
    blocking = any(f["severity"] in ("error", "warning") for f in outcome.findings)
    assert outcome.code == (1 if blocking else 0), outcome.err[-2000:]
    assert outcome.seconds < 600
    rules = sorted({f["rule"] for f in outcome.for_file("m_innocent.py")})
    assert rules == ["TC101"], outcome.out[-3000:]
    for name in [*ATTACKS, "g_read_secrets", "h_read_secrets_native", "z_crash"]:
        assert {f["rule"] for f in outcome.for_file(f"{name}.py")} <= {"TC100"}, name


def test_no_file_outside_is_overwritten_and_no_secret_is_reported(outcome):
    assert (outcome.home / ".bashrc").read_text() == BASHRC
    assert (outcome.home / ".ssh" / "id_rsa").read_text() == f"-----BEGIN KEY-----\n{SECRET}\n"
    assert SECRET not in outcome.out and SECRET not in outcome.err


def test_the_plants_were_made(outcome):
    # Every symlink and FIFO was planted (the old scanner would have followed them), and the models
    # built after them were still reported from their own results.
    [links] = outcome.for_file("a_plant_links.py")
    assert "RuntimeError: planted 36" in links["details"]["reason"], links
    [clean] = outcome.for_file("b_plant_clean.py")
    assert "RuntimeError: planted" in clean["details"]["reason"], clean


def test_no_credential_file_is_read_from_the_home_folder_or_a_cache(outcome):
    [python_open] = outcome.for_file("g_read_secrets.py")
    reason = python_open["details"]["reason"]
    assert SECRET not in reason
    assert "the sandbox's view hides" in reason or "read: FileNotFoundError" in reason, reason
    native = outcome.for_file("h_read_secrets_native.py")
    if outcome.level != sandbox.HOOK_LEVEL:  # beneath the hook only the view holds
        [native] = native
        # The token is an empty file beside the cache the model may read; the home's files are not there.
        assert "RuntimeError: read:  | errno 2 | errno 2 | errno 2 | errno 2" in native["details"]["reason"], native


def test_a_planted_clean_result_does_not_hide_a_model_that_crashed(outcome):
    [tc100] = outcome.for_file("z_crash.py")
    assert tc100["rule"] == "TC100"
    assert "exited with code 3" in tc100["details"]["reason"], tc100


@pytest.mark.parametrize("name, reason", [
    ("d_deep_result", "nested deeper than"),
    ("e_huge_result", "over 64 MiB"),
    ("f_garbage_result", "not JSON"),
])
def test_a_result_the_scanner_cannot_take_is_a_tc100_that_says_why(outcome, name, reason):
    [tc100] = outcome.for_file(f"{name}.py")
    assert reason in tc100["details"]["reason"], tc100


def test_a_result_naming_devices_and_files_outside_is_kept_to_the_project(outcome):
    # The result itself is taken (the model is audited); what it named outside the project is not.
    assert {f["rule"] for f in outcome.for_file("c_depends_on_devices.py")} <= {"TC100"}
    assert "/dev/zero" not in outcome.out and "/proc/self/fd/0" not in outcome.out


# -- the channel, without torch ------------------------------------------------------------------------


TARGET = {"kind": "script", "path": "", "roots": []}


def _facts(raw: bytes | None, target: dict | None = None) -> ModelFacts:
    return sandbox.result_facts(target or TARGET, raw, "", 0, False, sandbox.Limits(10.0))


def test_the_parser_takes_a_real_result():
    facts = ModelFacts(target=TARGET, model_class="MLP", param_count=7)
    back = _facts(json.dumps(facts.to_json()).encode())
    assert (back.status, back.model_class, back.param_count) == ("ok", "MLP", 7)


def test_fuzz_the_result_parser_never_raises_and_never_accepts_garbage_as_clean():
    rng = random.Random(49)
    valid = json.dumps(ModelFacts(target=TARGET, model_class="M").to_json()).encode()
    cases = [b"", b"null", b"[]", b"{}" * 3, b"\xff\xfe", b'{"status": "ok", "x": NaN}', b'"\\ud800"',
             b"[" * 100_000, b"{\"a\":" * 100_000, b" " * (channel.MAX_RESULT_BYTES + 1),
             b'{"modules": [{"path": 1}]}', b'{"ops": [{"index": "x"}]}', b'{"capture": 3}',
             b'{"depends_on": 5}', b'{"construction": [1, 2]}', b'{"modules": "abc"}']
    for _ in range(400):
        cut = rng.randrange(len(valid))
        mutated = bytearray(valid)
        for _ in range(rng.randrange(1, 6)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cases += [bytes(mutated), valid[:cut], bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))]
    for raw in cases:
        facts = _facts(raw)
        assert isinstance(facts, ModelFacts)
        if facts.status != "ok":
            assert facts.reason, raw[:80]


def test_depth_is_found_without_recursion():
    assert channel.nesting_depth_within(b'{"a": [1, {"b": "[[[[[["}]}', 3)
    assert not channel.nesting_depth_within(b"[[[[]]]]", 3)
    assert channel.nesting_depth_within(b'["\\"[[[[[["]', 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_the_private_opener_refuses_links_fifos_devices_and_big_files(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    os.symlink("/dev/zero", tmp_path / "zero.json")
    os.mkfifo(tmp_path / "fifo.json")
    os.link(tmp_path / "real.json", tmp_path / "hard.json")
    (tmp_path / "big.json").write_bytes(b" " * 2048)
    (tmp_path / "dir.json").mkdir()
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        for name in ("link.json", "zero.json", "fifo.json", "hard.json", "big.json", "dir.json", "none.json"):
            started = time.monotonic()
            with pytest.raises(channel.ChannelError):
                channel.read_private(folder, name, 1024)
            assert time.monotonic() - started < 5, name
        os.unlink(tmp_path / "hard.json")
        assert channel.read_private(folder, "real.json", 1024) == b"{}"
    finally:
        os.close(folder)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_depends_on_and_sites_are_kept_to_regular_files_of_the_project(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "model.py").write_text("x = 1\n")
    (project / "helper.py").write_text("y = 2\n")
    os.mkfifo(project / "pipe.py")
    os.symlink("/dev/zero", project / "zero.py")
    outside = tmp_path / "id_rsa"
    outside.write_text(SECRET)
    os.symlink(outside, project / "key.py")
    target = {"kind": "script", "path": str(project / "model.py"), "roots": [str(project)]}
    named = [str(project / "helper.py"), str(project / "pipe.py"), str(project / "zero.py"), str(project / "key.py"),
             "/dev/zero", "/proc/self/fd/0", "/dev/stdin", str(outside), "relative.py", 7, None]
    raw = json.dumps({"status": "ok", "depends_on": named, "construction": [str(outside), 1, 1, 1, 2],
                      "target": {"kind": "factory", "factory": "os:system"}}).encode()
    facts = _facts(raw, target)
    assert facts.depends_on == [str(project / "helper.py")]
    assert facts.construction is None
    assert facts.target == target  # the parent's own target, never the one the result names


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_the_model_cache_hashes_nothing_it_would_wait_on(tmp_path):
    from tcaudit.model import model_cache

    os.mkfifo(tmp_path / "pipe.py")
    started = time.monotonic()
    assert model_cache._digest(str(tmp_path / "pipe.py")) is None
    assert model_cache._digest("/dev/zero") is None
    assert time.monotonic() - started < 5


# -- no internal error ends a scan ------------------------------------------------------------------------


@pytest.mark.parametrize("error, words", [
    (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "internal error (UnicodeEncodeError"),
    (RecursionError("maximum recursion depth exceeded"), "nesting too deep (RecursionError)"),
    (MemoryError(), "out of memory (MemoryError)"),
])
def test_an_exception_while_scanning_one_file_is_its_tc000(tmp_path, monkeypatch, error, words):
    from conftest import run_cli
    from tcaudit import engine

    (tmp_path / "bad.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    (tmp_path / "good.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    original = engine.scan_source

    def scan_source(source, *args, **kwargs):
        if source.path.name == "bad.py":
            raise error
        return original(source, *args, **kwargs)

    monkeypatch.setattr(engine, "scan_source", scan_source)
    code, out, err = run_cli("scan", ".", "--no-exec", "--no-cache", "--isolated", "--format", "json", cwd=tmp_path)
    assert code == 1, err
    found = sorted((f["path"], f["rule"], f["message"]) for f in json.loads(out)["findings"])
    assert [(p, r) for p, r, _ in found] == [("bad.py", "TC000"), ("good.py", "TC202")]
    assert words in found[0][2]


def test_an_exception_while_fixing_one_file_leaves_it_and_fixes_the_others(tmp_path, monkeypatch):
    from conftest import run_cli
    from tcaudit.fix import engine as fix_engine

    text = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    (tmp_path / "bad.py").write_text(text)
    (tmp_path / "good.py").write_text(text)
    original = fix_engine._fix_source

    def fix_source(path, *args, **kwargs):
        if path.name == "bad.py":
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(fix_engine, "_fix_source", fix_source)
    code, out, err = run_cli("fix", "--apply", ".", "--no-exec", "--no-cache", "--isolated", cwd=tmp_path)
    # Every file is handled; the exit code still says a bug of tcaudit's was met (SPEC: 2, internal error).
    assert code == 2 and "bad.py: not fixed: cannot analyse: internal error (UnicodeEncodeError" in err, err
    assert "fixed good.py (TC202)" in err
    assert (tmp_path / "bad.py").read_text() == text
    assert "torch.amp.GradScaler" in (tmp_path / "good.py").read_text()


# -- what a scanned file holds is shown escaped on a terminal ------------------------------------------------

ESCAPES = "\x1b]0;PWNED\x07 \x1b]52;c;ZWNobyBoaQ==\x07 \x1b[2J \u202e"
EVIL = f"import torch\n# {ESCAPES}\nscaler = torch.cuda.amp.GradScaler()  # \x1b[31mred\r\n"


@pytest.mark.parametrize("fmt", ["text", "concise", "github"])
def test_escape_sequences_in_a_file_and_its_name_are_shown_escaped(tmp_path, fmt):
    from conftest import run_cli

    name = "ev\x1b[2Jil.py"
    (tmp_path / name).write_text(EVIL, newline="")
    code, out, err = run_cli("scan", ".", "--no-exec", "--no-cache", "--isolated", "--color", "always",
                             "--format", fmt, cwd=tmp_path)
    assert code == 1, err
    # What tcaudit's own colours add is SGR (ESC [ ... m); nothing of the file's reaches the terminal.
    raw = out.replace("\x1b[0m", "")
    for sequence in ("\x1b]0;", "\x1b]52;", "\x1b[2J", "\x07", "\u202e", "\x1b[31mred", "\r"):
        assert sequence not in raw, (fmt, sequence)
    assert "ev\\x1b[2Jil.py" in out
    if fmt == "text":  # the code frame shows the line, escaped
        assert "# \\x1b]0;PWNED\\x07 \\x1b]52;c;ZWNobyBoaQ==\\x07 \\x1b[2J \\u202e" in out


def test_fix_messages_and_a_terminal_diff_show_escapes_escaped(tmp_path):
    from conftest import run_cli

    (tmp_path / "ev\x1b[2Jil.py").write_text(EVIL, newline="")
    code, out, err = run_cli("fix", ".", "--no-exec", "--no-cache", "--isolated", "--color", "always", cwd=tmp_path)
    assert code == 1
    for text in (out, err):
        assert "\x1b]52;" not in text and "\x1b[2J" not in text and "\x07" not in text
    assert "\\x1b]52;" in out
    code, out, err = run_cli("fix", ".", "--no-exec", "--no-cache", "--isolated", "--color", "never", cwd=tmp_path)
    assert "\x1b]52;" in out  # piped, the diff is the patch itself, byte for byte


# -- what the model's view shows, and what a report reads ---------------------------------------------------


def test_the_view_hides_every_top_level_folder_but_the_systems(tmp_path):
    from tcaudit.model import jail

    plan = jail.make_plan(str(tmp_path / "private"), [str(tmp_path)])
    for entry in os.scandir("/"):
        if entry.is_dir(follow_symlinks=False) and not entry.is_symlink() and entry.name not in jail._ROOT_KEPT:
            assert entry.path in plan.hidden, entry.path  # /opt (a CI runner's .credentials), /var (cloud-init)
    for folder in ("/etc/ssl/private", "/etc/cloud"):
        if os.path.isdir(folder):
            assert folder in plan.hidden
    assert "/usr" not in plan.hidden and "/etc" not in plan.hidden


def test_a_home_folder_that_is_the_project_shows_none_of_its_dot_entries(tmp_path, monkeypatch):
    from tcaudit.model import jail

    home = tmp_path / "home"
    for name in (".kaggle/kaggle.json", ".npmrc", ".pgpass", ".cache/huggingface/config.json",
                 ".cache/huggingface/token", ".cache/other/secret", "train.py"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    monkeypatch.chdir(tmp_path)
    plan = jail.make_plan(str(tmp_path / "private"), [str(home)])
    real = os.path.realpath(home)
    assert {f"{real}/.kaggle", f"{real}/.cache/other"} <= set(plan.hidden)
    assert {f"{real}/.npmrc", f"{real}/.pgpass", f"{real}/.cache/huggingface/token"} <= set(plan.blanked)
    assert f"{real}/.cache/huggingface" not in plan.hidden and f"{real}/.cache" not in plan.hidden
    assert f"{real}/train.py" not in plan.blanked


def test_the_hook_refuses_to_read_what_the_view_hides(tmp_path):
    from tcaudit.model import guard, jail

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "data.txt").write_text("data")
    (tmp_path / "secret").write_text(SECRET)
    plan = jail.Plan(str(tmp_path / "private"), (str(tmp_path / "project"),), (str(tmp_path),),
                     (str(tmp_path / "project" / "blank"),))
    hook = guard.make_hook(str(tmp_path / "private"), None, (plan.visible, plan.hidden, plan.blanked))
    hook("open", (str(tmp_path / "project" / "data.txt"), "r", 0))
    hook("open", ("/usr/lib/os-release", "r", 0))
    for path in (tmp_path / "secret", tmp_path / "project" / "blank", tmp_path / "project" / ".." / "secret"):
        with pytest.raises(guard.SandboxRefusal, match="which the sandbox's view hides"):
            hook("open", (str(path), "r", 0))


def test_a_symlinked_script_outside_the_project_is_reported_by_name_only(tmp_path):
    from conftest import run_cli

    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "keys.py").write_text(f"import torch\nTOKEN = '{SECRET}'\nscaler = torch.cuda.amp.GradScaler()\n")
    os.symlink(outside / "keys.py", project / "link.py")
    (project / "ok.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    for fmt in ("text", "json", "sarif"):
        code, out, err = run_cli("scan", ".", "--no-exec", "--no-cache", "--isolated", "--format", fmt, cwd=project)
        assert code == 1, err
        assert SECRET not in out + err and "TOKEN" not in out + err
        assert "link.py: not scanned: a symlink to a file outside the project" in out + err, fmt


# -- budgets per model, not per process -----------------------------------------------------------------------

FORK_MEMORY = PREAMBLE + '''
    def attack(self):
        import ctypes
        import time
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(6):  # beneath the hook, each child within the per-process limit
            if libc.fork() == 0:
                hold = b"x" * (300 << 20)
                time.sleep(20)
                os._exit(0)
        hold = b"x" * (300 << 20)
        time.sleep(20)


model = Attack()
'''
FILL_FOLDER = PREAMBLE + '''
    def attack(self):
        import time
        block = b"x" * (64 << 20)
        for n in range(40):  # 2.5 GiB in files of 64 MiB, each under RLIMIT_FSIZE
            try:
                with open(os.path.join(FOLDER, f"fill-{{n}}"), "wb") as out:
                    out.write(block)
            except OSError:
                break
        raise RuntimeError(f"wrote {{n}} files")


model = Attack()
'''


@pytest.fixture(scope="module", params=_levels())
def budgets(request, tmp_path_factory):
    pytest.importorskip("torch")
    tool = request.param
    monkeypatch = pytest.MonkeyPatch()
    for name, value in _level_env(tool).items():
        monkeypatch.setenv(name, value)
    sandbox._isolation.cache_clear()
    try:
        level = sandbox.isolation_level()
    finally:
        monkeypatch.undo()
        sandbox._isolation.cache_clear()
    if tool != "hook" and level not in (sandbox.BWRAP_LEVEL, sandbox.UNSHARE_LEVEL):
        pytest.skip(f"{tool} cannot make the read-only view here (sandbox level: {level})")
    project = tmp_path_factory.mktemp(f"budgets-{tool}")
    (project / "fork_memory.py").write_text(FORK_MEMORY.format(home=str(project)))
    (project / "fill_folder.py").write_text(FILL_FOLDER.format(home=str(project)))
    (project / "m_innocent.py").write_text(INNOCENT)
    env = {**os.environ, **_level_env(tool), "PYTHONPATH": str(REPO), "TCAUDIT_MODEL_TIMEOUT": "60",
           "TCAUDIT_MODEL_MEMORY": "1"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tcaudit", "scan", ".", "--isolated", "--no-cache", "--select", "TC1",
                           "--format", "json"], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    findings = json.loads(proc.stdout)["findings"] if proc.stdout.strip().startswith("{") else []
    yield Outcome(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started, findings, project, level)


def test_a_model_that_forks_past_its_memory_budget_is_killed_as_a_whole(budgets):
    blocking = any(f["severity"] in ("error", "warning") for f in budgets.findings)
    assert budgets.code == (1 if blocking else 0), budgets.err[-2000:]
    [tc100] = budgets.for_file("fork_memory.py")
    assert "the model's processes held" in tc100["details"]["reason"] and "together" in tc100["details"]["reason"]
    assert budgets.seconds < 60  # killed when it went over, not after its 20 s
    assert {f["rule"] for f in budgets.for_file("m_innocent.py")} == {"TC101"}


def test_a_model_cannot_fill_the_disk_through_its_private_folder(budgets):
    [tc100] = budgets.for_file("fill_folder.py")
    reason = tc100["details"]["reason"]
    if budgets.level == sandbox.HOOK_LEVEL:  # no tmpfs of its own: the folder is watched and emptied
        assert "to its private folder, over the audit's limit" in reason, reason
    else:  # its tmpfs of 512 MiB is full after 7 files of 64 MiB
        assert "RuntimeError: wrote 7 files" in reason or "RuntimeError: wrote 8 files" in reason, reason
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("tcaudit-model-*/fill-*")]
    assert leftovers == []


# -- verify trains the script: --no-network takes the network away ----------------------------------------


def test_verify_no_network_runs_the_command_without_the_hosts_network():
    import shutil
    import socket
    import threading

    from tcaudit.verify.runner import VerifyError, without_network

    try:
        wrapped = without_network([sys.executable, "-c", "pass"])
    except VerifyError as exc:
        pytest.skip(str(exc))
    probe = subprocess.run(wrapped, capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"{wrapped[0]} cannot make a network namespace here: {probe.stderr.decode()[:200]}")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
            "    print('reached')\nexcept OSError as exc:\n    print('refused', type(exc).__name__)\n")
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    inside = subprocess.run(without_network([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
    server.close()
    assert outside.stdout.startswith("reached")
    assert inside.stdout.startswith("refused"), inside
    assert shutil.which(Path(without_network(["x"])[0]).name)


# -- linear time: the edits between two large texts -------------------------------------------------------


def test_the_anchored_diff_rebuilds_the_new_text(monkeypatch):
    from tcaudit.rewrite import textedits

    monkeypatch.setattr(textedits, "_WHOLE", 0)  # every text through the anchored path
    rng = random.Random(49)
    words = ["a\n", "b\n", "\n", "x = 1\n", "def f():\n", "    pass\n", "y\r\n", "z\r"]
    for _ in range(2000):
        old = "".join(rng.choice(words) for _ in range(rng.randrange(0, 60))) + rng.choice(["", "tail"])
        lines = old.splitlines(True)
        for _ in range(rng.randrange(0, 8)):
            at = rng.randrange(len(lines) + 1)
            if rng.random() < 0.4:
                lines.insert(at, rng.choice(words))
            elif lines:
                lines[min(at, len(lines) - 1)] = rng.choice(words)
        new = "".join(lines)
        assert textedits.apply_edits(old, textedits.edits_between(old, new)) == new


def test_a_large_file_of_repeated_lines_gets_one_small_edit_per_change():
    from tcaudit.rewrite import textedits

    step = "def step_{}(model):\n    with torch.cuda.amp.autocast():\n        loss = model()\n    loss.backward()\n\n"
    old = "".join(step.format(i) for i in range(6000))  # 30,000 lines, most of them repeated
    new = old.replace("torch.cuda.amp.autocast()", "torch.amp.autocast(\"cuda\")")
    edits = textedits.edits_between(old, new)
    assert len(edits) == 6000 and textedits.apply_edits(old, edits) == new
