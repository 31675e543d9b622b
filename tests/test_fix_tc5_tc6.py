"""TC502, TC506 and TC602 fixes: what they rewrite beyond the fixture pairs, and where they decline
(the file is then left byte-for-byte unchanged and, where a finding remains, the reason is given)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file


def _fix(path: Path, rule: str):
    return fix_file(path, Settings(select=(rule,)))


def _unchanged(path: Path, rule: str, reason: str | None = None):
    before = path.read_bytes()
    result = _fix(path, rule)
    assert result.error is None
    assert not result.changed, result.diff()
    assert result.source.encode(result.fixed) == before
    if reason is not None:
        reasons = [r for f, r in result.declined if f.rule == rule]
        assert reasons and any(reason in r for r in reasons), result.declined
    return result


def _fixed_twice(path: Path, rule: str) -> str:
    """The fixed text, checked to be a fixed point."""
    result = _fix(path, rule)
    assert result.changed and result.applied == [rule], (result.declined, result.remaining)
    path.write_text(result.fixed, encoding="utf-8")
    assert not _fix(path, rule).changed
    return result.fixed


# -- TC502 ------------------------------------------------------------------------------------------

DDP_HEADER = """\
import torch
import torch.distributed as dist
import torch.nn as nn
"""

TRAIN_LOOP = """
for x in loader:
    loss = model(x.cuda()).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_tc502_dataparallel_aliased_as_ddp_is_left_alone(write):
    path = write(
        "import torch\n"
        "from torch.nn import DataParallel as DDP\n"
        "model = DDP(torch.nn.Linear(4, 4).cuda())\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + TRAIN_LOOP
    )
    result = _unchanged(path, "TC502")
    assert not [f for f in result.remaining if f.rule == "TC502"]


def test_tc502_dataparallel_through_a_plain_alias_is_left_alone(write):
    path = write(
        "import torch.nn as nn\n"
        "DistributedDataParallel = nn.DataParallel\n"
        "model = DistributedDataParallel(nn.Linear(4, 4).cuda())\n" + TRAIN_LOOP
    )
    _unchanged(path, "TC502")


def test_tc502_explicit_false_is_respected(write):
    path = write(
        DDP_HEADER
        + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        + "model = DDP(nn.Linear(4, 4).cuda(), device_ids=[0], gradient_as_bucket_view=False)\n"
        + TRAIN_LOOP
    )
    _unchanged(path, "TC502")


def test_tc502_keyword_in_a_visible_kwargs_dict_is_respected(write):
    path = write(
        DDP_HEADER
        + "ddp_args = {'gradient_as_bucket_view': False, 'find_unused_parameters': True}\n"
        + "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4).cuda(), **ddp_args)\n"
        + TRAIN_LOOP
    )
    _unchanged(path, "TC502")


def test_tc502_unknown_kwargs_are_left_alone(write):
    path = write(
        DDP_HEADER
        + "def wrap(model, **kwargs):\n"
        + "    return nn.parallel.DistributedDataParallel(model, **kwargs)\n"
        + "model = wrap(nn.Linear(4, 4).cuda())\n"
        + TRAIN_LOOP
    )
    _unchanged(path, "TC502")


def test_tc502_grad_surgery_is_declined_with_the_rules_reason(write):
    path = write(
        DDP_HEADER
        + "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4).cuda())\n"
        + TRAIN_LOOP
        + "    for p in model.parameters():\n"
        + "        p.grad = p.grad / 2\n"
    )
    _unchanged(path, "TC502", reason="bucket views do not allow")


def test_tc502_star_args_are_declined(write):
    path = write(
        DDP_HEADER
        + "ddp_args = (0,)\n"
        + "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4).cuda(), *ddp_args)\n"
        + TRAIN_LOOP
    )
    _unchanged(path, "TC502", reason="*args")


def test_tc502_adds_the_keyword_to_every_ddp_call_and_keeps_layout(write):
    path = write(
        DDP_HEADER
        + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        + "model = DDP(nn.Linear(4, 4).cuda())\n"
        + "aux = DDP(nn.Linear(4, 4).cuda(), device_ids=[0],)  # trailing comma\n"
        + "other = nn.DataParallel(nn.Linear(4, 4).cuda())\n"
        + TRAIN_LOOP
    )
    fixed = _fixed_twice(path, "TC502")
    assert "model = DDP(nn.Linear(4, 4).cuda(), gradient_as_bucket_view=True)\n" in fixed
    assert "aux = DDP(nn.Linear(4, 4).cuda(), device_ids=[0], gradient_as_bucket_view=True,)  # trailing comma\n" in fixed
    assert "other = nn.DataParallel(nn.Linear(4, 4).cuda())\n" in fixed


# -- TC506 ------------------------------------------------------------------------------------------

GLOO_SCRIPT = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

{setup}
dist.init_process_group({backend}, rank=0, world_size=1)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = DDP(nn.Linear(4, 4).to(device), gradient_as_bucket_view=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    loss = model(x.to(device)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{after}
"""


def _gloo(write, backend: str = '"gloo"', setup: str = "", after: str = "") -> Path:
    return write(GLOO_SCRIPT.format(backend=backend, setup=setup, after=after))


def test_tc506_keeps_single_quotes(write):
    path = _gloo(write, backend="backend='gloo'")
    fixed = _fixed_twice(path, "TC506")
    assert "dist.init_process_group(backend='nccl' if torch.cuda.is_available() else 'gloo', rank=0" in fixed


def test_tc506_uses_the_files_torch_alias(write):
    path = write(
        GLOO_SCRIPT.format(backend='"gloo"', setup="", after="").replace("import torch\n", "import torch as T\n", 1)
        .replace("torch.", "T.").replace("import T.", "import torch.").replace("from T.", "from torch.")
    )
    fixed = _fixed_twice(path, "TC506")
    assert 'dist.init_process_group("nccl" if T.cuda.is_available() else "gloo", rank=0' in fixed
    assert "\nimport torch\n" not in fixed


def test_tc506_conditional_backend_is_left_alone(write):
    _unchanged(_gloo(write, backend='"nccl" if torch.cuda.is_available() else "gloo"'), "TC506")


def test_tc506_cpu_only_script_is_left_alone(write):
    path = write(
        "import torch\nimport torch.distributed as dist\n"
        'dist.init_process_group("gloo", rank=0, world_size=1)\n'
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))\n"
    )
    _unchanged(path, "TC506")


def test_tc506_device_switch_is_declined(write):
    setup = (
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--no-cuda', action='store_true')\n"
        "args = parser.parse_args()\n"
    )
    path = _gloo(write, setup=setup)
    _unchanged(path, "TC506", reason="chosen by a switch")


def test_tc506_host_tensor_in_a_collective_is_declined(write):
    after = "total = torch.tensor([loss.item()])\ndist.all_reduce(total)\n"
    _unchanged(_gloo(write, after=after), "TC506", reason="tensor on the host")


def test_tc506_cpu_copy_in_a_collective_is_declined(write):
    after = "dist.all_reduce(loss.detach().cpu())\n"
    _unchanged(_gloo(write, after=after), "TC506", reason="tensor on the host")


def test_tc506_device_tensor_in_a_collective_is_fixed(write):
    after = "total = torch.zeros(1).to(device)\ndist.all_reduce(total)\ndist.all_reduce(torch.ones(1, device=device))\n"
    fixed = _fixed_twice(_gloo(write, after=after), "TC506")
    assert 'dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0' in fixed


# -- TC602 ------------------------------------------------------------------------------------------

ZERO_GRAD_SCRIPT = """\
import torch

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{extra}
for x in loader:
    optimizer.zero_grad({args})
    loss = model(x).mean()
    loss.backward()
{after}    optimizer.step()
"""


def _zero_grad(write, args: str, extra: str = "", after: str = "") -> Path:
    return write(ZERO_GRAD_SCRIPT.format(args=args, extra=extra, after=after))


def test_tc602_drops_the_argument(write):
    fixed = _fixed_twice(_zero_grad(write, "set_to_none = False"), "TC602")
    assert "    optimizer.zero_grad()\n" in fixed


def test_tc602_in_place_grad_use_is_declined(write):
    after = "    for p in model.parameters():\n        p.grad.data.mul_(0.5)\n"
    _unchanged(_zero_grad(write, "set_to_none=False", after=after), "TC602", reason="uses .grad in place")


def test_tc602_true_and_default_are_left_alone(write):
    _unchanged(_zero_grad(write, "set_to_none=True"), "TC602")
    _unchanged(_zero_grad(write, ""), "TC602")


def test_tc602_own_zero_grad_gets_an_explicit_true(write):
    extra = (
        "\nclass Wrapper:\n"
        "    def __init__(self, opt):\n"
        "        self.opt = opt\n\n"
        "    def zero_grad(self, set_to_none=False):\n"
        "        self.opt.zero_grad(set_to_none=set_to_none)\n\n"
        "optimizer = Wrapper(optimizer)\n"
    )
    fixed = _fixed_twice(_zero_grad(write, "set_to_none=False", extra=extra), "TC602")
    assert "    optimizer.zero_grad(set_to_none=True)\n" in fixed
    assert "    def zero_grad(self, set_to_none=False):\n" in fixed


def test_tc602_eval_path_is_left_alone(write):
    path = write(
        "import torch\n\n"
        "@torch.no_grad()\n"
        "def evaluate(model, loader):\n"
        "    model.zero_grad(set_to_none=False)\n"
        "    return sum(model(x).sum() for x in loader)\n"
    )
    _unchanged(path, "TC602")


# -- through the CLI -------------------------------------------------------------------------------


def test_cli_fix_on_aliased_dataparallel_changes_nothing(write):
    path = write(
        "import torch\n"
        "from torch.nn import DataParallel as DDP\n"
        "model = DDP(torch.nn.Linear(4, 4).cuda())\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + TRAIN_LOOP
    )
    before = path.read_bytes()
    code, out, err = run_cli("fix", str(path), "--select", "TC502", "--apply")
    assert code == 0, err
    assert path.read_bytes() == before
