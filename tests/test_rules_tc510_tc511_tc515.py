"""Issue 48's distributed rules that hang or waste a job (TC510, TC511, TC515): the fixed scripts run as two
gloo ranks on the CPU and finish, and the near misses real scripts have stay quiet. The rules' own examples
(rules/TC510.toml...) run in tests/test_rule_docs.py."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import run_training, scan_code
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

TORCHRUN = Path(sys.executable).parent / "torchrun"


def _torchrun(script: Path, cwd: Path):
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun is not installed beside {sys.executable}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return run_training([str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(script)], cwd, env, timeout=240,
                        outputs=("*.pt",))


# Evaluation on rank 0 through the wrapper of a BatchNorm model, and a checkpoint every rank writes.
SCRIPT = '''
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(net, batches):
    net.eval()
    with torch.no_grad():
        value = sum(float(net(x).sum()) for x in batches)
    net.train()
    return value


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(4):
        loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"eval {evaluate(model, [torch.randn(4, 4)]):.4f}")
        torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_the_fixed_script_evaluates_on_rank_0_with_the_bare_module_saves_once_and_finishes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).lstrip(), encoding="utf-8")
    result = fix_file(script, Settings(select=("TC511", "TC515")))
    assert result.applied == ["TC511", "TC515"], result.declined
    assert "            print(f\"eval {evaluate(model.module, [torch.randn(4, 4)]):.4f}\")\n" in result.fixed
    assert ("        if dist.get_rank() == 0:\n"
            "            torch.save(model.module.state_dict(), \"checkpoint.pt\")\n") in result.fixed
    script.write_text(result.fixed, encoding="utf-8")
    proc = _torchrun(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("eval ") == 4, proc.stdout
    import torch

    state = torch.load(tmp_path / "checkpoint.pt")  # written by one process, loads without a group
    assert sorted(state) == ["0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean",
                             "1.running_var", "1.weight", "2.bias", "2.weight"]


def test_a_metric_reduced_on_every_rank_and_printed_on_one_is_quiet(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        import torch.distributed as dist


        def main(args):
            dist.init_process_group("nccl")
            correct = torch.zeros(1).cuda()
            dist.all_reduce(correct)
            if args.rank == 0:
                print(correct.item())
            if dist.get_rank() == 0:
                print("done")
            dist.barrier()
    ''', select=("TC510",))
    assert result.findings == []


def test_a_rank_test_in_a_helper_called_on_every_rank_is_not_a_rank_branch_of_its_caller(tmp_path):
    """The collective sits in a function of its own, called outside any rank test: quiet; the same
    function called under ``if rank == 0:`` is reported at that call."""
    code = '''
        import torch.distributed as dist


        def sync():
            dist.barrier()


        def main(rank):
            sync()
            if rank == 0:
                sync()
    '''
    result = scan_code(tmp_path, code, select=("TC510",))
    assert [(f.rule, f.location.line) for f in result.findings] == [("TC510", 11)]


def test_a_save_path_per_rank_and_a_save_in_a_rank_0_method_are_quiet(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel


        class Trainer:
            def __init__(self, model):
                self.rank = dist.get_rank()
                self.model = DistributedDataParallel(model)

            def _save(self, epoch):
                torch.save(self.model.module.state_dict(), "checkpoint.pt")

            def train(self, epochs):
                for epoch in range(epochs):
                    if self.rank == 0:
                        self._save(epoch)
                    torch.save({"epoch": epoch}, f"state_rank{self.rank}.pt")


        def main():
            dist.init_process_group("gloo")
            Trainer(torch.nn.Linear(2, 2)).train(2)
    ''', select=("TC515",))
    assert result.findings == []
