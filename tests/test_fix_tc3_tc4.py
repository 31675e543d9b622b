"""The TC3/TC4 fixes beyond their fixture pairs: the ResNet50 recipe, the traps they must decline
(file unchanged, reason given), and edits whose exact shape matters (wrappers, imports, aliases).

The before/after pairs themselves (fixtures/fix/tc3*, tc4*, all_resnet50) run in test_fix.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import analyse_source, instantiate_rules
from tcaudit.findings import DeclineFix, FixClass, Severity
from tcaudit.fix.engine import fix_file
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.pipeline.tc401_dataloader_no_workers import WORKERS
from tcaudit.rules.pipeline.tc404_workers_not_persistent import WorkersNotPersistentFix
from tcaudit.source.parsing import read_source

ROOT = Path(__file__).resolve().parent.parent
RESNET50 = ROOT / "fixtures" / "resnet50" / "train.py"
FIX_FIXTURES = ROOT / "fixtures" / "fix"


def _fix(tmp_path: Path, code: str, select: tuple[str, ...]):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return fix_file(path, Settings(select=select)), path


def _declined(result, rule: str) -> list[str]:
    return [reason for finding, reason in result.declined if finding.rule == rule]


# -- the ResNet50 recipe -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixed_resnet50():
    return fix_file(RESNET50, Settings(select=("ALL",)))


def test_resnet50_gets_the_fastest_non_structural_recipe(fixed_resnet50):
    """PERF.md: fp16 autocast + GradScaler + channels_last, with cudnn.benchmark, TF32, a tuned loader and
    asynchronous copies."""
    text = fixed_resnet50.fixed
    recipe = {
        "autocast (fp16)": "with torch.autocast(device_type=device, dtype=torch.float16, enabled=device == \"cuda\"):",
        "GradScaler": "scaler = torch.amp.GradScaler(device, enabled=device == \"cuda\")",
        "scaled backward": "scaler.scale(loss).backward()",
        "channels_last model": "model = model.to(memory_format=torch.channels_last)",
        "channels_last batches": "images = images.contiguous(memory_format=torch.channels_last)",
        "cudnn.benchmark": "torch.backends.cudnn.benchmark = True",
        "TF32": 'torch.set_float32_matmul_precision("high")',
        "workers": f"num_workers={WORKERS}",
        "pinned memory": "pin_memory=True",
        "persistent workers": "persistent_workers=True",
        "asynchronous copies": "images = images.cuda(non_blocking=True)",
    }
    missing = [name for name, code in recipe.items() if code not in text]
    assert not missing, missing
    assert "import os\n" in text
    # Structural fixes are opt-in: no torch.compile, no DDP, no DALI.
    assert "torch.compile" not in text and "DistributedDataParallel" not in text
    # The model is converted before it is moved; the batch right after its copy.
    assert text.index("model = model.to(memory_format") < text.index("model = model.cuda()")
    assert text.index("images = images.cuda(non_blocking=True)") < text.index("images = images.contiguous(")
    # Fused SGD under the GradScaler that TC201 adds went NaN on an H200: TC307 is declined there.
    assert "fused=True" not in text
    assert any(f.rule == "TC307" and "GradScaler" in reason for f, reason in fixed_resnet50.declined)


def test_resnet50_keeps_no_fixable_tc3_tc4_warning(fixed_resnet50):
    left = [
        f for f in fixed_resnet50.remaining
        if f.rule.startswith(("TC3", "TC4")) and f.severity in (Severity.WARNING, Severity.ERROR)
        and f.fix is not None and f.fix.available and f.fix.fix_class in (FixClass.SAFE, FixClass.NUMERICS)
    ]
    assert not left, [(f.rule, f.location.line, f.message) for f in left]
    assert {"TC301", "TC302", "TC303", "TC401", "TC402", "TC403", "TC404"} <= set(fixed_resnet50.applied)


def test_all_resnet50_fixture_is_the_resnet50_script():
    """The fixture pair must follow fixtures/resnet50/train.py; only the `# run:` line is added."""
    fixture = (FIX_FIXTURES / "all_resnet50.in.py").read_text()
    run_line = "# run: python {path} --synthetic --steps 2 --batch-size 2 --image-size 32 --num-classes 10\n"
    assert run_line in fixture
    assert fixture.replace(run_line, "") == RESNET50.read_text()


# -- TC301 / TC302: global settings ----------------------------------------------------------------------


def test_backend_settings_respect_an_explicit_false(tmp_path):
    result, path = _fix(tmp_path, """
        import torch
        import torchvision

        torch.backends.cuda.matmul.allow_tf32 = False
        if args.seed is not None:
            torch.backends.cudnn.benchmark = False
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """, ("TC301", "TC302"))
    assert not result.changed
    assert result.fixed == path.read_text()


def test_settings_import_torch_when_the_file_binds_only_submodules(tmp_path):
    result, _ = _fix(tmp_path, """
        from torch import nn, optim

        model = nn.Linear(10, 10).cuda()
        opt = optim.SGD(model.parameters(), lr=1e-3, foreach=False)
        for x in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
        """, ("TC301",))
    assert result.fixed.startswith(
        "from torch import nn, optim\nimport torch\n\ntorch.set_float32_matmul_precision(\"high\")\n\nmodel ="
    )


def test_tf32_is_kept_when_autocast_is_added_in_the_same_run(tmp_path):
    """TC301 runs before TC201 in a round: autocast would silence the rule that asked for TF32."""
    result, _ = _fix(tmp_path, """
        import torch

        def main():
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = torch.nn.Linear(16, 16).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
            for step in range(10):
                x = torch.randn(8, 16, device=device)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """, ("TC201", "TC301"))
    assert sorted(result.applied) == ["TC201", "TC301"]
    assert 'torch.set_float32_matmul_precision("high")' in result.fixed and "torch.autocast(" in result.fixed


# -- TC303 ----------------------------------------------------------------------------------------------

_LENET = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader


    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5)
            self.fc1 = nn.Linear(6 * 12 * 12, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = x.view(-1, 6 * 12 * 12)
            return self.fc1(x)


    def main():
        device = torch.device("cuda")
        model = LeNet().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


    if __name__ == "__main__":
        main()
    """


def test_channels_last_turns_the_models_views_of_activations_into_reshapes(tmp_path):
    """A channels_last activation is not viewable: `x.view(-1, 864)` would raise at the first step, so it
    becomes `x.reshape(-1, 864)` (same values) and the model is converted."""
    result, path = _fix(tmp_path, _LENET, ("TC303",))
    assert result.applied == ["TC303"] and result.declined == []
    assert "        x = x.reshape(-1, 6 * 12 * 12)\n" in result.fixed
    assert "model = LeNet().to(device, memory_format=torch.channels_last)" in result.fixed
    assert ".view(" not in result.fixed
    from helpers import scan_paths

    (finding,) = scan_paths([str(path)], select=("TC303",)).findings
    assert "`x.view(-1, 6 * 12 * 12)` becomes `.reshape(...)`" in finding.fix.description


def _lenet_with(forward: str) -> str:
    """_LENET with another body for its forward (its lines at the forward's indentation)."""
    start = _LENET.index("        def forward(self, x):")
    end = _LENET.index("\n\n\n    def main")
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 12)
    return _LENET[:start] + "        def forward(self, x):\n" + body + _LENET[end:]


@pytest.mark.parametrize("forward,why", [
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        flat.clamp_(min=0)
        return self.fc1(x.flatten(1))
        """, "`flat.clamp_(min=0)` writes in place", id="view-written-in-place"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x.view(-1, 6 * 12 * 12)[:, 0] = 0
        return self.fc1(x.flatten(1))
        """, "written in place", id="view-assigned-through"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        x.mul_(2)
        return self.fc1(flat)
        """, "`x.mul_(2)` writes in place", id="source-written-after"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        flat += 1
        return self.fc1(flat)
        """, "`flat += 1` writes in place", id="augmented-assignment"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        torch.relu_(flat)
        return self.fc1(flat)
        """, "`torch.relu_(flat)` writes in place", id="in-place-function"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        F.relu(flat, inplace=True)
        return self.fc1(flat)
        """, "writes in place", id="inplace-keyword"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc1(x.view(torch.float16).float().flatten(1))
        """, "reinterprets", id="dtype-view"),
])
def test_channels_last_declined_where_a_views_storage_sharing_matters(tmp_path, forward, why):
    """A `.reshape()` copy would not pass a write on to (or from) the viewed tensor: these keep the view
    and the model is left in NCHW, the file unchanged."""
    result, _ = _fix(tmp_path, _lenet_with(forward), ("TC303",))
    assert not result.changed
    (reason,) = _declined(result, "TC303")
    assert why in reason


@pytest.mark.parametrize("forward", [
    pytest.param("""
        x = self.relu(self.conv1(x))
        x = x.view(-1, 6 * 12 * 12)
        return self.fc1(x)
        """, id="in-place-layer-before-the-view"),
    pytest.param("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc1(x.view(-1, 6 * 12 * 12)).view(-1)
        """, id="view-of-a-linear-output-stays"),
])
def test_channels_last_reshapes_where_no_write_is_shared(tmp_path, forward):
    """An in-place layer before the view writes nothing the view shares; a view of a Linear's output is
    off the conv path and stays a view."""
    code = _lenet_with(forward).replace(
        "self.conv1 = nn.Conv2d(1, 6, 5)", "self.conv1 = nn.Conv2d(1, 6, 5)\n            self.relu = nn.ReLU(inplace=True)"
    )
    result, _ = _fix(tmp_path, code, ("TC303",))
    assert result.applied == ["TC303"], result.declined
    assert "x.reshape(-1, 6 * 12 * 12)" in result.fixed
    assert result.fixed.count(".view(") == forward.count(".view(") - 1


def test_channels_last_declined_when_an_in_place_layer_writes_the_view(tmp_path):
    code = _lenet_with("""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        flat = x.view(-1, 6 * 12 * 12)
        flat = self.relu(flat)
        return self.fc1(flat)
        """).replace(
        "self.conv1 = nn.Conv2d(1, 6, 5)", "self.conv1 = nn.Conv2d(1, 6, 5)\n            self.relu = nn.ReLU(inplace=True)"
    )
    result, _ = _fix(tmp_path, code, ("TC303",))
    assert not result.changed
    assert "`self.relu(flat)` writes in place" in _declined(result, "TC303")[0]


def test_channels_last_declined_when_the_output_is_viewed(tmp_path):
    """DCGAN: `netD(real).view(-1)`."""
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn


        class Discriminator(nn.Module):
            def __init__(self):
                super().__init__()
                self.main = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 1, 4), nn.Sigmoid())

            def forward(self, input):
                return self.main(input)


        netD = Discriminator().cuda()
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
        for real in loader:
            with torch.autocast("cuda"):
                output = netD(real.cuda()).view(-1)
                errD = nn.functional.binary_cross_entropy_with_logits(output, torch.ones_like(output))
            errD.backward()
            optD.step()
        """, ("TC303",))
    assert not result.changed
    (reason,) = _declined(result, "TC303")
    assert "views the model's output" in reason


def test_channels_last_converts_after_the_models_in_place_init(tmp_path):
    """DCGAN: `netD.apply(weights_init)` draws into the weights in their memory order; converting first
    would put the same seeded draws in other places (the verify loss-parity check saw 13% on CPU)."""
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn


        def weights_init(m):
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.02)


        netD = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 1, 4)).to(device)
        netD.apply(weights_init)
        nn.init.zeros_(netD[0].bias)
        optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
        for real, _ in loader:
            with torch.autocast("cuda"):
                errD = netD(real.cuda()).mean()
            errD.backward()
            optD.step()
        """, ("TC303",))
    assert result.applied == ["TC303"], result.declined
    assert (
        "netD.apply(weights_init)\nnn.init.zeros_(netD[0].bias)\n"
        "netD = netD.to(memory_format=torch.channels_last)\noptD = " in result.fixed
    )


def test_channels_last_declined_for_3d_convolutions(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)
                self.temporal = nn.Conv3d(8, 8, 1)

            def forward(self, x):
                return self.temporal(self.conv(x).unsqueeze(2)).mean()


        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            with torch.autocast("cuda"):
                loss = model(x.cuda())
            loss.backward()
            opt.step()
        """, ("TC303",))
    assert not result.changed
    (reason,) = _declined(result, "TC303")
    assert "3-D convolutions" in reason


def test_channels_last_declined_for_a_model_built_in_a_one_line_suite(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        import torchvision.models as models


        def main(args):
            if args.pretrained: model = models.resnet50(weights="DEFAULT")
            else: model = models.resnet50()
            model = model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss = model(x.cuda()).mean()
                loss.backward()
                opt.step()
        """, ("TC303",))
    assert not result.changed
    assert "one-line suite" in _declined(result, "TC303")[0]


def test_channels_last_converts_the_model_before_a_wrapper(tmp_path):
    """Converting a DDP-wrapped model would change parameter layouts after its buckets are built."""
    result, _ = _fix(tmp_path, """
        import torch
        import torchvision
        from torch.nn.parallel import DistributedDataParallel as DDP


        def main(rank):
            model = DDP(torchvision.models.resnet18().cuda(rank), device_ids=[rank])
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(x.cuda(rank)), y.cuda(rank))
                loss.backward()
                opt.step()
        """, ("TC303",))
    assert (
        "    model = DDP(torchvision.models.resnet18().cuda(rank).to(memory_format=torch.channels_last), "
        "device_ids=[rank])\n" in result.fixed
    )


def test_channels_last_leaves_inputs_of_a_model_whose_input_rank_is_unknown(tmp_path):
    """The model class flattens or unsqueezes its input first: only the model is converted, since a
    channels_last copy of a tensor that is not rank 4 raises."""
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 8, 3)

            def forward(self, x):
                return self.conv(x.unsqueeze(1)).mean((1, 2, 3))


        def main():
            device = torch.device("cuda")
            model = Net().to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = DataLoader(dataset, batch_size=8, num_workers=2, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                with torch.autocast("cuda"):
                    loss = (model(x) - y.to(device, non_blocking=True)).square().mean()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC303",))
    assert "model = Net().to(device, memory_format=torch.channels_last)" in result.fixed
    assert "x = x.to(device, non_blocking=True)\n" in result.fixed


# -- TC307 ----------------------------------------------------------------------------------------------


def test_fused_declined_when_the_optimizer_is_built_before_the_move(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn

        model = nn.Linear(10, 10)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model.cuda()
        for x in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
        """, ("TC307",))
    assert not result.changed
    assert "before the optimizer is built" in _declined(result, "TC307")[0]


_TRAINER_FUNCTION = """
    import torch
    import torch.nn as nn


    def train_model(model, loader, lr=1e-3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        device = torch.device("cuda")
    {main}
    """


def _trainer(main: str) -> str:
    return _TRAINER_FUNCTION.replace("    {main}", textwrap.indent(textwrap.dedent(main).strip("\n"), " " * 8))


@pytest.mark.parametrize("main", [
    pytest.param("""
        model = nn.Linear(4, 2)
        model.to(device)
        train_model(model, loader)
        """, id="moved-then-passed"),
    pytest.param("""
        net = nn.Linear(4, 2).cuda()
        train_model(loader=loader, model=net)
        """, id="by-keyword"),
    pytest.param("""
        def run(m):
            train_model(m, loader)

        model = nn.Linear(4, 2)
        model = model.to(device)
        run(model)
        """, id="through-a-second-function"),
])
def test_fused_follows_the_model_parameter_to_every_caller(tmp_path, main):
    result, _ = _fix(tmp_path, _trainer(main), ("TC307",))
    assert result.applied == ["TC307"], result.declined
    assert "    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)\n" in result.fixed


@pytest.mark.parametrize("main,why", [
    pytest.param("""
        model = nn.Linear(4, 2)
        train_model(model, loader)
        model.to(device)
        """, "not every call of it", id="moved-after-the-call"),
    pytest.param("""
        model = nn.Linear(4, 2).cuda()
        train_model(model, loader)
        train_model(nn.Linear(4, 2), loader)
        """, "not every call of it", id="one-caller-passes-a-cpu-model"),
    pytest.param("""
        model = nn.Linear(4, 2).cuda()
        torch.multiprocessing.spawn(train_model, args=(model, loader))
        """, "not every call of it", id="used-as-a-callback"),
    pytest.param("""
        model = nn.Linear(4, 2).cuda()
        train_model(*[model, loader])
        """, "not every call of it", id="star-args"),
])
def test_fused_declined_where_a_caller_may_pass_a_model_off_the_gpu(tmp_path, main, why):
    result, _ = _fix(tmp_path, _trainer(main), ("TC307",))
    assert not result.changed
    (reason,) = _declined(result, "TC307")
    assert why in reason and "`train_model()`" in reason


def test_fused_declined_when_the_callee_rebinds_the_model_first(tmp_path):
    code = _trainer("""
        model = nn.Linear(4, 2).cuda()
        train_model(model, loader)
        """).replace("        optimizer = torch.optim.AdamW(", "        model = nn.Linear(4, 2)\n        optimizer = torch.optim.AdamW(")
    result, _ = _fix(tmp_path, code, ("TC307",))
    assert not result.changed
    assert "not moved to the GPU" in _declined(result, "TC307")[0]


def test_fused_sgd_in_a_trainer_function_still_declined_under_a_gradscaler(tmp_path):
    """Following the model to its callers does not lift the fused-SGD-under-GradScaler NaN trap."""
    code = _trainer("""
        model = nn.Linear(4, 2).cuda()
        train_model(model, loader)
        """).replace("torch.optim.AdamW(model.parameters(), lr=lr)", "torch.optim.SGD(model.parameters(), lr=lr)").replace(
        "            loss.backward()", "            scaler.scale(loss).backward()"
    ).replace("    optimizer = torch.optim.SGD", "    scaler = torch.amp.GradScaler()\n        optimizer = torch.optim.SGD")
    result, _ = _fix(tmp_path, code, ("TC307",))
    assert not result.changed
    assert "GradScaler" in _declined(result, "TC307")[0]


def test_fused_declined_with_sparse_gradients(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn

        model = nn.EmbeddingBag(1000, 64, sparse=True).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for x in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
        """, ("TC307",))
    assert not result.changed
    assert "sparse" in _declined(result, "TC307")[0]


def test_fused_applies_where_it_can_and_declines_the_rest(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        import torch.nn as nn

        netG = nn.Linear(8, 2).cuda()
        netD = nn.Linear(2, 1)
        optG = torch.optim.Adam(netG.parameters())
        optD = torch.optim.Adam(netD.parameters())
        netD.cuda()
        for x in loader:
            loss = netD(netG(x.cuda())).sum()
            loss.backward()
            optG.step()
            optD.step()
        """, ("TC307",))
    assert "optG = torch.optim.Adam(netG.parameters(), fused=True)\n" in result.fixed
    assert "optD = torch.optim.Adam(netD.parameters())\n" in result.fixed
    assert [f.location.line for f, _ in result.declined] == [7]


# -- TC4 ------------------------------------------------------------------------------------------------


def test_loader_keys_in_a_kwargs_dict_are_declined(tmp_path):
    """A second num_workers=/pin_memory= beside **loader_kwargs holding them is a TypeError."""
    result, path = _fix(tmp_path, """
        import torch
        from torch.utils.data import DataLoader


        def main():
            loader_kwargs = {"batch_size": 64, "num_workers": 0, "pin_memory": False}
            loader = DataLoader(train_set, **loader_kwargs)
            for x, y in loader:
                loss = model(x.cuda()).mean()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC401", "TC402"))
    assert not result.changed
    reasons = {finding.rule: reason for finding, reason in result.declined}
    assert set(reasons) == {"TC401", "TC402"}
    assert all("TypeError" in reason for reason in reasons.values())


def test_workers_declined_without_a_main_guard_but_pinning_applies(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=256, shuffle=True)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            optimizer.step()
        """, ("TC401", "TC402"))
    assert "loader = DataLoader(dataset, batch_size=256, shuffle=True, pin_memory=True)\n" in result.fixed
    assert "num_workers" not in result.fixed and "import os" not in result.fixed
    (reason,) = _declined(result, "TC401")
    assert "__main__" in reason and "spawn" in reason


def test_persistent_workers_declined_when_workers_may_be_zero(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        from torch.utils.data import DataLoader


        def main():
            kw = {"num_workers": 4} if torch.cuda.is_available() else {}
            loader = DataLoader(dataset, batch_size=8, pin_memory=True, **kw)
            for epoch in range(3):
                for x, y in loader:
                    loss = model(x.cuda(non_blocking=True)).mean()
                    loss.backward()
                    opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC404",))
    assert not result.changed
    assert "ValueError" in _declined(result, "TC404")[0]


def test_persistent_workers_follow_the_workers_fix_that_scan_reported(tmp_path):
    """F9: scan reports TC404 on a loader TC401's fix gives workers; fix makes both edits in one run."""
    result, _ = _fix(tmp_path, """
        import torch


        def main():
            loader = torch.utils.data.DataLoader(ds, batch_size=64, pin_memory=True)
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda(non_blocking=True)).mean()
                    loss.backward()
                    opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC401", "TC404"))
    assert result.applied == ["TC401", "TC404"] and result.declined == []
    assert f"DataLoader(ds, batch_size=64, pin_memory=True, num_workers={WORKERS}, persistent_workers=True)\n" in result.fixed


def test_persistent_workers_alone_are_declined_if_the_workers_fix_did_not_run(tmp_path):
    """The plan that waits for TC401 reaches TC404's fix only when TC401's fix did not add workers:
    persistent_workers=True alone would be a ValueError."""

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import torch

        def main():
            loader = torch.utils.data.DataLoader(ds, batch_size=64)
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.cuda()).mean()
                    loss.backward()
                    opt.step()

        if __name__ == "__main__":
            main()
        """), encoding="utf-8")
    settings = Settings(select=("TC401", "TC404"))
    facts, findings, errors = analyse_source(read_source(path, "train.py"), instantiate_rules(settings), settings)
    assert not errors
    waiting = [f for f in findings if f.rule == "TC404"]
    assert [f.fix.plan.after for f in waiting] == ["TC401"]
    with pytest.raises(DeclineFix, match="ValueError"):
        WorkersNotPersistentFix().apply(facts.module, waiting, FixContext(facts, settings))


def test_non_blocking_is_not_added_to_a_nested_tensor_to(tmp_path):
    """DETR's NestedTensor.to(device) takes no non_blocking: batches from a custom collate_fn are left alone."""
    result, _ = _fix(tmp_path, """
        import torch
        from torch.utils.data import DataLoader


        class NestedTensor:
            def __init__(self, tensors, mask):
                self.tensors, self.mask = tensors, mask

            def to(self, device):
                return NestedTensor(self.tensors.to(device), self.mask.to(device))


        def collate(batch):
            images = torch.stack([b[0] for b in batch])
            return NestedTensor(images, torch.zeros_like(images, dtype=torch.bool)), torch.tensor([b[1] for b in batch])


        def main():
            device = torch.device("cuda")
            loader = DataLoader(dataset, batch_size=2, collate_fn=collate, num_workers=2, pin_memory=True,
                                persistent_workers=True)
            for samples, targets in loader:
                samples = samples.to(device)
                loss = model(samples).sum()
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
        """, ("TC403",))
    assert not result.changed


def test_non_blocking_skips_a_loop_that_may_read_a_non_tensor_source(tmp_path):
    """`loader = FolderStream(...) if ... else DataLoader(...)`: the stream builds its items with numpy,
    so what `.to()` receives is not known to be a tensor."""
    result, _ = _fix(tmp_path, """
        import numpy as np
        import torch
        from torch.utils.data import DataLoader


        class FolderStream:
            def __init__(self, root):
                self.files = sorted(root)

            def __iter__(self):
                for f in self.files:
                    yield np.load(f), 0


        def main(args):
            device = torch.device("cuda")
            loader = FolderStream(args.root) if args.stream else DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True)
            for epoch in range(3):
                for x, y in loader:
                    x = x.to(device)
                    loss = model(x).mean()
                    loss.backward()
                    opt.step()


        if __name__ == "__main__":
            main(None)
        """, ("TC403", "TC404"))
    assert "x = x.to(device)\n" in result.fixed
    assert "pin_memory=True, persistent_workers=True)" in result.fixed


def test_workers_import_os_under_its_alias(tmp_path):
    result, _ = _fix(tmp_path, """
        import os as _os
        import torch
        from torch.utils.data import DataLoader


        def main():
            loader = DataLoader(dataset, batch_size=8, pin_memory=True)
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC401",))
    assert f"num_workers={WORKERS.replace('os.', '_os.')})" in result.fixed
    assert result.fixed.count("import os") == 1


def test_positional_pin_memory_false_is_replaced_in_place(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        from torch.utils.data import DataLoader


        def main():
            loader = DataLoader(dataset, 64, True, None, None, 4, None, False)
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()


        if __name__ == "__main__":
            main()
        """, ("TC402",))
    assert "loader = DataLoader(dataset, 64, True, None, None, 4, None, True)\n" in result.fixed


@pytest.mark.slow
def test_batch_sampler_loader_gets_workers_and_still_runs(tmp_path):
    """batch_sampler excludes batch_size/shuffle/sampler/drop_last, not the keywords the fixes add."""
    result, path = _fix(tmp_path, """
        import torch
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler


        class Noise(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return torch.randn(4), torch.randn(1)


        def main():
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = torch.nn.Linear(4, 1).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            dataset = Noise()
            loader = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 4, drop_last=False))
            for epoch in range(2):
                for x, y in loader:
                    loss = (model(x.to(device)) - y.to(device)).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                print(f"epoch {epoch} loss {loss.item():.4f}")


        if __name__ == "__main__":
            main()
        """, ("TC4",))
    assert sorted(result.applied) == ["TC401", "TC402", "TC403", "TC404"]
    assert f"num_workers={WORKERS}, pin_memory=True, persistent_workers=True)" in result.fixed
    path.write_text(result.fixed)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"epoch 1 loss \d", proc.stdout)


def test_factory_with_requires_grad_is_declined_and_the_rest_folded():
    result = fix_file(FIX_FIXTURES / "tc406_factories.in.py", Settings(select=("TC406",)))
    assert "torch.ones(x.shape[-1], requires_grad=True).to(x.device)" in result.fixed
    (reason,) = _declined(result, "TC406")
    assert "leaf" in reason
    assert 'mask = torch.zeros(4, 6, 1, dtype=torch.bool, device="cuda")' in result.fixed


def test_keyword_added_beside_a_kwargs_dict_the_rule_followed(tmp_path):
    """`**train_kwargs` is a literal dict without pin_memory: a keyword beside it cannot collide."""
    result, _ = _fix(tmp_path, """
        import torch


        def main(rank):
            train_kwargs = {"batch_size": 64, "shuffle": True, "num_workers": 2}
            train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs)
            for epoch in range(2):
                for data, target in train_loader:
                    loss = model(data.cuda(rank, non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()


        if __name__ == "__main__":
            main(0)
        """, ("TC402", "TC404"))
    assert (
        "train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs, pin_memory=True, "
        "persistent_workers=True)\n" in result.fixed
    )


def test_fused_on_a_semicolon_line_after_the_move(tmp_path):
    result, _ = _fix(tmp_path, """
        import torch
        model = Net().cuda(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """, ("TC307",))
    assert "model = Net().cuda(); opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)\n" in result.fixed
