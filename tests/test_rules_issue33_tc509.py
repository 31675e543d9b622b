"""Issue 33: TC509 batchnorm-small-per-gpu-batch.

SyncBatchNorm with a large per-GPU batch, plain BatchNorm with a small one, in DDP scripts whose
per-GPU batch size can be read from the text; and the near misses that must stay silent (no DDP,
no BatchNorm, unknown batch sizes, frozen BN, SyncBN behind a flag, a framework's loop)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from expectations import expected_findings
from helpers import scan_code, scan_paths
from tcaudit.findings import Severity

RULE = "TC509"

HEAD = """
import argparse
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""

OWN_BN = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3, padding=1)
        self.bn = nn.BatchNorm2d(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).mean((2, 3)))
"""

LOOP = """
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in train_loader:
    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def script(body: str, classes: str = "", loop: str = LOOP) -> str:
    return HEAD + textwrap.dedent(classes) + textwrap.dedent(body) + loop


def _hits(tmp_path, code):
    return [f for f in scan_code(tmp_path, code, select=(RULE,)).findings if f.rule == RULE]


def resnet(batch: str, setup: str = "", arch: str = "torchvision.models.resnet50()") -> str:
    return script(
        f"{setup}\n"
        'dist.init_process_group("nccl")\n'
        f"model = DDP({arch}.cuda())\n"
        f"train_loader = DataLoader(train_set, batch_size={batch}, sampler=DistributedSampler(train_set))\n"
    )


# -- small per-GPU batch, plain BatchNorm -------------------------------------------------------------------


@pytest.mark.parametrize("batch, shown", [("4", "4"), ("15", "15"), ("1", "1"), ("BATCH", "8")])
def test_plain_bn_with_a_small_literal_batch(tmp_path, batch, shown):
    code = resnet(batch, setup="BATCH = 8")
    [hit] = _hits(tmp_path, code)
    assert hit.severity is Severity.INFO and hit.fix is None
    assert hit.message == f"BatchNorm under DDP normalises over {shown} samples per GPU, without SyncBatchNorm"
    assert "convert_sync_batchnorm" in hit.explanation and len(hit.message) <= 120
    assert hit.source_line.strip() == "model = DDP(torchvision.models.resnet50().cuda())"


@pytest.mark.parametrize("batch", ["16", "32", "256"])
def test_plain_bn_with_16_or_more_per_gpu_is_silent(tmp_path, batch):
    assert _hits(tmp_path, resnet(batch)) == []


def test_own_bn_class_and_its_users(tmp_path):
    classes = OWN_BN + """
class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Net()

    def forward(self, x):
        return self.body(x)
"""
    for model in ("Net()", "Wrapper()", "nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())"):
        code = script(f"""
dist.init_process_group("nccl")
model = DDP({model}.cuda())
train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
""", classes)
        assert len(_hits(tmp_path, code)) == 1, model


def test_norm_layer_default_in_a_resnet_copy_counts(tmp_path):
    classes = """
class Block(nn.Module):
    def __init__(self, c, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = norm_layer(c)

    def forward(self, x):
        return self.norm(self.conv(x))
"""
    code = script("""
dist.init_process_group("nccl")
model = DDP(Block(64).cuda())
train_loader = DataLoader(train_set, batch_size=2, sampler=DistributedSampler(train_set))
""", classes)
    assert len(_hits(tmp_path, code)) == 1


def test_global_batch_divided_by_an_unknown_world_size_is_bounded(tmp_path):
    setup = 'parser = argparse.ArgumentParser()\nparser.add_argument("--batch-size", type=int, default=16)\nargs = parser.parse_args()'
    for divisor in ("dist.get_world_size()", "int(os.environ['WORLD_SIZE'])", "world_size"):
        code = resnet(f"args.batch_size // {divisor}", setup=setup)
        [hit] = _hits(tmp_path, code)
        assert hit.message == ("BatchNorm under DDP normalises over at most 8 samples per GPU on 2+ GPUs, "
                               "without SyncBatchNorm"), divisor
    # 32 // 2 = 16 on two GPUs: not below 16 for certain.
    code = resnet("args.batch_size // dist.get_world_size()", setup=setup.replace("default=16", "default=32"))
    assert _hits(tmp_path, code) == []
    # Divided by something that is not a world size: unknown.
    code = resnet("args.batch_size // args.accum_steps", setup=setup)
    assert _hits(tmp_path, code) == []


def test_a_literal_world_size_gives_the_exact_batch(tmp_path):
    code = resnet("64 // WORLD", setup="WORLD = 8")
    [hit] = _hits(tmp_path, code)
    assert "over 8 samples per GPU," in hit.message


def test_an_update_every_ddp_run_makes_replaces_the_default(tmp_path):
    setup = """parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--distributed", action="store_true")
args = parser.parse_args()
if args.distributed:
    args.batch_size = args.batch_size // dist.get_world_size()"""
    [hit] = _hits(tmp_path, resnet("args.batch_size", setup=setup))
    assert "at most 8 samples per GPU on 2+ GPUs" in hit.message
    # Behind another test (ImageNet's ``if args.gpu is not None:``), the undivided default is possible too.
    assert _hits(tmp_path, resnet("args.batch_size", setup=setup.replace("args.distributed:", "args.gpu is not None:"))) == []


def test_arch_picked_by_name_and_a_helper_that_builds_the_loader(tmp_path):
    code = script("""
parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="resnet18")
args = parser.parse_args()
dist.init_process_group("nccl")


def make_loader(ds, bs):
    return DataLoader(ds, batch_size=bs, sampler=DistributedSampler(ds))


model = DDP(torchvision.models.__dict__[args.arch]().cuda())
train_loader = make_loader(train_set, 8)
""")
    assert len(_hits(tmp_path, code)) == 1
    assert _hits(tmp_path, code.replace('default="resnet18"', 'default="vit_b_16"')) == []
    assert _hits(tmp_path, code.replace("make_loader(train_set, 8)", "make_loader(train_set, args.bs)")) == []


# -- large per-GPU batch, SyncBatchNorm -----------------------------------------------------------------------


def synced(batch: str, guard: str = "", text: str = "") -> str:
    convert = "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)"
    if guard:
        convert = f"if {guard}:\n    {convert}"
    return script(f"""
{text}
dist.init_process_group("nccl")
model = torchvision.models.resnet18().cuda()
{convert}
model = DDP(model)
train_loader = DataLoader(train_set, batch_size={batch}, sampler=DistributedSampler(train_set))
""")


@pytest.mark.parametrize("batch", ["32", "64", "512"])
def test_sync_bn_with_a_large_per_gpu_batch(tmp_path, batch):
    [hit] = _hits(tmp_path, synced(batch))
    assert hit.severity is Severity.INFO and hit.fix is None
    assert hit.message == f"SyncBatchNorm with {batch} samples per GPU all-reduces every BN layer's statistics each forward"
    assert hit.source_line.strip() == "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)"
    assert "not measured" in hit.explanation


@pytest.mark.parametrize("batch", ["31", "8", "256 // dist.get_world_size()"])
def test_sync_bn_below_32_or_unknown_lower_bound_is_silent(tmp_path, batch):
    assert _hits(tmp_path, synced(batch)) == []


def test_sync_bn_under_a_multi_process_test_still_counts(tmp_path):
    text = 'parser = argparse.ArgumentParser()\nparser.add_argument("--distributed", action="store_true")\nargs = parser.parse_args()'
    assert len(_hits(tmp_path, synced("64", guard="args.distributed", text=text))) == 1
    assert len(_hits(tmp_path, synced("64", guard="args.world_size > 1"))) == 1


def test_sync_bn_behind_a_flag_is_the_users_choice(tmp_path):
    text = 'parser = argparse.ArgumentParser()\nparser.add_argument("--sync-bn", action="store_true")\nargs = parser.parse_args()'
    assert _hits(tmp_path, synced("64", guard="args.sync_bn", text=text)) == []
    assert _hits(tmp_path, synced("64", guard="cfg.SYNC_BN")) == []


def test_sync_bn_class_of_the_file(tmp_path):
    classes = """
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = nn.SyncBatchNorm(c)

    def forward(self, x):
        return self.norm(x)
"""
    code = script("""
dist.init_process_group("nccl")
model = DDP(Block(64).cuda())
train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
""", classes)
    [hit] = _hits(tmp_path, code)
    assert hit.source_line.strip() == "model = DDP(Block(64).cuda())"


def test_converting_a_model_without_bn_is_silent(tmp_path):
    code = synced("64").replace("torchvision.models.resnet18()", "torchvision.models.vit_b_16()")
    assert _hits(tmp_path, code) == []


def test_self_supervised_scripts_keep_global_bn(tmp_path):
    for loss in ("simclr_loss", "moco_loss", "info_nce"):
        code = synced("256").replace("nn.functional.cross_entropy(model(x.cuda()), y.cuda())", f"{loss}(model(x.cuda()))")
        assert _hits(tmp_path, code) == [], loss


# -- near misses ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [
    "torchvision.models.convnext_tiny()",
    "torchvision.models.vit_b_16()",
    "torchvision.models.vgg16()",
    "torchvision.models.resnet50(norm_layer=lambda c: nn.GroupNorm(32, c))",
    "torchvision.models.detection.fasterrcnn_resnet50_fpn()",
    "timm.create_model('resnet50_gn')",
])
def test_models_without_plain_bn_are_silent(tmp_path, arch):
    code = resnet("2", arch=arch).replace("import torchvision\n", "import torchvision\nimport timm\n")
    assert _hits(tmp_path, code) == []


def test_timm_resnet_by_name_has_bn(tmp_path):
    code = resnet("2", arch="timm.create_model('resnet50')").replace("import torchvision\n", "import torchvision\nimport timm\n")
    assert len(_hits(tmp_path, code)) == 1


def test_group_norm_class_is_silent(tmp_path):
    classes = OWN_BN.replace("nn.BatchNorm2d(64)", "nn.GroupNorm(32, 64)")
    code = script("""
dist.init_process_group("nccl")
model = DDP(Net().cuda())
train_loader = DataLoader(train_set, batch_size=2, sampler=DistributedSampler(train_set))
""", classes)
    assert _hits(tmp_path, code) == []
    assert len(_hits(tmp_path, code.replace("nn.GroupNorm(32, 64)", "nn.BatchNorm2d(64)"))) == 1


def test_no_ddp_is_silent(tmp_path):
    single = resnet("4").replace("model = DDP(torchvision.models.resnet50().cuda())",
                                 "model = torchvision.models.resnet50().cuda()")
    assert _hits(tmp_path, single) == []
    dp = single.replace("model = torchvision.models.resnet50().cuda()",
                        "model = nn.DataParallel(torchvision.models.resnet50().cuda())")
    assert _hits(tmp_path, dp) == []


def test_eval_only_script_is_silent(tmp_path):
    code = resnet("4").split("optimizer = torch.optim")[0] + textwrap.dedent("""
    model.eval()
    with torch.no_grad():
        for x, y in train_loader:
            print(model(x.cuda()).argmax(1))
    """)
    assert _hits(tmp_path, code) == []


def test_model_kept_in_eval_mode_is_silent(tmp_path):
    code = resnet("4").replace("optimizer = torch.optim", "model.eval()\noptimizer = torch.optim")
    assert _hits(tmp_path, code) == []


def test_frozen_bn_is_silent(tmp_path):
    freeze = """
def freeze_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
"""
    code = resnet("2", setup=freeze)
    assert _hits(tmp_path, code) == []
    assert len(_hits(tmp_path, code.replace("m.eval()", "m.reset_parameters()"))) == 1
    frozen = resnet("2", arch="torchvision.models.resnet50(norm_layer=torchvision.ops.FrozenBatchNorm2d)")
    assert _hits(tmp_path, frozen) == []


@pytest.mark.parametrize("batch", [
    'cfg["batch_size"]',
    "args.batch_size",  # no add_argument for it
    "None",
    "get_batch_size()",
])
def test_unknown_batch_sizes_are_silent(tmp_path, batch):
    assert _hits(tmp_path, resnet(batch)) == []


def test_argparse_without_a_literal_default_is_silent(tmp_path):
    setup = 'parser = argparse.ArgumentParser()\nparser.add_argument("--batch-size", type=int, default=BS)\nargs = parser.parse_args()'
    assert _hits(tmp_path, resnet("args.batch_size", setup=setup)) == []
    [hit] = _hits(tmp_path, resnet("args.batch_size", setup=setup.replace("default=BS", "default=4")))
    assert "over 4 samples" in hit.message


def test_loader_with_a_batch_sampler_is_unknown(tmp_path):
    code = resnet("4").replace("batch_size=4, sampler=DistributedSampler(train_set)", "batch_sampler=GroupedBatchSampler(s, 2)")
    assert _hits(tmp_path, code) == []


def test_every_training_loader_must_be_known(tmp_path):
    code = resnet("4") + "extra_loader = DataLoader(more, batch_size=cfg.bs)\nfor x, y in extra_loader:\n    model(x).sum().backward()\n"
    assert _hits(tmp_path, code) == []


def test_an_eval_loader_does_not_count(tmp_path):
    code = resnet("64").replace("for x, y in train_loader:", "val_loader = DataLoader(val_set, batch_size=2)\nfor x, y in train_loader:")
    assert _hits(tmp_path, code) == []


def test_ddp_wrapping_another_model_is_silent(tmp_path):
    code = script("""
dist.init_process_group("nccl")
teacher = torchvision.models.resnet50().cuda().eval()
model = DDP(nn.TransformerEncoderLayer(256, 8).cuda())
train_loader = DataLoader(train_set, batch_size=4, sampler=DistributedSampler(train_set))
""")
    assert _hits(tmp_path, code) == []


def test_sync_bn_in_the_file_silences_the_small_batch_side(tmp_path):
    text = 'parser = argparse.ArgumentParser()\nparser.add_argument("--sync-bn", action="store_true")\nargs = parser.parse_args()'
    assert _hits(tmp_path, synced("4", guard="args.sync_bn", text=text)) == []


def test_frameworks_and_test_code_are_silent(tmp_path):
    lightning = "import lightning\n" + resnet("4")
    assert _hits(tmp_path, lightning) == []
    body = resnet("4")[len(HEAD):]
    in_a_test = HEAD + "\n\ndef test_ddp_bn():\n" + textwrap.indent(body, "    ")
    compile(in_a_test, "t.py", "exec")
    assert _hits(tmp_path, in_a_test) == []
    assert len(_hits(tmp_path, in_a_test.replace("def test_ddp_bn", "def main"))) == 1


def test_bad_examples_compile():
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parent.parent / "rules" / "TC509.toml").read_text(encoding="utf-8"))
    for example in data["bad"] + data["good"]:
        compile(example["code"], "example.py", "exec")


def test_sync_bn_behind_distributed_and_a_flag_is_the_users_choice(tmp_path):
    # torchvision's references: ``if args.distributed and args.sync_bn:``.
    text = ('parser = argparse.ArgumentParser()\nparser.add_argument("--distributed", action="store_true")\n'
            'parser.add_argument("--sync-bn", action="store_true")\nargs = parser.parse_args()')
    assert _hits(tmp_path, synced("64", guard="args.distributed and args.sync_bn", text=text)) == []
    assert len(_hits(tmp_path, synced("64", guard="args.distributed or args.sync_bn", text=text))) == 1


def test_sync_bn_in_prose_does_not_count_but_an_option_does(tmp_path):
    code = '"""Small crops per GPU, no SyncBatchNorm. Without SyncBatchNorm."""\n' + resnet("4")
    assert len(_hits(tmp_path, code)) == 1
    option = resnet("4", setup='parser = argparse.ArgumentParser()\nparser.add_argument("--sync-bn", action="store_true")')
    assert _hits(tmp_path, option) == []
    apex = resnet("4", setup="from apex.parallel import convert_syncbn_model")
    assert _hits(tmp_path, apex) == []


# -- whole scripts -------------------------------------------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


@pytest.mark.parametrize("name", ["tc509_ddp_segmentation_small_batch.py", "tc509_syncbn_large_batch.py"])
def test_fixture_scripts(name):
    path = SCRIPTS / name
    compile(path.read_text(encoding="utf-8"), str(path), "exec")
    result = scan_paths([str(path)], select=(RULE,))
    assert {(f.rule, f.location.line) for f in result.findings} == expected_findings(path, (RULE,))
