"""Issue 33: TC318 compile-partial-batch.

A compiled model (or step function) trained on a DataLoader whose last batch is smaller: positive
cases for each way of compiling, near misses, the exact fixed text, the declined fixes with their
reasons, the finding that speaks for ``fix --compile`` (TC305), and a CPU run that counts the graphs
Dynamo compiles with and without the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.fix.engine import fix_file

HEAD = "import torch\nfrom torch.utils.data import DataLoader\n"
LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = model(x.cuda()).sum()
        loss.backward()
        opt.step()
"""
LOADER = "loader = DataLoader(train_set, batch_size=64, shuffle=True)\n"


def _hits(tmp_path, code, rule="TC318", **settings):
    return [f for f in scan_code(tmp_path, code, select=(rule,), **settings).findings if f.rule == rule]


def _fixed(tmp_path, code, select=("TC318",), **settings) -> str:
    path = tmp_path / "fixme.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    result = fix_file(path, Settings(select=select, **settings))
    assert result.error is None
    compile(result.fixed, str(path), "exec")
    return result.fixed


# -- reported --------------------------------------------------------------------------------------------


STEP_FN = """
def step(model, x):
    loss = model(x).sum()
    loss.backward()
    opt.step()
"""
STEP_LOOP = """
for epoch in range(3):
    for x, y in loader:
        {call}(model, x.cuda())
"""


@pytest.mark.parametrize("code", [
    HEAD + "model = torch.compile(Net().cuda())\n" + LOADER + LOOP,
    HEAD + "model = Net().cuda()\ncompiled = torch.compile(model, mode='max-autotune')\n" + LOADER
    + LOOP.replace("model(x", "compiled(x"),
    HEAD + "model = Net().cuda()\nmodel.compile()\n" + LOADER + LOOP,
    HEAD + "model = Net().cuda()\nif args.compile:\n    model = torch.compile(model)\n" + LOADER + LOOP,
    HEAD + "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(Net().cuda())\n"
    "model.module.compile()\n" + LOADER + LOOP,
    HEAD + "@torch.compile\n" + STEP_FN.lstrip("\n") + LOADER + STEP_LOOP.format(call="step"),
    HEAD + "@torch.compile(mode='reduce-overhead')\n" + STEP_FN.lstrip("\n") + LOADER + STEP_LOOP.format(call="step"),
    HEAD + STEP_FN + "cstep = torch.compile(step)\n" + LOADER + STEP_LOOP.format(call="cstep"),
    # iter/next instead of a for loop over the loader
    HEAD + "model = torch.compile(Net().cuda())\n" + LOADER + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "it = iter(loader)\nfor i in range(1000):\n    x, y = next(it)\n    loss = model(x.cuda()).sum()\n"
    "    loss.backward()\n    opt.step()\n",
    # a literal length the batch size does not divide
    HEAD + "model = torch.compile(Net().cuda())\nloader = DataLoader(range(1000), batch_size=64, shuffle=True)\n" + LOOP,
])
def test_reports_the_training_loader_of_a_compiled_training(tmp_path, code):
    [hit] = _hits(tmp_path, code)
    assert hit.severity is Severity.WARNING
    assert hit.message == "the smaller last batch of an epoch recompiles the compiled model: pass `drop_last=True`"
    assert hit.fix.fix_class is FixClass.NUMERICS and hit.fix.available
    assert len(hit.message) <= 120 and "recompiles" in hit.explanation
    assert "(H200, torch 2.11: the step with a new batch size took 8.32 s against a steady 3.08 ms)" in hit.explanation


def test_drop_last_false_is_reported_and_replaced(tmp_path):
    code = HEAD + "model = torch.compile(Net().cuda())\n" \
        "loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=False)\n" + LOOP
    [hit] = _hits(tmp_path, code)
    assert hit.message.startswith("with `drop_last=False` the smaller last batch")
    assert "loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=True)\n" in _fixed(tmp_path, code)


def test_positional_drop_last_false_is_replaced_in_place(tmp_path):
    code = HEAD + "model = torch.compile(Net().cuda())\n" \
        "loader = DataLoader(ds, 64, True, None, None, 4, None, True, False)\n" + LOOP
    [hit] = _hits(tmp_path, code)
    assert "loader = DataLoader(ds, 64, True, None, None, 4, None, True, True)\n" in _fixed(tmp_path, code)


def test_fix_keeps_a_call_with_one_argument_per_line(tmp_path):
    code = HEAD + "model = torch.compile(Net().cuda())\nloader = DataLoader(\n    train_set,\n    batch_size=64,\n" \
        "    shuffle=True,\n)\n" + LOOP
    fixed = _fixed(tmp_path, code)
    assert "loader = DataLoader(\n    train_set,\n    batch_size=64,\n    shuffle=True,\n    drop_last=True,\n)\n" in fixed
    path = tmp_path / "again.py"
    path.write_text(fixed, encoding="utf-8")
    assert not fix_file(path, Settings(select=("TC318",))).changed


def test_shuffle_when_no_sampler_and_shuffling_samplers_are_fixed(tmp_path):
    for sampler in ("torch.utils.data.RandomSampler(ds)", "torch.utils.data.WeightedRandomSampler(w, len(w))",
                    "torch.utils.data.distributed.DistributedSampler(ds, shuffle=True)"):
        code = HEAD + f"model = torch.compile(Net().cuda())\nloader = DataLoader(ds, batch_size=64, sampler={sampler})\n" + LOOP
        [hit] = _hits(tmp_path, code)
        assert hit.fix.available, sampler


# -- not reported ----------------------------------------------------------------------------------------


COMPILED = HEAD + "model = torch.compile(Net().cuda())\n"


@pytest.mark.parametrize("code", [
    COMPILED + "loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=args.drop_last)\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, batch_sampler=BucketSampler(ds, 64))\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, batch_size=None)\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, shuffle=True)\n" + LOOP,  # batch_size=1 by default
    COMPILED + "loader = DataLoader(ds, batch_size=1, shuffle=True)\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, batch_size=32, shuffle=True, collate_fn=pad_batch)\n" + LOOP,
    COMPILED + "loader = DataLoader(ds, **loader_kwargs())\n" + LOOP,  # keywords that cannot be seen
    COMPILED + "loader = DataLoader(range(1000), batch_size=100, shuffle=True)\n" + LOOP,
    COMPILED + "loader = DataLoader(range(10), batch_size=64, shuffle=True)\n" + LOOP,  # one batch of 10
    COMPILED + "from torch.utils.data import TensorDataset\n"
    "data = TensorDataset(torch.randn(4096, 8).cuda(), torch.randint(0, 10, (4096,)))\n"
    "loader = DataLoader(data, batch_size=256, shuffle=True)\n" + LOOP,
    HEAD + "class Ds(torch.utils.data.Dataset):\n    def __len__(self):\n        return 512\n"
    "    def __getitem__(self, i):\n        return torch.randn(3), 0\nmodel = torch.compile(Net().cuda())\n"
    "loader = DataLoader(Ds(), batch_size=64, shuffle=True)\n" + LOOP,
    HEAD + "class Stream(torch.utils.data.IterableDataset):\n    def __iter__(self):\n        while True:\n"
    "            yield torch.randn(3), 0\nmodel = torch.compile(Net().cuda())\n"
    "loader = DataLoader(Stream(), batch_size=64)\n" + LOOP,
    # the compile chooses how shapes are traced, or may through **kwargs
    HEAD + "model = torch.compile(Net().cuda(), dynamic=True)\n" + LOADER + LOOP,
    HEAD + "model = torch.compile(Net().cuda(), dynamic=False)\n" + LOADER + LOOP,
    HEAD + "model = torch.compile(Net().cuda(), **compile_options)\n" + LOADER + LOOP,
    HEAD + "model = Net().cuda()\nmodel.compile(dynamic=None)\n" + LOADER + LOOP,
    HEAD + "@torch.compile(dynamic=False)\n" + STEP_FN.lstrip("\n") + LOADER + STEP_LOOP.format(call="step"),
    COMPILED + LOADER + "torch._dynamo.config.automatic_dynamic_shapes = False\n" + LOOP,
    COMPILED + LOADER + LOOP.replace("loss = model(x.cuda())", "torch._dynamo.mark_dynamic(x, 0)\n        loss = model(x.cuda())"),
    # nothing of the training is compiled
    HEAD + "model = Net().cuda()\n" + LOADER + LOOP,
    HEAD + "model = Net().cuda()\n" + LOADER + LOOP + "exported = torch.compile(model)\n",  # after training
    HEAD + "model = Net().cuda()\ndef evaluate(m):\n    m = torch.compile(m)\n    with torch.no_grad():\n"
    "        for x, _ in val_loader:\n            m(x)\n" + LOADER + LOOP,
    HEAD + "model = Net().cuda()\nmodel.compile(optimizer='adam', loss='mse')\n" + LOADER + LOOP,  # Keras-style
    HEAD + "import re\nPATTERN = re.compile('x')\nmodel = Net().cuda()\n" + LOADER + LOOP,
    # the evaluation loader only
    COMPILED + "train_loader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=True)\n"
    "val_loader = DataLoader(val_set, batch_size=100)\n" + LOOP.replace("in loader", "in train_loader")
    + "with torch.no_grad():\n    for x, y in val_loader:\n        model(x.cuda())\n",
    # a framework owns the loop; CPU only; a unit test
    "import lightning as L\n" + COMPILED + LOADER + LOOP,
    HEAD + "model = torch.compile(Net())\n" + LOADER + LOOP.replace("x.cuda()", "x"),
    HEAD + "def test_compiled_training():\n    model = torch.compile(Net().cuda())\n"
    "    loader = DataLoader(ds, batch_size=64, shuffle=True)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    for x, y in loader:\n        loss = model(x.cuda()).sum()\n        loss.backward()\n        opt.step()\n",
])
def test_near_misses_stay_silent(tmp_path, code):
    assert _hits(tmp_path, code) == []


# -- declined fixes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("loader,reason", [
    ("loader = DataLoader(ds, batch_size=64)\n", "the DataLoader may not shuffle"),
    ("loader = DataLoader(ds, batch_size=64, shuffle=args.shuffle)\n", "the DataLoader may not shuffle"),
    ("loader = DataLoader(ds, batch_size=64, sampler=torch.utils.data.SequentialSampler(ds))\n",
     "the sampler (`torch.utils.data.SequentialSampler(ds)`) may keep one order"),
    ("loader = DataLoader(ds, batch_size=64, sampler=CurriculumSampler(ds))\n",
     "the sampler (`CurriculumSampler(ds)`) may keep one order"),
    ("loader = DataLoader(ds, batch_size=64, sampler=torch.utils.data.distributed.DistributedSampler(ds, shuffle=False))\n",
     "may keep one order"),
    ("kw = {'batch_size': 64, 'shuffle': True}\nloader = DataLoader(ds, **kw)\n", "takes keywords from **kw"),
])
def test_declined_fixes_say_why(tmp_path, loader, reason):
    code = COMPILED + loader + LOOP
    [hit] = _hits(tmp_path, code)
    assert not hit.fix.available and reason in hit.fix.reason
    assert _fixed(tmp_path, code) == textwrap.dedent(code).lstrip("\n")


def test_declined_when_the_same_loader_feeds_an_evaluation_loop(tmp_path):
    code = COMPILED + LOADER + LOOP + "with torch.no_grad():\n    for x, y in loader:\n        model(x.cuda())\n"
    [hit] = _hits(tmp_path, code)
    assert not hit.fix.available
    assert hit.fix.reason.startswith("this DataLoader call also feeds the loop at line 13, which does not train")


def test_declined_when_a_helper_builds_the_evaluation_loader_too(tmp_path):
    code = HEAD + "def make_loader(ds, shuffle):\n    return DataLoader(ds, batch_size=64, shuffle=shuffle)\n" \
        "model = torch.compile(Net().cuda())\nloader = make_loader(train_set, True)\nholdout = make_loader(val_set, False)\n" + LOOP
    [hit] = _hits(tmp_path, code)
    assert not hit.fix.available and "built by `make_loader`, called 2 times" in hit.fix.reason


# -- with `fix --compile`: the compile TC305's fix adds ----------------------------------------------------


UNCOMPILED = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def main():
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(train_set, batch_size=100, shuffle=True)
    for epoch in range(5):
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
'''


def test_speaks_for_the_compile_that_fix_compile_adds(tmp_path):
    assert _hits(tmp_path, UNCOMPILED) == []  # nothing compiles it
    found = scan_code(tmp_path, UNCOMPILED, select=("TC305", "TC318"), structural_fixes=("compile",)).findings
    [hit] = [f for f in found if f.rule == "TC318"]
    assert hit.follows == "TC305" and hit.fix.available and hit.location.line == 18
    assert hit.message == "once compiled (TC305), the model recompiles on the smaller last batch: pass `drop_last=True`"
    fixed = _fixed(tmp_path, UNCOMPILED, select=("TC305", "TC318"), structural_fixes=("compile",))
    assert "        model.compile()\n" in fixed
    assert "    loader = DataLoader(train_set, batch_size=100, shuffle=True, drop_last=True)\n" in fixed
    # Without TC305 in the run, nothing compiles the model: nothing to report.
    assert _hits(tmp_path, UNCOMPILED, structural_fixes=("compile",)) == []


# -- the fixed script on CPU -------------------------------------------------------------------------------


RECOMPILES = r'''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch._dynamo.utils import counters


def graphs(**loader_options):
    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(100, 8), torch.randint(0, 2, (100,)))
    for epoch in range(2):
        for x, y in DataLoader(data, batch_size=32, shuffle=True, **loader_options):
            loss = nn.functional.cross_entropy(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return counters["stats"]["unique_graphs"]


print("graphs", graphs(), graphs(drop_last=True))
'''


@pytest.mark.slow
def test_drop_last_removes_the_recompile_on_cpu(tmp_path):
    """100 samples at batch 32: the last batch of 4 makes Dynamo compile a second graph; with the fix's
    ``drop_last=True`` it compiles one."""
    pytest.importorskip("torch")
    script = tmp_path / "recompiles.py"
    script.write_text(RECOMPILES, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["graphs", "2", "1"]
