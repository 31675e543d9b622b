"""The audit child: ``python -m tcaudit.model.worker serve`` or ``... run JOB RESULT``.

``serve`` is a zygote: it imports torch once (plus what the parent asks it to preload), warms up
``torch.export`` and the fx fast path, then forks one short-lived process per model on request, so that each model is
built in a clean process with its own memory limit and can be killed on a timeout without losing the
warm torch import. ``run`` does one model in this process (platforms without ``fork``).

Protocol of ``serve`` (JSON lines): the parent writes ``{"job": {...}, "private": folder, "view": ...}``
on stdin; the zygote answers ``{"pid": n}`` when the model's process starts; the parent then writes
``{"nonce": text}`` (read by the zygote only after the model's process has ended, so that it was never
in that process's memory), and the zygote answers ``{"pid": n, "status": raw, "refused": [...],
"result": text or null, "log": text, "nonce": text}`` when it ends (``raw`` as from ``os.waitpid``).
The model's process writes its :class:`~tcaudit.model.facts.ModelFacts` as JSON into an anonymous
memory file and its stdout and stderr (the user's prints, torch's warnings) into another, both made
by the zygote before the fork: nothing the scanner reads goes through a name in the private folder
that the model's code could replace (see :mod:`tcaudit.model.channel`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Any

# Set before torch is imported: the audit needs no compute threads, and a process that never
# started an OpenMP pool forks safely.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # fake tensors only: never touch a GPU while scanning

DEFAULT_MEMORY_BUDGET = 6 * 1024**3  # address space the model's process may map beyond the torch import


def _virtual_size() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


MAX_OPEN_FILES = 1024
MAX_FILE_SIZE = 256 * 1024**2  # the result is refused past 64 MiB; the log needs far less
MAX_TASKS = 256  # processes and threads of the audit's user namespace


def apply_limits(memory_budget: int, time_limit: float) -> None:
    """Cap the address space (torch's own mappings plus the budget), open files, the size of a
    written file, CPU time and (in a user namespace of its own, where the count is the
    namespace's) processes; soft and hard alike, so that the model's code cannot raise them again.
    No core dumps, and a last-resort alarm in case the parent dies while the model hangs."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    limits = [(resource.RLIMIT_AS, _virtual_size() + memory_budget), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_NOFILE, MAX_OPEN_FILES), (resource.RLIMIT_FSIZE, MAX_FILE_SIZE)]
    if time_limit > 0:
        limits.append((resource.RLIMIT_CPU, int(time_limit) + 30))
    if os.environ.get("TCAUDIT_SANDBOX_LEVEL", "audit hook") != "audit hook" and hasattr(resource, "RLIMIT_NPROC"):
        limits.append((resource.RLIMIT_NPROC, MAX_TASKS))
    for kind, value in limits:
        try:
            soft, hard = resource.getrlimit(kind)
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):  # macOS refuses RLIMIT_AS; the parent's timeout still holds
            pass
    if hasattr(os, "fork") and time_limit > 0:
        signal.alarm(int(time_limit) + 15)


def _quiet_torch_logging() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("torch", "torch._dynamo", "torch.export", "torch._export", "torch.fx", "torch._subclasses"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def run_target(job: dict[str, Any]) -> dict[str, Any]:
    """Build, capture and normalise one model; never raises."""
    from tcaudit.model.facts import ModelFacts

    target = job["target"]
    facts = ModelFacts(target=target)
    started = time.perf_counter()
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        from tcaudit.model.build import BuildError, NotSelected, UserFiles, build_from_factory, build_from_plan
        from tcaudit.model.capture import audit_model
    except Exception as exc:  # noqa: BLE001
        return ModelFacts.failed(target, f"importing torch in the audit process failed: {exc!r}", "error").to_json()

    _quiet_torch_logging()
    torch.set_num_threads(1)
    roots = [r for r in target.get("roots", []) if r]
    for root in reversed(roots):
        if root not in sys.path:
            sys.path.insert(0, root)
    if roots and os.path.isdir(roots[0]):
        os.chdir(roots[0])
    # The slice runs as if the script had been started without arguments.
    sys.argv = [target.get("path", "")]
    user_files = UserFiles(roots)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        if target["kind"] == "factory":
            built = build_from_factory(target, fake_mode, user_files)
        else:
            built = build_from_plan(target, fake_mode, user_files)
    except NotSelected:
        facts.status = "skipped"
        facts.reason = "this construction is not reached with the script's default flags"
        facts.depends_on = imported_user_files(user_files, target.get("path", ""))
        return facts.to_json()
    except BuildError as exc:
        facts.status = "failed"
        facts.reason = str(exc)
        facts.depends_on = imported_user_files(user_files, target.get("path", ""))
        return facts.to_json()
    facts.construction = built.construction
    facts.timings["build_s"] = round(time.perf_counter() - started, 3)
    try:
        audit_model(built.model, facts, target.get("hints", {}), job.get("precision", "bfloat16"), fake_mode, user_files)
    except MemoryError:
        facts.status = "failed"
        facts.reason = "tracing the model ran out of memory within the audit's limit"
    except Exception as exc:  # noqa: BLE001 - an internal failure is reported, never raised
        facts.status = "error"
        facts.reason = f"internal error while auditing the model: {exc!r}\n{traceback.format_exc()}"
    facts.depends_on = imported_user_files(user_files, target.get("path", ""))
    facts.timings["total_s"] = round(time.perf_counter() - started, 3)
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        per_mib = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        facts.timings["peak_rss_mib"] = round(usage.ru_maxrss / per_mib, 1)
        facts.timings["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    except ImportError:  # pragma: no cover - Windows
        pass
    return facts.to_json()


def imported_user_files(user_files, script: str) -> list[str]:
    """The user's files this process imported (the zygote imported none of them before forking)."""
    files = {os.path.realpath(script)} if script and os.path.isfile(script) else set()
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if filename and user_files(filename):
            files.add(os.path.realpath(filename))
    return sorted(files)


def _write_result(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    # Never through a name the model's code planted (a symlink out of the folder): a fresh file.
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out)
    os.replace(tmp, path)


def _write_result_to(fd: int, data: dict[str, Any]) -> None:
    """The result into the anonymous file the zygote made for it (from its start, whatever the
    model's code wrote there before)."""
    payload = json.dumps(data).encode("utf-8")
    os.ftruncate(fd, 0)
    written = 0
    while written < len(payload):
        written += os.pwrite(fd, payload[written:], written)


def _load_job(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _redirect_output_to(fd: int) -> None:
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def anonymous_file(name: str, folder: str) -> int:
    """A file with no name anywhere (a memfd; else an unlinked temporary file in ``folder``): the
    model's code cannot swap it for a symlink, a FIFO or a device."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create(f"tcaudit-{name}")
        except OSError:
            pass
    import tempfile

    handle = tempfile.TemporaryFile(dir=folder or None)
    fd = os.dup(handle.fileno())
    handle.close()
    return fd


def guarded_run(job: dict[str, Any], private_dir: str, report_fd: int, readable: str | None = None) -> dict[str, Any]:
    """``run_target`` behind the audit hook (:mod:`tcaudit.model.guard`), which writes what it
    refuses to ``report_fd``: the parent reads it there and reports the model as not audited,
    naming what was refused, whatever this process then writes as its result. ``readable``: the
    view's plan (:mod:`tcaudit.model.jail`), whose hidden places the hook refuses to open for reading."""
    from tcaudit.model import guard

    guard.install(private_dir, report_fd, readable)
    return run_target(job)


def _child(request: dict[str, Any], report_fd: int, result_fd: int, log_fd: int) -> None:
    """In the forked process: its own process group (killed as a whole when it ends), limits, the
    guard rail, run, write, exit without running the zygote's cleanup."""
    code = 0
    try:
        os.setpgid(0, 0)
        _redirect_output_to(log_fd)
        os.close(log_fd)
        confine(request.get("view"))
        job = request["job"]
        limits = job.get("limits", {})
        apply_limits(int(limits.get("memory_budget", DEFAULT_MEMORY_BUDGET)), float(limits.get("time_limit", 60)))
        _write_result_to(result_fd, guarded_run(job, request["private"], report_fd, request.get("readable")))
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm_up(preload: list[str]) -> str:
    import importlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tcaudit.model.build  # noqa: F401
    import tcaudit.model.capture  # noqa: F401

    _quiet_torch_logging()
    torch.set_num_threads(1)
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the model's own import will say what is wrong
            pass
    # The first torch.export in a process pays ~0.4 s of one-time setup; pay it here, once.
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 36, 8))
        x = torch.empty(2, 3, 8, 8)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.export.export(model, (x,), strict=False)
    except Exception:  # noqa: BLE001 - warm-up only
        pass
    # The fx fast path's first trace and fake run also import and set up a few things.
    try:
        from tcaudit.model.capture import capture_fx, trace_fx

        capture_fx(trace_fx(model, mode), (x,), True, "bfloat16", mode)
    except Exception:  # noqa: BLE001 - warm-up only
        pass
    return torch.__version__


def serve(preload: list[str]) -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    # Anything that prints during imports must not corrupt the protocol.
    os.dup2(2, 1)
    try:
        version = _warm_up(preload)
    except Exception as exc:  # noqa: BLE001
        protocol.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    protocol.write(json.dumps({"ready": True, "torch": version}) + "\n")
    baseline = _private_memory(os.getpid())  # what every forked model's process starts with (torch)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        request = json.loads(line)
        report_read, report_write = os.pipe()  # the audit hook's refusals, read here after the model
        result_fd = anonymous_file("result", request.get("private", ""))
        log_fd = anonymous_file("log", request.get("private", ""))
        pid = os.fork()
        if pid == 0:
            protocol.close()
            os.close(report_read)
            _child(request, report_write, result_fd, log_fd)
        os.close(report_write)
        protocol.write(json.dumps({"pid": pid}) + "\n")
        limits = request["job"].get("limits", {})
        budget = Budget(int(limits.get("memory_budget", DEFAULT_MEMORY_BUDGET)) + baseline,
                        "" if os.environ.get("TCAUDIT_SANDBOX_VIEWS") == "1" else request.get("private", ""))
        status, over = budget.wait(pid)
        _kill_group(pid)  # whatever the model's process left behind
        if budget.folder:
            _empty(budget.folder)  # removed after the build: nothing of it reaches the next model
        if os.getpid() == 1:
            _end_the_rest()  # and what left its group (setsid): nothing outlives the model's build
        refused = _drain(report_read)
        nonce = _read_nonce(sys.stdin.readline())
        answer: dict[str, Any] = {"pid": pid, "status": status, "refused": refused, "nonce": nonce, "over": over}
        answer.update(_collect(result_fd, log_fd))
        protocol.write(json.dumps(answer) + "\n")
    return 0


MAX_PRIVATE_FOLDER = 512 * 1024**2  # bytes the model's code may leave in its private folder (jail: its tmpfs)
MAX_PRIVATE_ENTRIES = 20_000
KEPT_IN_FOLDER = ("zygote.log", "home", "cache", "torchinductor", "triton")  # made by the parent


class Budget:
    """One model's budgets over all its processes, not per process: the memory they hold together
    (each one's resident memory not backed by a file), how many there are, and (where no file system
    view gives the model a size-capped tmpfs of its own) what its private folder holds. Over any of
    them, the model's processes are killed and the parent is told which."""

    def __init__(self, memory: int, folder: str) -> None:
        self.memory = memory
        self.folder = folder

    def wait(self, pid: int) -> tuple[int, dict[str, Any] | None]:
        over: dict[str, Any] | None = None
        checked_folder = 0.0
        while True:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return status, over
            if over is None:
                processes = _model_processes(pid)
                used = sum(_private_memory(p) for p in processes)
                if used > self.memory:
                    over = {"what": "memory", "used": used, "limit": self.memory}
                elif len(processes) > MAX_TASKS:
                    over = {"what": "processes", "used": len(processes), "limit": MAX_TASKS}
                elif self.folder and time.monotonic() - checked_folder > 0.5:
                    checked_folder = time.monotonic()
                    size, entries = _folder_usage(self.folder)
                    if size > MAX_PRIVATE_FOLDER or entries > MAX_PRIVATE_ENTRIES:
                        over = {"what": "folder", "used": size, "limit": MAX_PRIVATE_FOLDER, "entries": entries}
                if over is not None:
                    for member in processes:
                        try:
                            os.kill(member, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass
                    _kill_group(pid)
            time.sleep(0.05)


def _model_processes(pid: int) -> list[int]:
    """The model's processes: every process of the PID namespace but its init (this zygote) where it
    has one, else the model's process, its group and its descendants."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]))  # parent, group
        except (OSError, IndexError, ValueError):
            continue
    if os.getpid() == 1:
        return [p for p in table if p != 1]
    members = {p for p, (_, group) in table.items() if group == pid} | {pid}
    grew = True
    while grew:
        grew = False
        for p, (parent, _) in table.items():
            if parent in members and p not in members:
                members.add(p)
                grew = True
    return sorted(p for p in members if p in table)


def _private_memory(pid: int) -> int:
    """Bytes of memory a process holds that no file backs: its share of anonymous and shared memory
    (``smaps_rollup``'s Pss_Anon + Pss_Shmem: pages a fork shares count once in all), else, where that
    cannot be read, its resident memory not backed by a file (``statm``)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            fields = dict(line.split(b":", 1) for line in handle.read().splitlines() if b":" in line)
        if b"Pss_Anon" in fields:
            return (int(fields[b"Pss_Anon"].split()[0]) + int(fields.get(b"Pss_Shmem", b"0 kB").split()[0])) * 1024
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            statm = handle.read().split()
        return max(0, int(statm[1]) - int(statm[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _folder_usage(folder: str) -> tuple[int, int]:
    """(bytes, entries) under ``folder``, counting at most a little past the caps."""
    size = entries = 0
    stack = [folder]
    while stack and entries <= MAX_PRIVATE_ENTRIES:
        try:
            with os.scandir(stack.pop()) as listing:
                for entry in listing:
                    entries += 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            size += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return size, entries


def _empty(folder: str) -> None:
    """The private folder as the parent made it: its own subfolders emptied, everything else removed
    (never following a symlink the model's code left)."""
    import shutil

    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                if entry.name in KEPT_IN_FOLDER:
                    os.mkdir(entry.path, 0o700)
            elif entry.name != "zygote.log":
                os.unlink(entry.path)
        except OSError:
            continue


def _read_nonce(line: str) -> str:
    try:
        return str(json.loads(line).get("nonce", ""))
    except (ValueError, AttributeError):
        return ""


def _collect(result_fd: int, log_fd: int) -> dict[str, Any]:
    """What the model's process left in its two anonymous files: the result (None past the size cap,
    with the reason) and the log's tail; closes both."""
    from tcaudit.model import channel

    out: dict[str, Any] = {"result": None}
    try:
        raw = channel.read_capped(result_fd, channel.MAX_RESULT_BYTES, "the result")
        # Carried as text whatever its bytes: the parent turns it back into these bytes to parse them.
        out["result"] = raw.decode("utf-8", "surrogateescape") if raw else None
    except (OSError, channel.ChannelError):
        out["result_error"] = f"the audit process wrote a result over {channel.MAX_RESULT_BYTES >> 20} MiB"
    out["log"] = channel.tail(log_fd).decode("utf-8", "replace")
    for fd in (result_fd, log_fd):
        os.close(fd)
    return out


def _end_the_rest() -> None:
    """As its PID namespace's init: kill every other process in the namespace (a daemon the last
    model's code started, whatever its session or group) and reap them, so that nothing of one
    model's build reaches the next one's."""
    for _ in range(10):
        others = [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != 1]
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                reaped = 0
            if reaped == 0:
                break
        if not others:
            return
        time.sleep(0.01)


def _drain(fd: int, limit: int = 64 * 1024) -> list[str]:
    """The refusals waiting in the pipe, without blocking (a process the model left holding its
    write end cannot stall the audit); closes it."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    finally:
        os.close(fd)
    return [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_once(job_path: str, result: str) -> int:
    """One model in this process. ``result``: ``fd:N``, a descriptor the parent opened (an unlinked
    file: the model's code cannot swap it for a link), or a path (platforms without descriptors to pass)."""
    job = _load_job(job_path)  # before the view: the parent wrote it before this process started
    private = os.path.dirname(os.path.abspath(job_path))
    confine(os.environ.pop("TCAUDIT_JAIL", None))
    readable = os.environ.pop("TCAUDIT_READABLE", None)
    import torch  # noqa: F401 - imported before the limit so that the limit is relative to it

    limits = job.get("limits", {})
    apply_limits(int(limits.get("memory_budget", DEFAULT_MEMORY_BUDGET)), float(limits.get("time_limit", 60)))
    # One process for one model (no fork): the refusals come back through a pipe of this process.
    report_read, report_write = os.pipe()
    data = guarded_run(job, private, report_write, readable)
    refused = _drain(report_read)
    if refused:
        from tcaudit.model import guard
        from tcaudit.model.facts import ModelFacts

        level = os.environ.get("TCAUDIT_SANDBOX_LEVEL", "audit hook")
        data = ModelFacts.failed(job["target"], guard.describe(refused, level)).to_json()
    fd = _result_fd([result])
    if fd is not None:
        _write_result_to(fd, data)
    else:
        _write_result(result, data)
    return 0


def _result_fd(argv: list[str]) -> int | None:
    """The descriptor named by ``fd:N`` as the last argument, if any."""
    if argv and argv[-1].startswith("fd:") and argv[-1][3:].isdigit():
        return int(argv[-1][3:])
    return None


def isolate(keep: int | None = None) -> None:
    """First thing in the audit process, before any import of torch: close every descriptor it may
    have inherited beyond stdin, stdout and stderr, and handle no signal (it may be its PID
    namespace's init, which receives only the signals it handles: Python's SIGINT handler would let
    the model's code interrupt it). Where each model's process makes its own file system view, the
    audit process keeps its capabilities for them (it runs none of the user's code) and is made
    untraceable; elsewhere it gives them up at once."""
    if keep is not None and keep >= 3:  # the result's descriptor, handed in by the parent
        os.closerange(3, keep)
        os.closerange(keep + 1, _descriptor_limit())
    else:
        os.closerange(3, _descriptor_limit())
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        from tcaudit.model import jail

        if os.environ.get("TCAUDIT_SANDBOX_VIEWS") == "1":
            jail.untraceable()
        else:
            jail.drop_privileges()


def confine(view: str | None) -> None:
    """In a model's process, before the job is read: its own file system view (``view``, a
    :class:`~tcaudit.model.jail.Plan` as JSON), then no capabilities at all."""
    if sys.platform.startswith("linux"):
        from tcaudit.model import jail

        if view:
            jail.enter(jail.Plan.from_json(view))
        jail.drop_privileges()


def _descriptor_limit() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if 0 < soft < 1 << 20 else 1 << 16
    except (ImportError, ValueError, OSError):  # pragma: no cover - Windows
        return 256


def main(argv: list[str]) -> int:
    try:
        isolate(_result_fd(argv) if argv and argv[0] == "run" else None)
    except Exception as exc:  # noqa: BLE001 - the parent reads this as the reason the audit did not start
        print(json.dumps({"error": f"setting up the sandbox failed: {exc}"}), flush=True)
        return 1
    if argv and argv[0] == "serve":
        return serve([name for name in argv[1:] if name])
    if len(argv) == 3 and argv[0] == "run":
        return run_once(argv[1], argv[2])
    print("usage: python -m tcaudit.model.worker serve [MODULE...] | run JOB RESULT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
