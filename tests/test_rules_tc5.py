"""TC5 (distributed) on whole training scripts: the exact findings per fixture.

Each fixture is a realistic script for one TRAPS.md shape; the negatives matter as much as the
positives (DataParallel imported as DDP, already-distributed scripts via torchrun / mp.spawn / FSDP
helpers, Hogwild, RL, accelerate). The TC6 fixtures are scanned too: their TC505 findings are part of
what these rules promise.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conftest import FIXTURES
from helpers import scan_code, scan_paths

SCRIPTS = FIXTURES / "scripts"

# (rule, line) of every TC5 finding, per fixture.
EXPECTED = {
    "tc5_accelerate.py": [],  # accelerate owns processes and sharding
    "tc5_dataparallel_ddp_job.py": [("TC501", 23)],  # DataParallel as DDP under init_process_group: an error
    "tc5_int_device.py": [("TC505", 12)],  # device = 0 is CUDA
    # loaders from build_loader (also the held-out set: fix declined), a lambda and a partial
    "tc5_loader_helpers.py": [("TC503", 17), ("TC503", 52), ("TC504", 52), ("TC503", 55)],
    "tc5_windows_gloo.py": [("TC506", 41)],  # the Windows-only gloo branches are not findings
    # DataParallel under ``if cuda and RANK == -1``, smart_DDP(model) under torchrun: the plain-launch fallback
    "tc5_yolov5_dp_mode.py": [],
    "tc5_frozen_teacher_ema.py": [("TC502", 20)],  # DataParallel on a frozen teacher and an EMA copy: no TC501
    "tc5_dataparallel_alias.py": [("TC501", 32)],  # DataParallel imported as DDP: no TC502, TC505
    "tc5_fsdp_helper.py": [],  # FSDP through a helper, sampler reseeded in train_epoch()
    "tc5_hogwild.py": [],  # shared model + torch.multiprocessing: not single-process, not DDP
    "tc5_imagenet_distributed.py": [("TC502", 39), ("TC504", 53)],  # DataParallel fallback is fine
    "tc5_mp_spawn_ddp.py": [("TC503", 38), ("TC504", 38), ("TC506", 32), ("TC507", 50)],  # TC504 follows TC503's fix
    "tc5_nanogpt_ddp.py": [("TC502", 53)],  # require_backward_grad_sync; no DataLoader
    "tc5_rl_actor_critic.py": [],  # env.step is no optimizer; data from the environment
    "tc5_single_gpu.py": [("TC505", 21)],
    "tc5_torchrun_ddp.py": [("TC502", 33)],  # only what is missing (TRAPS 8)
    "tc6_cpu_only.py": [],  # no CUDA anywhere
    "tc6_dcgan.py": [("TC505", 17)],
    "tc6_flags_accumulation.py": [("TC505", 38)],
    "tc6_imagenet_meters.py": [("TC505", 40)],
    "tc6_mnist_style.py": [("TC505", 24)],
    "tc6_nanogpt_logging.py": [("TC505", 46)],
    "tc6_rl_dqn.py": [],
    "tc6_tensorboard_tqdm.py": [("TC505", 30)],
    "tc6_trainer_class.py": [],  # a Trainer module without a main guard: the launcher decides
}


def findings(path, select=("TC5",)):
    result = scan_paths([str(path)], select=select)
    return sorted((f.rule, f.location.line) for f in result.findings)


def test_every_tc5_tc6_fixture_is_listed():
    on_disk = {p.name for p in SCRIPTS.glob("tc[56]_*.py")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_findings(name):
    assert findings(SCRIPTS / name) == sorted(EXPECTED[name])


def test_resnet50_fixture_is_a_single_process_candidate():
    # The SPEC's demo script (owned elsewhere, so matched by text rather than line number).
    result = scan_paths([str(FIXTURES / "resnet50" / "train.py")], select=("TC5",))
    assert [(f.rule, f.source_line.strip()) for f in result.findings] == [
        ("TC505", "for i, (images, target) in enumerate(loader):")
    ]


def _by_rule(name):
    result = scan_paths([str(SCRIPTS / name)], select=("TC5",))
    return {f.rule: f for f in result.findings}


def test_dataparallel_alias_fix_is_declined_with_a_reason():
    finding = _by_rule("tc5_dataparallel_alias.py")["TC501"]
    assert "torch.nn.DataParallel" in finding.message
    assert finding.fix is not None and not finding.fix.available
    assert "DDP" in finding.fix.reason
    assert finding.fix.plan is None and "renamed by hand" in finding.fix.reason


def test_fixes_record_where_they_go():
    mp = _by_rule("tc5_mp_spawn_ddp.py")
    assert mp["TC503"].fix.plan.to_dict() == {
        "kind": "add-distributed-sampler",
        "line": 38,
        "dataset": "train_set",
        "shuffle": None,
        "loader": "train_loader",
        "sampler": "DistributedSampler(train_set, shuffle=True)",
        "import_sampler": True,
    }
    assert mp["TC506"].fix.plan.to_dict()["new"] == '"nccl" if torch.cuda.is_available() else "gloo"'
    no_sync = mp["TC507"].fix.plan.to_dict()
    assert {k: no_sync[k] for k in ("kind", "line", "model")} == {"kind": "wrap-no-sync", "line": 50, "model": "model"}
    imagenet = _by_rule("tc5_imagenet_distributed.py")
    assert imagenet["TC504"].fix.available
    assert imagenet["TC504"].fix.plan.to_dict()["sampler"] == "train_sampler"
    assert imagenet["TC504"].fix.plan.to_dict()["epoch"] == "epoch"
    assert imagenet["TC502"].fix.plan.to_dict() == {
        "kind": "add-keyword", "line": 39, "keyword": "gradient_as_bucket_view", "value": "True"
    }
    single = _by_rule("tc5_single_gpu.py")["TC505"]
    assert str(single.severity) == "info"
    assert single.fix.available and str(single.fix.fix_class) == "structural"


def test_single_process_is_reported_once_per_file(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader_a:
            opt.zero_grad(); model(x.cuda()).sum().backward(); opt.step()
        for x, y in loader_b:
            opt.zero_grad(); model(x.cuda()).sum().backward(); opt.step()
        """,
        select=("TC505",),
    )
    assert [f.location.line for f in result.findings] == [4]
    assert not result.findings[0].fix.available  # no DataLoader to shard


def test_ddp_fix_declined_without_a_data_loader_and_for_grad_surgery(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(Net().cuda())
        for p in model.parameters():
            p.grad.detach_()
        """,
        select=("TC502",),
    )
    (finding,) = result.findings
    assert not finding.fix.available and "detach_" in finding.fix.reason


def test_conditional_alias_has_no_single_type(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch.nn as nn
        Wrapper = nn.parallel.DistributedDataParallel if distributed else nn.DataParallel
        model = Wrapper(net)
        """,
        select=("TC5",),
    )
    assert result.findings == []


def test_unit_tests_that_exercise_ddp_are_not_training_jobs(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import unittest
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        class DistributedTest(unittest.TestCase):
            def test_default_ddp(self):
                dist.init_process_group("gloo")
                model = DDP(torch.nn.Linear(2, 2).cuda())
                nn.DataParallel(torch.nn.Linear(2, 2).cuda())
        """,
        select=("TC5",),
    )
    assert result.findings == []


def test_counts_by_rule_across_fixtures():
    """A summary that changes when any rule's precision does."""
    counts = Counter(rule for name in EXPECTED for rule, _ in findings(SCRIPTS / name))
    assert counts == Counter({"TC505": 8, "TC502": 4, "TC501": 2, "TC503": 4, "TC504": 3, "TC506": 2, "TC507": 1})


def test_set_epoch_is_reported_with_the_sampler_tc503_will_add():
    """Scan says what fix will do: TC503 adds a shuffling DistributedSampler, and set_epoch (TC504)
    then follows in the next fix round, so scan reports both now."""
    mp = _by_rule("tc5_mp_spawn_ddp.py")
    follow = mp["TC504"]
    assert follow.fix.available and follow.fix.plan.to_dict() == {"kind": "after-fix", "after": "TC503"}
    assert "TC503" in follow.message


def test_dataparallel_in_the_single_process_branch_of_a_ddp_script_is_no_error():
    """yolov5: DataParallel when RANK == -1, ``smart_DDP(model)`` (DDP in a helper of another module) under
    torchrun: the script offers DDP, DataParallel is its plain-launch fallback, as in the ImageNet example."""
    assert scan_paths([str(SCRIPTS / "tc5_yolov5_dp_mode.py")], select=("TC501",)).findings == []
    # Without the DDP helper in the other branch, the single-process branch keeps its warning.
    code = (SCRIPTS / "tc5_yolov5_dp_mode.py").read_text().replace("model = smart_DDP(model)", "pass")
    [finding] = scan_code(Path(__import__("tempfile").mkdtemp()), code, select=("TC501",)).findings
    assert str(finding.severity) == "warning" and "in one process" in finding.message
    assert "never synchronise" not in finding.message + finding.explanation


DATAPARALLEL_UNDER = """
import os
import torch
import torch.distributed as dist
import torch.nn as nn
RANK = int(os.environ.get("RANK", -1))
dist.init_process_group("nccl")
model = nn.Linear(8, 8).cuda()
{guard}
    model = nn.DataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    model(torch.randn(8, 8, device="cuda")).sum().backward()
    opt.step()
"""


@pytest.mark.parametrize("guard", ["if RANK == -1:", "if args.local_rank == -1:", "if world_size == 1:",
                                   "if not args.distributed:", "if not dist.is_initialized():"])
def test_single_process_guards(tmp_path, guard):
    [finding] = scan_code(tmp_path, DATAPARALLEL_UNDER.format(guard=guard), select=("TC501",)).findings
    assert str(finding.severity) == "warning", guard


@pytest.mark.parametrize("guard", ["if RANK != -1:", "if world_size > 1:", "if args.distributed:", "if True:"])
def test_multi_process_or_neutral_guards_keep_the_error(tmp_path, guard):
    [finding] = scan_code(tmp_path, DATAPARALLEL_UNDER.format(guard=guard), select=("TC501",)).findings
    assert str(finding.severity) == "error", guard


def test_a_trained_model_in_dataparallel_beside_a_frozen_one_is_still_an_error(tmp_path):
    code = (SCRIPTS / "tc5_frozen_teacher_ema.py").read_text().replace(
        "teacher.requires_grad_(False)\n", "").replace(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)", "opt = torch.optim.SGD(list(model.parameters()) + list(teacher.parameters()), lr=0.1)")
    rules = [(f.rule, str(f.severity)) for f in scan_code(tmp_path, code, select=("TC501",)).findings]
    assert rules == [("TC501", "error")]  # the teacher now trains; the EMA copy stays silent
