"""The fixes the DDP conversion leaves to the next round (TC503 sampler, TC504 set_epoch, TC507 no_sync)
and the ``--compile`` fix (TC305): what they write beyond the fixture pairs, where they decline (the
file is then left byte-for-byte unchanged and the finding keeps the reason), and that they compose
with the conversion itself.

The exact before/after text of each shape is checked by tests/test_fix.py on
fixtures/fix/{tc503,tc504,tc507,compile}_*.in.py / .out.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import run_training
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file


def _settings(rule: str) -> Settings:
    return Settings(select=(rule,), structural_fixes=("compile",) if rule == "TC305" else ())


def _fixed_twice(path: Path, rule: str) -> str:
    """The fixed text, checked to be a fixed point."""
    result = fix_file(path, _settings(rule))
    assert result.changed and result.applied == [rule], (result.declined, result.remaining)
    path.write_text(result.fixed, encoding="utf-8")
    assert not fix_file(path, _settings(rule)).changed
    return result.fixed


def _declined(path: Path, rule: str, reason: str) -> None:
    before = path.read_bytes()
    result = fix_file(path, _settings(rule))
    assert result.error is None
    assert not result.changed, result.diff()
    assert result.source.encode(result.fixed) == before
    reasons = [r for f, r in result.declined if f.rule == rule]
    assert reasons and any(reason in r for r in reasons), result.declined


DDP_HEADER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
"""

LOOP = """\
for epoch in range(3):
    for x, y in train_loader:
        loss = model(x.cuda()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

MODEL = """\
model = DDP(torch.nn.Linear(8, 1).cuda())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


# -- TC503 ----------------------------------------------------------------------------------------------


def test_tc503_positional_shuffle_becomes_false_beside_the_sampler(write):
    path = write(DDP_HEADER + MODEL + "train_loader = DataLoader(train_set, 32, True)\n" + LOOP)
    fixed = _fixed_twice(path, "TC503")
    assert "train_loader = DataLoader(train_set, 32, False, sampler=DistributedSampler(train_set, shuffle=True))\n" in fixed
    assert "from torch.utils.data.distributed import DistributedSampler\n" in fixed


def test_tc503_reuses_the_files_sampler_import_and_alias(write):
    path = write(
        DDP_HEADER.replace("import DataLoader", "import DataLoader, DistributedSampler as DS")
        + MODEL + "train_loader = DataLoader(self_made.train, batch_size=8, shuffle=args.shuffle)\n" + LOOP
    )
    fixed = _fixed_twice(path, "TC503")
    assert "DataLoader(self_made.train, batch_size=8, sampler=DS(self_made.train, shuffle=args.shuffle))" in fixed
    assert "torch.utils.data.distributed" not in fixed


def test_tc503_sampler_none_is_replaced_and_shuffle_dropped(write):
    path = write(
        DDP_HEADER + MODEL
        + "train_loader = DataLoader(\n    train_set,\n    shuffle=True,\n    sampler=None,\n    drop_last=True,\n)\n" + LOOP
    )
    fixed = _fixed_twice(path, "TC503")
    assert (
        "train_loader = DataLoader(\n    train_set,\n    sampler=DistributedSampler(train_set, shuffle=True),\n"
        "    drop_last=True,\n)\n"
    ) in fixed


def test_tc503_dataset_built_in_the_call_is_bound_to_a_name_first(write):
    path = write(DDP_HEADER + MODEL + "# the training data\ntrain_loader = DataLoader(make_dataset(), batch_size=8, shuffle=True)\n" + LOOP)
    fixed = _fixed_twice(path, "TC503")
    assert (
        "# the training data\ntrain_dataset = make_dataset()\n"
        "train_loader = DataLoader(train_dataset, batch_size=8, sampler=DistributedSampler(train_dataset, shuffle=True))\n"
    ) in fixed


def test_tc503_a_shared_kwargs_dict_stays_as_it_is(write):
    """Two loaders read one ``**`` dict holding shuffle=True: the dict is left alone, each sampler reads
    its shuffle, and each loader receives the dict with shuffle off (shuffle beside a sampler raises)."""
    path = write(
        DDP_HEADER + MODEL
        + 'loader_kwargs = {"batch_size": 8, "shuffle": True}\n'
        + "train_loader = DataLoader(train_set, **loader_kwargs)\n"
        + "extra_train_loader = DataLoader(extra_set, **loader_kwargs)\n" + LOOP
    )
    fixed = _fixed_twice(path, "TC503")
    assert 'loader_kwargs = {"batch_size": 8, "shuffle": True}\n' in fixed
    assert ('train_loader = DataLoader(train_set, **{**loader_kwargs, "shuffle": False}, '
            'sampler=DistributedSampler(train_set, shuffle=loader_kwargs.get("shuffle", False)))\n') in fixed
    assert ('extra_train_loader = DataLoader(extra_set, **{**loader_kwargs, "shuffle": False}, '
            'sampler=DistributedSampler(extra_set, shuffle=loader_kwargs.get("shuffle", False)))\n') in fixed


def test_tc503_a_conditional_dict_shuffle_is_read_at_run_time(write, tmp_path):
    """pytorch/examples' MNIST: ``train_kwargs.update(accel_kwargs)`` adds shuffle on one path only. The
    patched loader runs on both paths: no ValueError for a sampler beside shuffle=True."""
    path = write(
        "import sys\n" + DDP_HEADER.replace("from torch.utils.data import DataLoader", "from torch.utils.data import DataLoader, TensorDataset")
        + "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        + "model = DDP(torch.nn.Linear(8, 1))\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "train_set = TensorDataset(torch.randn(16, 8))\n"
        + "train_kwargs = {'batch_size': 4}\n"
        + "if len(sys.argv) > 1:\n"
        + "    accel_kwargs = {'num_workers': 0, 'shuffle': True}\n"
        + "    train_kwargs.update(accel_kwargs)\n"
        + "train_loader = DataLoader(train_set, **train_kwargs)\n"
        + "for epoch in range(2):\n"
        + "    for (x,) in train_loader:\n"
        + "        loss = model(x).mean()\n"
        + "        optimizer.zero_grad()\n"
        + "        loss.backward()\n"
        + "        optimizer.step()\n"
        + "print('ok', len(train_loader))\n"
    )
    fixed = _fixed_twice(path, "TC503")
    assert 'sampler=DistributedSampler(train_set, shuffle=train_kwargs.get("shuffle", False))' in fixed
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for argv in ([], ["--shuffle"]):
        proc = run_training([sys.executable, str(path), *argv], tmp_path, env)
        assert proc.returncode == 0 and "ok 4" in proc.stdout, proc.stderr[-2000:]


def test_tc503_loader_built_before_the_process_group_is_declined(write):
    path = write(
        DDP_HEADER
        + "def main():\n"
        + "    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)\n"
        + "    dist.init_process_group('nccl')\n"
        + "    model = DDP(torch.nn.Linear(8, 1).cuda())\n"
        + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "    for x, y in train_loader:\n"
        + "        model(x.cuda()).mean().backward()\n"
        + "        optimizer.step()\n"
    )
    _declined(path, "TC503", "before init_process_group")


def test_tc503_a_name_clash_is_declined(write):
    path = write(
        DDP_HEADER + MODEL + "DistributedSampler = None\n"
        + "train_loader = DataLoader(train_set, batch_size=8, shuffle=True)\n" + LOOP
    )
    _declined(path, "TC503", "bound to something else")


def test_tc503_leaves_eval_loaders_and_batch_samplers_alone(write):
    path = write(
        DDP_HEADER + MODEL
        + "train_loader = DataLoader(train_set, batch_sampler=GroupedBatchSampler(train_set, 8))\n"
        + "val_loader = DataLoader(val_set, batch_size=8, shuffle=False)\n" + LOOP
    )
    result = fix_file(path, _settings("TC503"))
    assert not result.changed and not result.remaining


# -- TC504 ----------------------------------------------------------------------------------------------

SAMPLER = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler
sampler = DistributedSampler(train_set)
loader = DataLoader(train_set, batch_size=32, sampler=sampler)
"""

STEPS = """\
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
"""


def test_tc504_unnamed_epoch_counter_is_declined(write):
    path = write(SAMPLER + "for _ in range(10):\n" + STEPS)
    _declined(path, "TC504", "no counter")


def test_tc504_while_loop_without_a_counter_is_declined(write):
    path = write(SAMPLER + "while not done():\n" + STEPS)
    _declined(path, "TC504", "`while` loop without an epoch counter")


def test_tc504_while_loop_uses_its_counter(write):
    path = write(SAMPLER + "epoch = 0\nwhile epoch < max_epochs:\n" + STEPS + "    epoch += 1\n")
    fixed = _fixed_twice(path, "TC504")
    assert "while epoch < max_epochs:\n    sampler.set_epoch(epoch)\n    for x in loader:\n" in fixed


def test_tc504_sampler_created_inside_the_epoch_loop_is_declined(write):
    path = write(
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "for epoch in range(10):\n"
        "    sampler = DistributedSampler(train_set)\n"
        "    loader = DataLoader(train_set, batch_size=32, sampler=sampler)\n" + STEPS
    )
    _declined(path, "TC504", "created inside the epoch loop")


def test_tc504_reaches_the_loader_through_a_parameter(write):
    path = write(
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "def fit(model, optimizer, data, epochs):\n"
        "    for epoch in range(epochs):\n"
        "        for x in data:\n"
        "            optimizer.zero_grad()\n"
        "            model(x).sum().backward()\n"
        "            optimizer.step()\n"
        "def main():\n"
        "    train_loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n"
        "    fit(model, optimizer, train_loader, epochs=3)\n"
    )
    fixed = _fixed_twice(path, "TC504")
    assert "    for epoch in range(epochs):\n        data.sampler.set_epoch(epoch)\n" in fixed


def test_tc504_loader_that_is_not_always_a_dataloader_is_tested_first(write):
    path = write(
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "if args.synthetic:\n"
        "    loader = SyntheticBatches(100)\n"
        "else:\n"
        "    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n"
        "for epoch in range(3):\n" + STEPS
    )
    fixed = _fixed_twice(path, "TC504")
    assert "for epoch in range(3):\n    if isinstance(loader, DataLoader):\n        loader.sampler.set_epoch(epoch)\n" in fixed


def test_tc504_another_dataloader_without_the_sampler_is_declined(write):
    path = write(
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "if args.distributed:\n"
        "    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n"
        "else:\n"
        "    loader = DataLoader(ds, batch_size=8, shuffle=True)\n"
        "for epoch in range(3):\n" + STEPS
    )
    _declined(path, "TC504", "a DataLoader without a DistributedSampler")


def test_tc504_a_comment_stays_with_its_statement(write):
    path = write(SAMPLER + "for epoch in range(3):\n    # train\n" + STEPS)
    fixed = _fixed_twice(path, "TC504")
    assert "for epoch in range(3):\n    sampler.set_epoch(epoch)\n    # train\n    for x in loader:\n" in fixed


# -- TC507 ----------------------------------------------------------------------------------------------

ACCUM_HEADER = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(Net().cuda(), device_ids=[0])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def test_tc507_negates_a_plain_flag_and_reuses_nullcontext(write):
    path = write(
        "from contextlib import nullcontext as nc\n" + ACCUM_HEADER
        + "for i, (x, y) in enumerate(loader):\n"
        + "    step_now = (i + 1) % accum == 0\n"
        + "    criterion(model(x), y).backward()\n"
        + "    if step_now:\n"
        + "        optimizer.step()\n"
        + "        optimizer.zero_grad()\n"
    )
    fixed = _fixed_twice(path, "TC507")
    assert "    with (model.no_sync() if not step_now else nc()):\n        criterion(model(x), y).backward()\n" in fixed
    assert "import contextlib" not in fixed


def test_tc507_forward_outside_the_block_is_declined(write):
    path = write(
        ACCUM_HEADER
        + "for i, (out, y) in enumerate(zip(outputs, targets)):\n"
        + "    loss = criterion(out, y) / accum\n"
        + "    loss.backward()\n"
        + "    if (i + 1) % accum == 0:\n"
        + "        optimizer.step()\n"
    )
    _declined(path, "TC507", "the forward is not in the backward's block")


def test_tc507_conditional_wrap_is_declined(write):
    path = write(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = Net().cuda()\n"
        "if args.distributed:\n"
        "    model = DDP(model)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    criterion(model(x), y).backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
    )
    _declined(path, "TC507", "only on some paths")


def test_tc507_forward_through_another_name_is_declined(write):
    path = write(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = Net().cuda()\n"
        "ddp_model = DDP(model)\n"
        "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    criterion(model(x), y).backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
    )
    _declined(path, "TC507", "not bound to DistributedDataParallel")


def test_tc507_condition_that_changes_after_the_forward_is_declined(write):
    path = write(
        ACCUM_HEADER
        + "step = 0\n"
        + "for x, y in loader:\n"
        + "    criterion(model(x), y).backward()\n"
        + "    step += 1\n"
        + "    if step % accum == 0:\n"
        + "        optimizer.step()\n"
    )
    _declined(path, "TC507", "`step` changes between the forward and the optimizer step")


def test_tc507_condition_with_a_call_is_declined(write):
    path = write(
        ACCUM_HEADER
        + "for i, (x, y) in enumerate(loader):\n"
        + "    criterion(model(x), y).backward()\n"
        + "    if schedule.should_step(i) and (i + 1) % accum == 0:\n"
        + "        optimizer.step()\n"
    )
    _declined(path, "TC507", "calls `schedule.should_step()`")


def test_tc507_micro_steps_over_chunks_are_declined(write):
    path = write(
        ACCUM_HEADER
        + "for x, y in loader:\n"
        + "    for xc, yc in zip(x.chunk(4), y.chunk(4)):\n"
        + "        criterion(model(xc), yc).backward()\n"
        + "    optimizer.step()\n"
    )
    _declined(path, "TC507", "no counter tells the last micro-step")


# -- TC305 ----------------------------------------------------------------------------------------------

TRAIN = """\
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    loss = model(x.cuda()).mean()
    loss.backward()
    optimizer.step()
"""


def test_tc305_needs_the_compile_option(write):
    path = write("import torch\nmodel = Net().cuda()\n" + TRAIN)
    assert not fix_file(path, Settings(select=("TC305",))).changed
    fixed = _fixed_twice(path, "TC305")
    assert "model = Net().cuda()\nif torch.cuda.is_available():\n    model.compile()\noptimizer" in fixed


def test_tc305_compiles_inside_the_scripts_own_cuda_branch(write):
    path = write(
        "import torch\nimport torchvision\n"
        "model = torchvision.models.resnet18()\n"
        "if args.cuda:\n    model = model.cuda()\n"
        "criterion = torch.nn.CrossEntropyLoss()\n" + TRAIN
    )
    fixed = _fixed_twice(path, "TC305")
    assert "if args.cuda:\n    model = model.cuda()\n    model.compile()\ncriterion" in fixed


def test_tc305_spells_the_files_torch_alias(write):
    path = write("import torch as T\nmodel = Net().cuda()\n" + TRAIN.replace("torch.", "T."))
    assert "if T.cuda.is_available():\n    model.compile()\n" in _fixed_twice(path, "TC305")


@pytest.mark.parametrize(
    "construction, reason",
    [
        ("models = [Net().cuda() for _ in range(3)]\nmodel = models[0]\n", "comprehension"),
        ("model = torch.nn.Sequential(torch.nn.Linear(8, 8)).cuda()\n", "`torch.nn.Sequential`, whose forward is torch's own"),
        (
            "class Stack(torch.nn.Sequential):\n    pass\nmodel = Stack(torch.nn.Linear(8, 8)).cuda()\n",
            "`torch.nn.Sequential`, whose forward is torch's own",
        ),
    ],
)
def test_tc305_declines(write, construction, reason):
    path = write("import torch\n" + construction + TRAIN)
    _declined(path, "TC305", reason)


def test_tc305_a_subclass_with_its_own_forward_is_compiled(write):
    path = write(
        "import torch\nclass Stack(torch.nn.Sequential):\n    def forward(self, x):\n        return super().forward(x)\n"
        "model = Stack(torch.nn.Linear(8, 8)).cuda()\n" + TRAIN
    )
    assert "if torch.cuda.is_available():\n    model.compile()\n" in _fixed_twice(path, "TC305")


def test_tc305_model_built_in_a_loop_is_declined(write):
    path = write(
        "import torch\nfor seed in range(3):\n    model = Net().cuda()\n"
        + "".join("    " + line + "\n" for line in TRAIN.splitlines())
    )
    _declined(path, "TC305", "built in a loop")


def test_tc305_model_received_as_a_parameter_only_is_declined(write):
    path = write("import torch\ndef train(model, loader):\n" + "".join("    " + l + "\n" for l in TRAIN.splitlines()))
    _declined(path, "TC305", "could not find where the trained model `model` is built")


# -- composition with the DDP conversion ------------------------------------------------------------------

SINGLE_GPU = '''\
"""A single-GPU script with epochs and gradient accumulation."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y) / args.accum
            loss.backward()
            if (i + 1) % args.accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save(model.state_dict(), "checkpoint.pt")


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_ddp_and_compile_conversions_compose_and_the_result_runs(tmp_path):
    """``fix --ddp --compile``: the conversion, then the sampler, set_epoch and no_sync rounds, and the
    in-place compile before the wrap; the result runs on this CPU machine as a group of one."""
    path = tmp_path / "train.py"
    path.write_text(SINGLE_GPU, encoding="utf-8")
    settings = Settings(select=("TC5", "TC305"), structural_fixes=("ddp", "compile"))
    result = fix_file(path, settings)
    assert not result.remaining, [(f.rule, f.message) for f in result.remaining]
    assert {"TC305", "TC503", "TC504", "TC507"} <= set(result.applied)
    fixed = result.fixed
    compile_at = fixed.index("model.compile()")
    assert compile_at < fixed.index("DistributedDataParallel(model")
    assert "sampler=DistributedSampler(train_set, shuffle=True)" in fixed
    assert "train_loader.sampler.set_epoch(epoch)" in fixed
    assert "with (model.no_sync() if (i + 1) % args.accum != 0 else contextlib.nullcontext()):" in fixed
    path.write_text(fixed, encoding="utf-8")
    assert not fix_file(path, settings).changed
    proc = run_training([sys.executable, str(path)], tmp_path, {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 1 loss" in proc.stdout
    import torch

    assert set(torch.load(tmp_path / "checkpoint.pt")) == {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}


@pytest.mark.parametrize(
    "construction, compiled",
    [
        # DataParallel's replicas would copy a compiled call bound to the original module: compile only
        # where one GPU is visible (DataParallel then calls the module itself).
        ("model = torch.nn.DataParallel(Net()).cuda()\n",
         "if torch.cuda.is_available() and torch.cuda.device_count() == 1:\n    model.module.compile()\n"),
        ("model = Net().cuda()\nmodel = torch.nn.DataParallel(model)\n",
         "if torch.cuda.is_available() and torch.cuda.device_count() == 1:\n    model.compile()\nmodel = torch.nn.DataParallel(model)"),
    ],
)
def test_tc305_compiles_the_module_inside_dataparallel_on_one_gpu_only(write, construction, compiled):
    path = write("import torch\n" + construction + TRAIN)
    assert compiled in _fixed_twice(path, "TC305")
