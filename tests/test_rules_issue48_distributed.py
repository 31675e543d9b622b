"""Issue 48's distributed rules beyond their TOML examples: TC513 uneven-rank-shards (``with model.join():``
around the batch loop, shown to train two gloo ranks with uneven shards to the end where the original fails)
and TC514 process-group-timeout (``timeout=`` on ``init_process_group``): exact fixed texts, fixing twice
changes nothing, declines with their reasons, and the patched scripts run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import run_training, scan_code
from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.fix.engine import fix_file

TORCHRUN = Path(sys.executable).with_name("torchrun")


def _code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _fixed(tmp_path: Path, code: str, rule: str) -> str:
    """The text ``tcaudit fix --select rule`` makes of ``code``; a second fix of it changes nothing."""
    path = tmp_path / "train.py"
    path.write_text(code, encoding="utf-8")
    settings = Settings(select=(rule,), root=tmp_path)
    result = fix_file(path, settings)
    assert result.error is None, result.error
    path.write_text(result.fixed, encoding="utf-8")
    assert not fix_file(path, settings).changed
    return result.fixed


def _only(tmp_path: Path, code: str, rule: str):
    (finding,) = [f for f in scan_code(tmp_path, code, select=(rule,)).findings if f.rule == rule]
    return finding


# -- TC513 uneven-rank-shards ----------------------------------------------------------------------------


def test_tc513_joins_through_the_trainer_attribute(tmp_path):
    code = _code('''
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP


        class Trainer:
            def __init__(self, model, samples):
                self.model = DDP(model)
                self.samples = samples[dist.get_rank()::dist.get_world_size()]
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def train(self, epochs):
                for epoch in range(epochs):
                    # one pass over this rank's shard
                    for x in self.samples:
                        self.optimizer.zero_grad()
                        self.model(x).sum().backward()
                        self.optimizer.step()
    ''')
    loop = code[code.index("            for x in self.samples:"):]
    joined = "            with self.model.join():\n" + textwrap.indent(loop, "    ")
    assert loop in code and _fixed(tmp_path, code, "TC513") == code.replace(loop, joined)
    comment = "            # one pass over this rank's shard\n"
    assert comment + "            with self.model.join():\n" in code.replace(loop, joined)


UNEVEN_TEMPLATE = '''
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank, world_size = dist.get_rank(), dist.get_world_size()
shard = data[rank::world_size]
{setup}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in shard:
    optimizer.zero_grad()
    model(x.cuda()).sum().backward()
    optimizer.step()
{after}
'''


@pytest.mark.parametrize(
    "setup,after,reason",
    [
        ("model = Net().cuda()\nif args.distributed:\n    model = DDP(model)", "",
         "the model is wrapped in DDP only when `args.distributed`"),
        ("model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(Net()).cuda())", "",
         "the script uses SyncBatchNorm"),
        ("model = DDP(Net().cuda())\n\ndef report(loss):\n    dist.all_reduce(loss)\n    return loss",
         "    report(x)", "the training loop meets the other ranks in `dist.all_reduce(loss)`"),
    ],
    ids=["conditional-wrap", "sync-batchnorm", "collective-in-a-helper"],
)
def test_tc513_declines_where_join_would_not_cover_the_loop(tmp_path, setup, after, reason):
    code = UNEVEN_TEMPLATE.format(setup=setup, after=after).lstrip("\n")
    finding = _only(tmp_path, code, "TC513")
    assert finding.severity is Severity.ERROR
    assert not finding.fix.available and finding.fix.reason.startswith(reason), finding.fix.reason
    assert "DistributedSampler" in finding.fix.reason or "only when" in finding.fix.reason
    assert _fixed(tmp_path, code, "TC513") == code


def test_tc513_silent_for_a_contiguous_split_and_a_minimum_over_the_ranks(tmp_path):
    for shard in (
        "n = len(data) // world_size\nshard = data[rank * n:(rank + 1) * n]",
        ("shard = data[rank::world_size]\nsteps = torch.tensor(len(shard))\n"
         "dist.all_reduce(steps, op=dist.ReduceOp.MIN)"),
    ):
        code = UNEVEN_TEMPLATE.format(setup="model = DDP(Net().cuda())", after="").replace(
            "shard = data[rank::world_size]", shard).lstrip("\n")
        assert not [f for f in scan_code(tmp_path, code, select=("TC513",)).findings if f.rule == "TC513"], shard


# Two gloo ranks over 5 samples, one sample a step: rank 0 has 3 steps an epoch, rank 1 has 2. The gloo
# timeout of the test's own init bounds a hang; in practice rank 0 fails at once when rank 1 exits.
UNEVEN_SCRIPT = '''
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = torch.randn(5, 4)
shard = data[rank::world_size]
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 0
for epoch in range(2):
    for x in shard:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        steps += 1
weights = [round(float(p.sum()), 6) for p in model.parameters()]
with open(f"trained-{rank}.txt", "w") as record:  # one file a rank: the ranks' stdout lines interleave
    record.write(f"{steps} {weights}\\n")
dist.destroy_process_group()
'''.lstrip("\n")


def _torchrun(script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(script)]
    return run_training(command, script.parent, env, timeout=180, outputs=("trained-*.txt",))


@pytest.fixture(scope="module")
def uneven_runs(tmp_path_factory):
    """(patched text, original run, patched run, what each rank recorded in each: {"original": {"1": "4 [...]"}}):
    both runs started at once, to share the wait."""
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun is not installed beside {sys.executable}")
    original_dir, patched_dir = tmp_path_factory.mktemp("original"), tmp_path_factory.mktemp("patched")
    (original_dir / "train.py").write_text(UNEVEN_SCRIPT, encoding="utf-8")
    patched = _fixed(patched_dir, UNEVEN_SCRIPT, "TC513")
    with ThreadPoolExecutor(2) as pool:
        original_run, patched_run = pool.map(_torchrun, [original_dir / "train.py", patched_dir / "train.py"])
    records = {
        label: {p.stem.split("-")[1]: p.read_text().strip() for p in folder.glob("trained-*.txt")}
        for label, folder in (("original", original_dir), ("patched", patched_dir))
    }
    return patched, original_run, patched_run, records


@pytest.mark.slow
def test_tc513_fix_is_exact(uneven_runs):
    patched = uneven_runs[0]
    assert patched == UNEVEN_SCRIPT.replace(
        '''    for x in shard:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        steps += 1
''',
        '''    with model.join():
        for x in shard:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            steps += 1
''',
    )


@pytest.mark.slow
def test_tc513_original_fails_and_the_patched_script_trains_both_ranks_to_the_end(uneven_runs):
    _, original, patched, records = uneven_runs
    shown = f"original rc {original.returncode}:\n{original.stdout[-1500:]}\n{original.stderr[-2500:]}"
    assert original.returncode != 0, shown
    assert list(records["original"]) == ["1"] and records["original"]["1"].startswith("4 "), (records, shown)

    shown = f"patched rc {patched.returncode}:\n{patched.stdout[-1500:]}\n{patched.stderr[-4000:]}"
    assert patched.returncode == 0, shown
    trained = {rank: record.split(" ", 1) for rank, record in records["patched"].items()}
    assert trained["0"][0] == "6" and trained["1"][0] == "4", (records, shown)
    assert trained["0"][1] == trained["1"][1], "join's last step makes the ranks' models equal again"


# -- TC514 process-group-timeout -------------------------------------------------------------------------


BARRIER_AFTER_DOWNLOAD = '''
{imports}import torch.distributed as dist

dist.init_process_group(
    backend="gloo",{extra}
)
if dist.get_rank() == 0:
    prepare_data()
dist.barrier()
'''


@pytest.mark.parametrize(
    "imports,expected",
    [
        ("import datetime\n", "datetime.timedelta(minutes=60)"),
        ("import datetime as dt\n", "dt.timedelta(minutes=60)"),
        ("from datetime import timedelta as td\n", "td(minutes=60)"),
    ],
    ids=["datetime", "alias", "timedelta"],
)
def test_tc514_uses_the_files_own_datetime_import(tmp_path, imports, expected):
    code = BARRIER_AFTER_DOWNLOAD.format(imports=imports, extra="").lstrip("\n")
    assert _fixed(tmp_path, code, "TC514") == code.replace(
        '    backend="gloo",\n', f'    backend="gloo",\n    timeout={expected},\n')


def test_tc514_declines_where_kwargs_may_hold_the_timeout(tmp_path):
    code = _code('''
        import torch.distributed as dist

        def setup(**init_kwargs):
            dist.init_process_group("nccl", **init_kwargs)
            if dist.get_rank() == 0:
                prepare_data()
            dist.barrier()
    ''')
    finding = _only(tmp_path, code, "TC514")
    assert not finding.fix.available and "**kwargs" in finding.fix.reason
    assert finding.message == (
        "one rank runs `prepare_data()` (line 6), the rest wait in `barrier()` (line 7); no `timeout=`")
    assert _fixed(tmp_path, code, "TC514") == code


@pytest.mark.slow
def test_tc514_the_patched_script_runs_as_a_gloo_job(tmp_path):
    code = _code('''
        import os
        import time

        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            time.sleep(0.1)
        dist.barrier()
        print("rank", dist.get_rank(), "passed the barrier")
        dist.destroy_process_group()
    ''')
    patched = _fixed(tmp_path, code, "TC514")
    assert patched.startswith("import datetime\nimport os\nimport time\n")
    assert 'dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=60))' in patched
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(tmp_path / "train.py")], check=False, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 passed the barrier" in proc.stdout


def _tc514_lines(tmp_path, init: str, branch: str) -> list[int]:
    code = f"import os\n\nimport torch\nimport torch.distributed as dist\n\n{init}\nif dist.get_rank() == 0:\n"
    code += f"    {branch}\ndist.barrier()\n"
    return [f.location.line for f in scan_code(tmp_path, code, select=("TC514",)).findings if f.rule == "TC514"]


def test_tc514_silent_for_saving_on_rank_zero_and_for_a_group_of_one(tmp_path):
    init = 'dist.init_process_group("nccl")'
    saving = 'torch.save(model.state_dict(), f"checkpoint-{os.getpid()}.pt")\n    _save_snapshot(epoch)'
    assert _tc514_lines(tmp_path, init, saving) == []
    assert _tc514_lines(tmp_path, init, saving.replace("_save_snapshot", "build_cache")) == [6]
    single = 'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)'
    assert _tc514_lines(tmp_path, single, "prepare_data()") == []
    assert _tc514_lines(tmp_path, single.replace("world_size=1", "world_size=2"), "prepare_data()") == [6]


def test_tc514_reads_rank_zero_or_a_single_process(tmp_path):
    init = 'dist.init_process_group("nccl")'
    code = f"import torch.distributed as dist\n\n{init}\nif not dist.is_initialized() or dist.get_rank() == 0:\n"
    code += "    prepare_data()\ndist.barrier()\n"
    assert _fixed(tmp_path, code, "TC514") == code.replace(
        "import torch.distributed as dist\n", "import datetime\n\nimport torch.distributed as dist\n").replace(
        init, 'dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=60))')


def test_tc513_joins_the_model_a_step_helper_is_handed(tmp_path):
    code = UNEVEN_TEMPLATE.format(setup="model = DDP(Net().cuda())", after="").lstrip("\n").replace(
        "    model(x.cuda()).sum().backward()", "    loss_of(model, x).backward()")
    loop = code[code.index("for x in shard:"):]
    assert _fixed(tmp_path, code, "TC513") == code.replace(loop, "with model.join():\n" + textwrap.indent(loop, "    "))
