"""Run many training scripts from one process that imported torch once (a fork server).

    python runner.py jobs.json results.json PARALLEL

Each job is forked from this process, so torch's ~3 s import is paid once and no script sees what
another changed (backend flags, default dtype, globals). The shim (shim/sitecustomize.py, on
PYTHONPATH) is already installed here; each child starts a fresh record with the same seed and runs
the script as ``__main__`` with its own argv, working directory, environment and output files.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import traceback

import sitecustomize as shim  # the oracle shim, installed at interpreter start


def _child(job: dict) -> int:
    os.chdir(job["cwd"])
    os.environ.update(job["env"])
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [job["script"], *job["argv"]]
    sys.path[0] = os.path.dirname(job["script"])
    sys.path[1:1] = [os.path.join(sys.path[0], folder) for folder in job.get("path", ())]
    shim.begin()
    code = 0
    try:
        runpy.run_path(job["script"], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the script's failure is the result
        traceback.print_exc()
        code = 1
    shim.dump()
    return code


def _warm_imports() -> None:
    """What nearly every script imports or touches lazily (an optimizer's first step imports
    torch._dynamo): imported once here instead of once per child."""
    import importlib

    for name in ("numpy", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torchvision"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional package only costs the child its import
            pass


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ranks(job: dict) -> list[dict]:
    """A job with ``world_size`` N runs as N forked ranks, as torchrun would start them."""
    world = job.get("world_size", 1)
    if world == 1:
        return [job]
    port = str(_free_port())
    ranks = []
    for rank in range(world):
        env = {**job["env"], "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        ranks.append({**job, "env": env, "stdout": f"{job['stdout']}.rank{rank}", "stderr": f"{job['stderr']}.rank{rank}"})
    return ranks


def main(jobs_path: str, results_path: str, parallel: int) -> None:
    jobs = json.loads(open(jobs_path).read())
    if os.environ.get("TCAUDIT_ORACLE_WARM", "1") == "1":
        _warm_imports()
    pending, running, results = list(jobs), {}, {}
    while pending or running:
        # All ranks of a job start together (they meet at a rendezvous), even past ``parallel``.
        while pending and (not running or len(running) + pending[0].get("world_size", 1) <= parallel):
            job = pending.pop(0)
            for rank_job in _ranks(job):
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = _child(rank_job)
                    finally:
                        try:
                            sys.stdout.flush()
                            sys.stderr.flush()
                        finally:
                            os._exit(code & 0xFF)
                running[pid] = (job, time.monotonic())
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            for pid, (job, started) in list(running.items()):
                if time.monotonic() - started > job["timeout"]:
                    os.kill(pid, signal.SIGKILL)
                    results[job["id"]] = {"rc": 124, "seconds": job["timeout"], "cpu_seconds": 0.0}
            time.sleep(0.05)
            continue
        if pid in running:
            job, started = running.pop(pid)
            rc = os.waitstatus_to_exitcode(status)
            result = results.setdefault(job["id"], {"rc": 0, "seconds": 0.0, "cpu_seconds": 0.0})
            result["rc"] = result["rc"] or rc  # a job fails when any of its ranks fails
            result["seconds"] = max(result["seconds"], round(time.monotonic() - started, 2))
            result["cpu_seconds"] = round(result["cpu_seconds"] + usage.ru_utime + usage.ru_stime, 2)
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
