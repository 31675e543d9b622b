"""Parent side of the audit child: start it, hand it one model at a time, enforce the limits.

On platforms with ``fork`` one zygote process per scanner process imports torch once and forks a
fresh process per model (see :mod:`tcaudit.model.worker`); elsewhere each model gets its own
``python -m tcaudit.model.worker run`` process. Either way a model that hangs is killed after the
time limit, one that exhausts the memory limit or crashes the interpreter ends its own process
only, and the outcome is a :class:`ModelFacts` whose ``reason`` says what happened.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from tcaudit.model import channel, guard
from tcaudit.model.facts import ModelFacts

DEFAULT_TIME_LIMIT = 60.0  # seconds per model, from the moment its process starts
DEFAULT_MEMORY_BUDGET = 6 * 1024**3  # bytes the model's process may map beyond the torch import
STARTUP_LIMIT = 180.0  # importing torch on a cold disk can be slow


@dataclass(frozen=True)
class Limits:
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_budget: int = DEFAULT_MEMORY_BUDGET

    @classmethod
    def from_env(cls) -> "Limits":
        """``TCAUDIT_MODEL_TIMEOUT`` (seconds) and ``TCAUDIT_MODEL_MEMORY`` (GiB) override the defaults."""
        time_limit = DEFAULT_TIME_LIMIT
        memory = DEFAULT_MEMORY_BUDGET
        try:
            time_limit = float(os.environ.get("TCAUDIT_MODEL_TIMEOUT", time_limit))
        except ValueError:
            pass
        try:
            memory = int(float(os.environ.get("TCAUDIT_MODEL_MEMORY", memory / 1024**3)) * 1024**3)
        except ValueError:
            pass
        return cls(time_limit, memory)


class Cancelled(Exception):
    """The audit was cancelled (:meth:`Sandbox.cancel`): the model being built was killed, and what
    this audit measured is to be dropped, never cached (an editor's newer save supersedes it)."""


class StartupError(Exception):
    """The audit child could not import torch; the model checks are skipped with a note."""


# Environment variables that look like credentials never reach the user's model code.
_CREDENTIAL_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|(^|_)KEY($|_)"
    r"|(^|_)AUTH|SESSION|COOKIE|^AWS_|^AZURE_|^GCP_|^GOOGLE_|^ACTIONS_|^SSH_AUTH_SOCK$|^NETRC$|_PAT$",
    re.IGNORECASE,
)


def is_credential_name(name: str) -> bool:
    return bool(_CREDENTIAL_NAME.search(name))


HOOK_LEVEL = "audit hook"
NAMESPACE_LEVEL = "audit hook; no network: user and network namespaces"
PROCESS_LEVEL = "audit hook; no network, own processes: user, network, PID, mount, IPC and UTS namespaces"
_JAIL = ("audit hook; read-only file system (home, /tmp, /run and sockets hidden), no network, own "
         "processes, no capabilities: {tool} with user, network, PID, mount, IPC and UTS namespaces")
BWRAP_LEVEL = _JAIL.format(tool="bubblewrap")
UNSHARE_LEVEL = _JAIL.format(tool="unshare")
_UNSHARE_PROCESS = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount",
                    "--mount-proc", "--ipc", "--uts", "--")
# The strongest first. With a PID namespace the audit process is its namespace's init: when it ends
# (or ``unshare``/``bwrap``, its parent, is killed) the kernel kills every process it started,
# ``setsid`` daemons included, and no process of the scan is visible or can be signalled from inside.
# The two file-system levels add the view of :mod:`tcaudit.model.jail`: made by bubblewrap where its
# ``bwrap`` is installed, else by the audit process itself inside unshare's namespaces.
_LEVELS = (
    (BWRAP_LEVEL, "bwrap", ()),  # its arguments: jail.bwrap_arguments
    (UNSHARE_LEVEL, "unshare", _UNSHARE_PROCESS),
    (PROCESS_LEVEL, "unshare", _UNSHARE_PROCESS),
    (NAMESPACE_LEVEL, "unshare", ("--user", "--map-root-user", "--net", "--")),
)
_JAIL_LEVELS = (BWRAP_LEVEL, UNSHARE_LEVEL)


def _probe(level: str, tool: str, flags: tuple[str, ...]) -> bool:
    """Whether ``tool`` starts a process here with these namespaces (and, for the file-system
    levels, whether a process forked in them can make its view and give up its capabilities)."""
    from tcaudit.model import jail

    binary = shutil.which(tool)
    if binary is None:
        return False
    workdir = tempfile.mkdtemp(prefix="tcaudit-probe-")
    try:
        launcher = [binary, *(jail.bwrap_arguments(workdir) if tool == "bwrap" else flags)]
        if level in _JAIL_LEVELS:
            command = [*launcher, sys.executable, "-m", "tcaudit.model.jail", "probe"]
            env = {**child_environment(level), "TCAUDIT_JAIL": jail.make_plan(workdir, [os.getcwd()]).to_json()}
        else:
            command, env = [*launcher, "true"], None
        probe = subprocess.run(command, capture_output=True, timeout=30, env=env, cwd=workdir)
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return probe.returncode == 0


@functools.lru_cache(maxsize=1)
def _isolation() -> tuple[str, str, tuple[str, ...]]:
    """The strongest level this machine allows: ``TCAUDIT_SANDBOX_NAMESPACES=0`` turns the
    namespaces off, ``TCAUDIT_SANDBOX_TOOL=unshare`` (or ``bwrap``) uses that tool only."""
    wanted = os.environ.get("TCAUDIT_SANDBOX_TOOL", "")
    if sys.platform.startswith("linux") and os.environ.get("TCAUDIT_SANDBOX_NAMESPACES", "1") != "0":
        for level, tool, flags in _LEVELS:
            if (not wanted or wanted == tool) and _probe(level, tool, flags):
                return level, tool, flags
    return HOOK_LEVEL, "", ()


def isolation_level() -> str:
    """What contains the model's code besides the limits: always the audit hook; where bubblewrap
    is installed or an unprivileged user may create namespaces (``unshare``), a read-only view of
    the file system, no network and a PID namespace of its own; failing those, what of them the
    platform allows (see the README's "Running on code you do not trust")."""
    return _isolation()[0]


def own_pid_namespace() -> bool:
    """Whether the audit process's PIDs are its own namespace's (the parent cannot signal them by number)."""
    return isolation_level() in (*_JAIL_LEVELS, PROCESS_LEVEL)


def read_only_view() -> bool:
    """Whether the audit process sees the file system read-only, home, /tmp, /run and sockets hidden."""
    return isolation_level() in _JAIL_LEVELS


def child_command(arguments: list[str], workdir: str) -> tuple[list[str], dict[str, str]]:
    """The audit process's command line and environment, its private folder ``workdir``."""
    from tcaudit.model import jail

    level, tool, flags = _isolation()
    python = [sys.executable, "-m", "tcaudit.model.worker", *arguments]
    if tool == "bwrap":
        return [shutil.which(tool) or tool, *jail.bwrap_arguments(workdir), *python], _private_environment(workdir)
    return [*((shutil.which(tool) or tool, *flags) if tool else ()), *python], _private_environment(workdir)


def view_for(target: dict[str, Any], workdir: str) -> str | None:
    """The file system view of one model's process (:mod:`tcaudit.model.jail`), as JSON: its
    project and the Python environment visible, ``workdir`` writable; None without namespaces."""
    if not read_only_view():
        return None
    from tcaudit.model import jail

    search_path = [p for p in child_environment().get("PYTHONPATH", "").split(os.pathsep) if p]
    return jail.make_plan(workdir, [*readable_folders(target), *search_path]).to_json()


def readable_for(target: dict[str, Any], workdir: str) -> str | None:
    """The same view's plan for the audit hook, which refuses to open for reading what the view hides
    (at every level: alone, it is all that keeps the model's code from ``~/.kaggle/kaggle.json`` through
    Python's ``open``; with a view, a second layer). None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    from tcaudit.model import jail

    search_path = [p for p in child_environment().get("PYTHONPATH", "").split(os.pathsep) if p]
    return jail.make_plan(workdir, [*readable_folders(target), *search_path]).to_json()


def _kill_group(pgid: int) -> None:
    """Kill what is left of a process group the audit started (its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


# What the audit process inherits: an allowlist (names, and prefixes ending in ``_``), so that a
# secret under a name no pattern foresees (``DATABASE_URL``, ``CI_JOB_JWT``) never reaches it.
_ALLOWED_NAMES = frozenset({
    "PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "VIRTUAL_ENV",
    "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR", "HOME",
    "LD_LIBRARY_PATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "KMP_DUPLICATE_LIB_OK",
    "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE", "HF_DATASETS_OFFLINE",
    "TORCH_HOME", "XDG_CACHE_HOME",
})
_ALLOWED_PREFIXES = ("LC_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "PYTORCH_", "CUDA_", "CUBLAS_",
                     "CUDNN_", "NVIDIA_", "OMP_", "MKL_", "TCAUDIT_")


def is_allowed_name(name: str) -> bool:
    return (name in _ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES)) and not is_credential_name(name)


def child_environment(level: str | None = None) -> dict[str, str]:
    """The audit process's environment: the allowlisted variables, none that looks like a credential."""
    env = {name: value for name, value in os.environ.items() if is_allowed_name(name)}
    env.pop("TCAUDIT_JAIL", None)
    env["TCAUDIT_SANDBOX_LEVEL"] = level = level or isolation_level()
    env["TCAUDIT_SANDBOX_VIEWS"] = "1" if level in _JAIL_LEVELS else "0"  # each model's process makes one
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONSTARTUP", None)
    # The child must import this very tcaudit, wherever the parent found it.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def _private_environment(workdir: str) -> dict[str, str]:
    """With the private folder as its temporary folder, home and caches: what torch or a library
    caches ("in /tmp", in ``~/.cache``, in ``$TORCHINDUCTOR_CACHE_DIR``, which torch itself sets in a
    process that compiled) goes where the audit may write, not to a folder the view hides or shows
    read-only. The model caches it may read (Hugging Face, torch hub) are named where they are."""
    from tcaudit.model import jail

    env = child_environment()
    hf_home, torch_home = jail.model_caches()
    env["HF_HOME"], env["TORCH_HOME"] = hf_home, torch_home
    env["TMPDIR"] = workdir
    for name, folder in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
                         ("TRITON_CACHE_DIR", "triton")):
        env[name] = os.path.join(workdir, folder)
        os.makedirs(env[name], exist_ok=True)
    return env


def describe_status(status: int | None, timed_out: bool, limits: Limits) -> str:
    if timed_out:
        return (
            f"building or tracing the model did not finish within {limits.time_limit:g} s "
            "(a constructor that hangs, or a model too large to trace in time)"
        )
    if status is None:
        return "the audit process ended without a result"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number == signal.SIGKILL:
            return "the audit process was killed (SIGKILL), most likely by the system running out of memory"
        if number == signal.SIGALRM:
            return f"building or tracing the model did not finish within {limits.time_limit:g} s"
        return f"the model's code crashed the audit process ({name})"
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == guard.REPORT_LOST:
            return "the model's code closed the channel on which the sandbox reports what it refused"
        return f"the audit process exited with code {code} without a result"
    return "the audit process ended without a result"


def describe_over(over: dict[str, Any]) -> str:
    """Why the audit killed a model's processes: which budget of the whole model they went over."""
    def gib(value: Any) -> str:
        return f"{value / 1024**3:.1f} GiB" if isinstance(value, (int, float)) else "?"

    what = over.get("what")
    if what == "memory":
        return (f"the model's processes held {gib(over.get('used'))} together, over the audit's memory budget of "
                f"{gib(over.get('limit'))} (TCAUDIT_MODEL_MEMORY)")
    if what == "processes":
        return f"the model's code started {over.get('used')} processes, over the audit's limit of {over.get('limit')}"
    if what == "folder":
        return (f"the model's code wrote {gib(over.get('used'))} ({over.get('entries')} entries) to its private "
                f"folder, over the audit's limit of {gib(over.get('limit'))}")
    return "the model's code went over one of the audit's budgets"


def _log_tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()[-4000:]
    except OSError:
        return ""
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(tail)


class _LineReader:
    """Reads JSON lines from a pipe with a timeout (select + os.read; no blocking readline), each at
    most ``limit`` bytes (a result is forwarded on one line)."""

    def __init__(self, fd: int, limit: int = 2 * channel.MAX_RESULT_BYTES + (1 << 20)) -> None:
        self.fd = fd
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0

    def read(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while not self.chunks or b"\n" not in self.chunks[-1]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError("the audit process closed its output")
            self.chunks.append(chunk)
            self.size += len(chunk)
            if self.size > self.limit and b"\n" not in chunk:
                raise ValueError("the audit process wrote a line past the protocol's limit")
        buffer = b"".join(self.chunks)
        line, _, rest = buffer.partition(b"\n")
        self.chunks, self.size = ([rest], len(rest)) if rest else ([], 0)
        message = json.loads(line.decode("utf-8"))
        if not isinstance(message, dict):
            raise ValueError("the audit process wrote something that is not the protocol")
        return message


class Zygote:
    """One ``worker serve`` process that forks a fresh process per model."""

    def __init__(self, preload: list[str]) -> None:
        self.workdir = tempfile.mkdtemp(prefix="tcaudit-model-")
        self.log_path = os.path.join(self.workdir, "zygote.log")
        self.preload = list(preload)
        self.counter = 0
        self.current: int | None = None  # the model's process while one is built
        command, env = child_command(["serve", *preload], self.workdir)
        log = open(self.log_path, "wb")
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        finally:
            log.close()
        self.reader = _LineReader(self.process.stdout.fileno())
        try:
            hello = self.reader.read(STARTUP_LIMIT)
        except EOFError:
            hello = None
        if not hello or not hello.get("ready"):
            detail = (hello or {}).get("error") or _log_tail(self.log_path) or "no answer"
            self.close()
            raise StartupError(f"the audit process could not start torch: {detail}")
        self.torch_version = hello.get("torch", "")

    def alive(self) -> bool:
        return self.process.poll() is None

    def cancel(self) -> None:
        """From another thread: kill the model being built now (its result then says so). In a PID
        namespace of its own the model's pid is not ours to signal: the zygote ends, as on a timeout."""
        pid = self.current
        if pid is None:
            return
        if own_pid_namespace():
            self.close(graceful=False)
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError, OverflowError):
            pass

    def run(self, job: dict[str, Any], limits: Limits) -> ModelFacts:
        # The job, the result and the log never pass through a name in the private folder, where the
        # model's code could have planted a symlink or a FIFO (tcaudit/model/channel.py).
        self.counter += 1
        request = {"job": job, "private": self.workdir, "view": view_for(job["target"], self.workdir),
                   "readable": readable_for(job["target"], self.workdir)}
        self.process.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
        self.process.stdin.flush()
        started = self.reader.read(30.0)
        if not started or "pid" not in started:
            raise EOFError("the audit process did not start the model's process")
        pid = self.current = started["pid"]
        # Handed over only now: the model's process, forked already, never had it in its memory.
        nonce = secrets.token_hex(16)
        self.process.stdin.write((json.dumps({"nonce": nonce}) + "\n").encode("utf-8"))
        self.process.stdin.flush()
        finished = self.reader.read(limits.time_limit)
        timed_out = finished is None
        if timed_out and own_pid_namespace():
            # The model's pid is its namespace's number, not ours: end the whole namespace (the next
            # model starts a new audit process).
            self.close(graceful=False)
        elif timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError, OverflowError):
                pass
            finished = self.reader.read(30.0)
        self.current = None
        finished = finished or {}
        if finished and finished.get("nonce") != nonce:
            self.close(graceful=False)  # the protocol is out of step: the next model gets a new audit process
            return ModelFacts.failed(job["target"], "the audit process answered for another build than this model's")
        status = finished.get("status") if isinstance(finished.get("status"), int) else None
        result = finished.get("result")
        raw = result.encode("utf-8", "surrogateescape") if isinstance(result, str) else None
        log = finished.get("log") if isinstance(finished.get("log"), str) else ""
        facts = result_facts(job["target"], raw, log, status, timed_out, limits, finished.get("result_error"))
        if isinstance(finished.get("over"), dict):
            facts = ModelFacts.failed(job["target"], describe_over(finished["over"]))
        return _refused(finished.get("refused"), job["target"]) or facts

    def close(self, graceful: bool = True) -> None:
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            if graceful:  # end of input: the zygote exits on its own
                try:
                    process.stdin.close()
                    process.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            if process.poll() is None:
                process.kill()
                process.wait()
        if process is not None:
            _kill_group(process.pid)  # its own session: nothing it started outlives the audit
        shutil.rmtree(self.workdir, ignore_errors=True)


MAX_RESULT_BYTES = channel.MAX_RESULT_BYTES  # a result larger than this is not a model's facts: TC100
MAX_TEXT = 2_000  # characters of one text from the audit process (an exception's message) kept
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b[@-_]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(text: Any) -> str:
    """A text the audit process reported, made safe to print: terminal escape sequences and control
    characters removed (a model's exception could recolour or retitle the user's terminal), newlines
    and tabs kept, at most :data:`MAX_TEXT` characters."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", str(text)))
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _untrusted_facts(data: Any, target: dict[str, Any]) -> ModelFacts:
    """The child's result, read as data: for the parent's own ``target`` (not the one it names), every
    text it reports cleaned, every file it names kept only where it is a regular file of the model's
    project (a ``depends_on`` of ``/dev/zero`` or ``/proc/self/fd/0``, a site in ``~/.ssh``: dropped).
    Raises ValueError (or another exception of a malformed structure) where it is not a result at all."""
    if not isinstance(data, dict):
        raise ValueError("not a result")
    facts = ModelFacts.from_json({**data, "target": target})
    facts.reason = clean_text(facts.reason) if facts.reason else facts.reason
    facts.capture.failures = [clean_text(t) for t in facts.capture.failures]
    facts.capture.notes = [clean_text(t) for t in facts.capture.notes]
    folders = project_folders(target)
    facts.depends_on = sorted({f for f in (channel.project_file(p, folders) for p in facts.depends_on) if f})
    if facts.construction is not None and not channel.inside(facts.construction.path, folders):
        facts.construction = None
    for item in (*facts.modules.values(), *facts.ops):
        if item.site is not None and not channel.inside(item.site.path, folders):
            item.site = None
    return facts


def _refused(refused: Any, target: dict[str, Any]) -> ModelFacts | None:
    """TC100 for a model whose process had operations refused, as the audit hook wrote them to the
    parent's pipe (whatever the model's process then wrote as its result)."""
    if not isinstance(refused, list) or not refused:
        return None
    texts = [clean_text(text)[:300] for text in refused[:guard.MAX_REFUSALS]]
    return ModelFacts.failed(target, clean_text(guard.describe(texts, isolation_level())))


def result_facts(target: dict[str, Any], raw: bytes | None, log: str, status: int | None, timed_out: bool,
                 limits: Limits, result_error: Any = None) -> ModelFacts:
    """The model's facts from the bytes its process left as its result (``raw``), or why there are
    none: a result over the size cap, nested too deep, not JSON or not facts is a TC100 with that
    reason, as is a process that ended without one (with the last line of its ``log``)."""
    if not timed_out:
        if isinstance(result_error, str):
            return ModelFacts.failed(target, clean_text(result_error))
        if raw:
            try:
                return _untrusted_facts(channel.parse_untrusted(raw), target)
            except channel.ChannelError as exc:
                return ModelFacts.failed(target, str(exc))
            except Exception:  # noqa: BLE001 - whatever shape the model's side gave it, it is not facts
                return ModelFacts.failed(target, "the audit process wrote a result that is not a model's facts")
    reason = describe_status(status, timed_out, limits)
    if not timed_out and status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        tail = clean_text(_last_line(log))
        if tail:
            reason += f": {tail.strip()[:200]}"
    return ModelFacts.failed(target, reason)


def _last_line(log: str) -> str:
    lines = [line for line in log[-4000:].splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_once(job: dict[str, Any], limits: Limits) -> ModelFacts:
    """One process per model: for platforms without fork. The job is written before the model's
    process starts; its result comes back through a descriptor the scanner opened on an unlinked file
    (POSIX), else is read relative to the folder's descriptor (no symlink, FIFO or device, size-capped);
    its log through the scanner's own descriptor."""
    workdir = tempfile.mkdtemp(prefix="tcaudit-model-")
    job_path = os.path.join(workdir, "job.json")
    result_path = os.path.join(workdir, "result.json")
    with open(job_path, "x", encoding="utf-8") as handle:
        json.dump(job, handle)
    timed_out = False
    posix = os.name == "posix"
    result_fd = _unlinked(workdir, "result") if posix else None
    command, env = child_command(["run", job_path, f"fd:{result_fd}" if posix else result_path], workdir)
    view = view_for(job["target"], workdir)
    if view:
        env["TCAUDIT_JAIL"] = view
    readable = readable_for(job["target"], workdir)
    if readable:
        env["TCAUDIT_READABLE"] = readable
    log_fd = _unlinked(workdir, "log")  # ours alone: the model's process gets the descriptor
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=env, cwd=workdir,
            pass_fds=(result_fd,) if result_fd is not None else (),
            **({"start_new_session": True} if hasattr(os, "killpg") else {}),
        )
        try:
            process.wait(timeout=limits.time_limit + STARTUP_LIMIT)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.kill()
            process.wait()
        if hasattr(os, "killpg"):
            _kill_group(process.pid)
        status = None
        if process.returncode is not None and not timed_out:
            code = process.returncode
            status = (-code) & 0x7F if code < 0 else (code & 0xFF) << 8
        raw, error = None, None
        if not timed_out:
            try:
                if result_fd is not None:
                    raw = channel.read_capped(result_fd, MAX_RESULT_BYTES, "the result")
                else:
                    raw = channel.read_private_path(workdir, "result.json", MAX_RESULT_BYTES)
            except channel.ChannelError as exc:
                error = None if "No such file" in str(exc) else f"the audit process wrote a result that {exc}"
        log = channel.tail(log_fd).decode("utf-8", "replace")
    finally:
        for fd in (log_fd, result_fd):
            if fd is not None:
                os.close(fd)
    facts = result_facts(job["target"], raw, log, status, timed_out, limits, error)
    shutil.rmtree(workdir, ignore_errors=True)
    return facts


def _unlinked(folder: str, name: str) -> int:
    """A new file of ours in ``folder`` that has no name left (the model's code cannot reach it by one)."""
    path = os.path.join(folder, f"{name}-{secrets.token_hex(8)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.unlink(path)
    except OSError:  # Windows: an open file cannot be removed; it goes with the folder
        pass
    return fd


class Sandbox:
    """Runs audit jobs; keeps one zygote alive for the life of the scanner process."""

    def __init__(self) -> None:
        self.zygote: Zygote | None = None
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """From another thread: end the audit running now. The model being built is killed and
        :meth:`run` raises :class:`Cancelled` (for it and every job after it) until :meth:`resume`."""
        self._cancelled.set()
        zygote = self.zygote
        if zygote is not None:
            zygote.cancel()

    def resume(self) -> None:
        """Run jobs again after a :meth:`cancel` (the next audit calls it first)."""
        self._cancelled.clear()

    def run(self, jobs: list[dict[str, Any]], limits: Limits, preload: list[str]) -> list[ModelFacts]:
        if not hasattr(os, "fork") or sys.platform == "win32":
            return [self._checked(run_once(job, limits)) for job in jobs if self._not_cancelled()]
        results = []
        for job in jobs:
            self._not_cancelled()
            results.append(self._checked(self._run_forked(job, limits, preload)))
        return results

    def _not_cancelled(self) -> bool:
        if self._cancelled.is_set():
            raise Cancelled
        return True

    def _checked(self, facts: ModelFacts) -> ModelFacts:
        """The facts of a build that :meth:`cancel` did not end (a killed build's are not the model's)."""
        self._not_cancelled()
        return facts

    def _run_forked(self, job: dict[str, Any], limits: Limits, preload: list[str]) -> ModelFacts:
        for attempt in range(2):
            if self.zygote is None or not self.zygote.alive():
                self.zygote = Zygote(preload)
            try:
                return self.zygote.run(job, limits)
            except (EOFError, BrokenPipeError, OSError, ValueError):
                # The audit process died or said something that is not the protocol: whether its own
                # fault or the model's code's (it can signal it where there is no PID namespace), the
                # scan goes on; a new one gets the model once more, then the model is TC100. Ended by
                # cancel(): no second try.
                self.close()
                self._not_cancelled()
        return ModelFacts.failed(job["target"], "the audit process ended twice while this model was built "
                                 "(killed or signalled, by the system or by the model's code)")

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None


def readable_folders(target: dict[str, Any]) -> tuple[str, ...]:
    """What a model's audit must be able to read: its roots and its script's folder, and the folder
    the scan runs in (where a script's relative paths point)."""
    from tcaudit.model.jail import home_or_above

    folders = [*target.get("roots", []), os.path.dirname(str(target.get("path") or ""))]
    if not home_or_above(os.getcwd()):  # the project is shown, the home folder around it is not
        folders.append(os.getcwd())
    return tuple(dict.fromkeys(os.path.realpath(f) for f in folders if f))


def project_folders(target: dict[str, Any]) -> tuple[str, ...]:
    """The model's own project: its roots and its script's folder (not the folder the scan runs in,
    which may be the home folder). The only places a result may name a file."""
    folders = [*target.get("roots", []), os.path.dirname(str(target.get("path") or ""))]
    return tuple(dict.fromkeys(os.path.realpath(f) for f in folders if f))


_SANDBOX: Sandbox | None = None


def shared_sandbox() -> Sandbox:
    global _SANDBOX
    if _SANDBOX is None:
        _SANDBOX = Sandbox()
        atexit.register(_SANDBOX.close)
    return _SANDBOX
