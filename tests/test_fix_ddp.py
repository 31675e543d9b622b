"""``tcaudit fix --ddp``: the converted fixtures train under ``torchrun --nproc_per_node 2`` on the CPU
(gloo), each rank on its own half of the data, with finite losses and one checkpoint (from rank 0, with
the model's own keys); what cannot be converted safely is declined with a reason; and nothing
structural happens unless asked for.

The exact before/after text of each conversion (and its idempotence) is checked by tests/test_fix.py
on fixtures/fix/ddp_*.in.py / .out.py.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from helpers import run_training
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

FIX = FIXTURES / "fix"
TORCHRUN = Path(sys.executable).with_name("torchrun")

# fixture → (script arguments, number of samples in its training set, epochs); None: no sample record.
CONVERTED = {
    "ddp_module_level": (["--epochs", "2"], 64, 2),
    "ddp_trainer": ([], 48, 2),
    "ddp_dataparallel": ([], 40, 2),
    "ddp_unet_oom_retry": (["--epochs", "2"], 16, 2),
    "ddp_best_loss_save": (["--epochs", "2"], 32, 2),
    "ddp_fast_neural_style": (["--epochs", "2"], 16, 2),
    "ddp_accel_opt_in": (["--epochs", "2"], 16, 2),
    "ddp_hf_random_sampler": (["--epochs", "2"], 16, 2),
    # No shuffle off the accelerator: one epoch (the same order every epoch is what the script asks for).
    "ddp_mnist_kwargs": (["--epochs", "1", "--batch-size", "4", "--test-batch-size", "4", "--samples", "16", "--save-model"], 16, 1),
    # Its docstrings and comments mention torchrun, LOCAL_RANK, world_size and Lightning: it is still one process.
    "ddp_docstring_mentions_torchrun": (["--epochs", "2"], 32, 2),
    # The loader comes from a DataModule-like class's method, called in the batch loop's header each epoch.
    "ddp_datamodule_class": (["--epochs", "2"], 32, 2),
    "ddp_resnet50": (["--synthetic", "--steps", "2", "--batch-size", "2", "--image-size", "32", "--num-classes", "4"], None, None),
}


def _torchrun(script: Path, args: list[str], cwd: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun is not installed beside {sys.executable}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return run_training(
        [str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}", str(script), *args],
        cwd, env, outputs=("seen-*.txt", "checkpoint-*.pt"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_converted_script_trains_under_torchrun_on_two_processes(name, tmp_path):
    args, samples, epochs = CONVERTED[name]
    script = tmp_path / "train.py"
    shutil.copyfile(FIX / f"{name}.out.py", script)
    proc = _torchrun(script, args, tmp_path)
    assert proc.returncode == 0, proc.stderr[:6000]

    losses = [float(x) for x in re.findall(r"loss\s+(-?[\d.]+(?:e-?\d+)?|nan|inf)", proc.stdout)]
    assert losses and all(math.isfinite(l) for l in losses), proc.stdout[-2000:]

    if samples is not None:
        seen = [list(map(int, p.read_text().split())) for p in sorted(tmp_path.glob("seen-*.txt"))]
        assert len(seen) == 2, "each of the two processes records the samples it trained on"
        half = samples // 2
        for ids in seen:
            assert len(ids) == epochs * half, "each rank trains on half the data per epoch"
        for epoch in range(epochs):
            first, second = (set(ids[epoch * half:(epoch + 1) * half]) for ids in seen)
            assert not first & second, f"the ranks' shards overlap in epoch {epoch}"
            assert first | second == set(range(samples)), f"together the ranks cover the data set in epoch {epoch}"
        if epochs > 1:  # set_epoch reshuffles: rank 0 does not see the same order every epoch
            assert seen[0][:half] != seen[0][half:2 * half]

        checkpoints = list(tmp_path.glob("checkpoint-*.pt"))
        assert len(checkpoints) == 1, f"one checkpoint, from rank 0: {checkpoints}"
        import torch

        state = torch.load(checkpoints[0], map_location="cpu", weights_only=True)
        assert state and not any(key.startswith("module.") for key in state), list(state)


def _settings(select: tuple[str, ...] = ("TC5",)) -> Settings:
    return Settings(select=select, structural_fixes=("ddp",))


def test_only_code_says_a_script_is_already_distributed(tmp_path):
    """The docstring and comments of ddp_docstring_mentions_torchrun name torchrun, LOCAL_RANK, world_size
    and Lightning: TC505 still fires there. The same script reading ``os.environ["LOCAL_RANK"]`` in its code
    is launched as several processes already: TC505 stays silent."""
    from helpers import scan_paths

    text = (FIX / "ddp_docstring_mentions_torchrun.in.py").read_text(encoding="utf-8")
    target = tmp_path / "train.py"
    target.write_text(text, encoding="utf-8")
    assert [f.rule for f in scan_paths([str(target)], select=("TC505",)).findings] == ["TC505"]
    one_gpu = '    device = "cuda" if torch.cuda.is_available() else "cpu"  # one GPU (torchrun: not yet)\n'
    launched = text.replace(one_gpu, '    device = f"cuda:{os.environ[\'LOCAL_RANK\']}"\n')
    assert launched != text
    target.write_text(launched, encoding="utf-8")
    assert scan_paths([str(target)], select=("TC505",)).findings == []


def test_nothing_structural_without_asking(tmp_path):
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_module_level.in.py", target)
    result = fix_file(target, Settings(select=("TC5",)))
    assert not result.changed


def test_config_key_asks_for_the_conversion(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nstructural-fixes = ["ddp"]\nselect = ["TC5"]\n')
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_module_level.in.py", target)
    code, out, err = run_cli("fix", str(target), "--color", "never")
    assert code == 1, err
    assert "+model = DistributedDataParallel(model, gradient_as_bucket_view=True)" in out


def test_classes_structural_points_to_the_flags(tmp_path):
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_module_level.in.py", target)
    code, _, err = run_cli("fix", str(target), "--classes", "structural")
    assert code == 2
    assert "--ddp" in err and "--compile" in err


def test_flag_converts_and_apply_writes(tmp_path):
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_module_level.in.py", target)
    code, _, err = run_cli("fix", str(target), "--ddp", "--select", "TC5", "--apply")
    assert code == 0, err
    assert target.read_text() == (FIX / "ddp_module_level.out.py").read_text()


@pytest.mark.parametrize(
    "code, reason",
    [
        (
            """
            import torch
            from torch.utils.data import DataLoader
            netG = Generator().cuda()
            netD = Discriminator().cuda()
            optG = torch.optim.Adam(netG.parameters())
            optD = torch.optim.Adam(netD.parameters())
            loader = DataLoader(data, batch_size=64, shuffle=True)
            for real in loader:
                lossD = netD(real.cuda()).mean() - netD(netG(noise()).detach()).mean()
                optD.zero_grad()
                lossD.backward()
                optD.step()
                lossG = -netD(netG(noise())).mean()
                optG.zero_grad()
                lossG.backward()
                optG.step()
            """,
            "several trained models",
        ),
        (
            """
            import torch
            from torch.utils.data import DataLoader
            torch.cuda.set_device(0)
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in DataLoader(data, batch_size=64, shuffle=True):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
            "torch.cuda.set_device",
        ),
        (
            """
            import torch
            from torch.utils.data import DataLoader
            model = Net().to("cuda:1")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in DataLoader(data, batch_size=64, shuffle=True):
                loss = model(x.to("cuda:1")).sum()
                loss.backward()
                opt.step()
            """,
            "names GPU 1",
        ),
        (
            """
            import torch
            from torch.utils.data import DataLoader
            model = Net().cuda()
            if args.multi_gpu:
                model = torch.nn.DataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in DataLoader(data, batch_size=64, shuffle=True):
                loss = model(x.cuda()).sum()
                loss.backward()
                opt.step()
            """,
            "behind a condition",
        ),
        (
            # Issue 30: DDP without a DistributedSampler (the MNIST/siamese/HF shapes): shuffle written in two
            # places cannot move into a sampler, so no DDP edit at all, naming the loader.
            """
            import torch
            from torch.utils.data import DataLoader
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            kwargs = {"shuffle": True}
            train_loader = DataLoader(data, batch_size=64, shuffle=False, **kwargs)
            for epoch in range(2):
                for x, y in train_loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
            "the training loader `train_loader` (line 6) cannot get a DistributedSampler (shuffle= is set in more "
            "than one place",
        ),
        (
            """
            import torch
            from torch.utils.data import DataLoader
            train_loader = DataLoader(load_data(**config), batch_size=64, shuffle=True)

            def main():
                model = Net().cuda()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for epoch in range(2):
                    for x, y in train_loader:
                        loss = model(x.cuda()).sum()
                        loss.backward()
                        opt.step()

            if __name__ == "__main__":
                main()
            """,
            "is built before the process group the conversion starts in the main guard",
        ),
        (
            """
            import torch
            from torch.utils.data import DataLoader
            model = Net().cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train_loader = DataLoader(data, *loader_args)
            for epoch in range(2):
                for x, y in train_loader:
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    opt.step()
            """,
            "its arguments come from `loader_args`, which cannot be followed, so whether it has a sampler is unknown",
        ),
    ],
    ids=["gan", "set-device", "gpu-by-number", "conditional-dataparallel", "sampler-declined", "loader-before-init",
         "unseen-args"],
)
def test_unsafe_conversions_are_declined_with_a_reason(write, code, reason):
    path = write(code)
    before = path.read_bytes()
    result = fix_file(path, _settings())
    assert result.error is None
    assert not result.changed, result.diff()
    reasons = [r for f, r in result.declined if f.rule in ("TC505", "TC501")]
    assert any(reason in r for r in reasons), result.declined
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", ["tc5_hogwild.py", "tc5_rl_actor_critic.py"])
def test_hogwild_and_rl_scripts_are_not_converted(name, tmp_path):
    target = tmp_path / name
    shutil.copyfile(FIXTURES / "scripts" / name, target)
    result = fix_file(target, _settings(select=("TC505", "TC501")))
    assert not result.changed, result.diff()


def test_already_distributed_script_gets_only_what_is_missing(tmp_path):
    target = tmp_path / "train.py"
    shutil.copyfile(FIXTURES / "scripts" / "tc5_torchrun_ddp.py", target)
    result = fix_file(target, _settings())
    assert "TC505" not in result.applied and "TC501" not in result.applied
    assert result.fixed.count("init_process_group(") == target.read_text().count("init_process_group(")
    assert result.fixed.count("DistributedDataParallel(") == target.read_text().count("DistributedDataParallel(")


def test_ddp_resnet50_fixture_is_the_resnet50_script():
    """The pair must follow fixtures/resnet50/train.py, which verify and the GPU benchmarks convert."""
    assert (FIX / "ddp_resnet50.in.py").read_bytes() == (FIXTURES / "resnet50" / "train.py").read_bytes()


# Found by the GPU suite on two H200s (tests/test_gpu_fixtures.py): both ranks on GPU 0 where the device
# is `0 if torch.cuda.is_available() else "cpu"`, and NCCL given CPU tensors where the device is "cpu".
DEVICE_SCRIPT = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

print("CUDA available:", torch.cuda.is_available())
device = {device}
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4, shuffle=True)
for epoch in range(2):
    for (x,) in loader:
        loss = model(x.to(device)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def _convert(tmp_path, device: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(DEVICE_SCRIPT.format(device=device))
    result = fix_file(path, Settings(select=("TC5",), structural_fixes=("ddp",), root=tmp_path))
    assert result.error is None and "TC505" in result.applied, result.declined
    return result.fixed


def test_an_index_in_a_conditional_device_becomes_each_ranks_own_gpu(tmp_path):
    fixed = _convert(tmp_path, '0 if torch.cuda.is_available() else "cpu"')
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in fixed


def test_a_cpu_device_keeps_gloo_for_its_tensors_on_a_gpu_machine(tmp_path):
    fixed = _convert(tmp_path, '"cpu"')
    assert '"cpu:gloo,cuda:nccl"' in fixed
    assert '"nccl" if' not in fixed


DDP_FIXTURES = sorted(p.name[: -len(".in.py")] for p in FIX.glob("*ddp*.in.py"))


@pytest.mark.parametrize("name", DDP_FIXTURES)
def test_the_conversion_deletes_no_statement_or_comment(name):
    """Issue 30: a moved rank-0 save dropped the `best_loss = test_loss` after it, and comment lines went
    missing. Every line the conversion takes out must come back edited (a close match among the lines it
    adds), never vanish."""
    import difflib

    before = (FIX / f"{name}.in.py").read_text().splitlines()
    after = (FIX / f"{name}.out.py").read_text().splitlines()
    added = [line.strip() for line in after if line.strip() and line not in before]
    # What the conversion replaces on purpose: the DataParallel wrap (by the DDP one), ``sys.exit(main())``
    # (run main, destroy the group, then exit with its status).
    replaced = re.compile(r"DataParallel\(|^(sys\.)?exit\(")
    lost = []
    for line in before:
        text = line.strip()
        if not text or text in (a.strip() for a in after) or replaced.search(text):
            continue
        if difflib.get_close_matches(text, added, n=1, cutoff=0.6):
            continue
        # A call edited in place with long arguments added (``DataLoader(ds, **kw)`` given a sampler).
        head = text.split("(")[0] + "(" if "(" in text else None
        if head is None or not any(a.startswith(head) for a in added):
            lost.append(text)
    assert not lost, f"lines of {name}.in.py missing from its conversion: {lost}"


def test_a_loader_with_its_own_sampler_declines_the_whole_conversion(tmp_path):
    """Issue 30: the custom infinite loader kept its RandomSampler and both ranks trained on identical
    batches without a word. Now no DDP edit is made, and scan and fix name the loader."""
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_infinite_loader_declined.in.py", target)
    before = target.read_bytes()
    code, out, err = run_cli("fix", str(target), "--ddp", "--select", "TC5", "--apply")
    assert target.read_bytes() == before
    assert "TC505 no fix: the training loader `self.train_loader` in `InfiniteDataLoader` brings its own sampler" in out + err
    code, out, _ = run_cli("scan", "--no-exec", "--select", "TC505", str(target))
    assert "no fix: the training loader `self.train_loader`" in out


def test_the_tutorial_single_gpu_trainer_is_converted_where_its_class_keeps_the_model(tmp_path):
    """Issue 30 found no TC505 at all; issue 48: the conversion wraps the attribute the Trainer keeps (the
    factory returns the model), as the tutorial's torchrun version does. The exact text is
    fixtures/fix/ddp_tutorial_single_gpu.out.py (tests/test_fix.py)."""
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_tutorial_single_gpu.in.py", target)
    code, out, _ = run_cli("scan", "--no-exec", "--select", "TC505", str(target))
    assert "TC505" in out and "no fix" not in out, out
    code, out, err = run_cli("fix", str(target), "--ddp", "--select", "TC5", "--apply")
    text = target.read_text(encoding="utf-8")
    assert "        self.model = DistributedDataParallel(self.model, gradient_as_bucket_view=True)\n" in text
    assert "        ckp = self.model.module.state_dict()\n" in text


def test_a_cpu_default_with_an_accel_opt_in_keeps_gloo_for_cpu_tensors():
    """Issue 30: a script that trains on the CPU unless `--accel` is given got an NCCL-only group whenever
    CUDA exists (NCCL has no CPU tensors)."""
    assert 'ddp_backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"' in (
        FIX / "ddp_accel_opt_in.out.py"
    ).read_text()


WHOLE_MODEL_SAVES = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def report(model):
    print("classes", model.classes)


device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(8, 2).to(device)
model.classes = 2
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))), batch_size=4, shuffle=True)
for epoch in range(2):
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    report(model)
torch.save(model, "whole.pt")
torch.save({"model": model, "opt": opt.state_dict()}, "ckpt.pt")
"""


def test_whole_model_checkpoints_load_without_a_process_group(write, tmp_path):
    """Issue 30: `torch.save(model)` after the wrap pickled the DistributedDataParallel object, which
    needs a process group to load. The conversion saves `model.module`; the checkpoints load in a
    plain process as the script's own module."""
    path = write(WHOLE_MODEL_SAVES)
    result = fix_file(path, _settings())
    assert sorted(result.applied) == ["TC503", "TC504", "TC505"], result.declined
    assert '    torch.save(model.module, "whole.pt")\n' in result.fixed
    assert '    torch.save({"model": model.module, "opt": opt.state_dict()}, "ckpt.pt")\n' in result.fixed
    assert '    print("classes", model.module.classes)\n' in result.fixed
    path.write_text(result.fixed, encoding="utf-8")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = run_training([sys.executable, str(path)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    load = ("import torch, torch.nn as nn\n"
            "a = torch.load('whole.pt', weights_only=False)\n"
            "b = torch.load('ckpt.pt', weights_only=False)['model']\n"
            "assert type(a) is nn.Linear and type(b) is nn.Linear, (type(a), type(b))\n"
            "print('loaded')\n")
    proc = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-3000:]


def test_a_helper_called_before_the_wrap_declines_the_conversion(write):
    """Issue 30: a `--sample-only` path ran `report(model)` before the wrap, and the conversion had made
    it read `model.module.classes`. Now no DDP edit, naming the helper and the early call."""
    path = write(WHOLE_MODEL_SAVES.replace(
        "opt = torch.optim.SGD", "if device == 'cpu':\n    report(model)\nopt = torch.optim.SGD"))
    before = path.read_bytes()
    result = fix_file(path, _settings())
    assert not result.changed and path.read_bytes() == before
    reasons = [r for f, r in result.declined if f.rule == "TC505"]
    assert any("`report()` reads `model.classes` and is called before the DDP wrap too (line 14)" in r for r in reasons), reasons


@pytest.mark.slow
def test_a_moved_save_runs_exactly_when_it_did(tmp_path):
    """Issue 30: the rank-0 save moved under `if dist.get_rank() == 0:` dropped `best_loss = test_loss`
    after it, so every evaluation "improved". Under torchrun, rank 0 saves once per improvement, and the
    script counts (every rank takes the same branch: the barrier after the save would hang otherwise)."""
    script = tmp_path / "train.py"
    shutil.copyfile(FIX / "ddp_best_loss_save.out.py", script)
    proc = _torchrun(script, ["--epochs", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[:6000]
    saves = proc.stdout.count("is the best so far")
    improvements = int(re.search(r"improvements (\d+)", proc.stdout).group(1))
    assert 1 <= saves == improvements, proc.stdout[-3000:]
    assert "                best_loss = test_loss\n" in script.read_text()


@pytest.mark.parametrize("name, kept", [
    # After training `net = Net()` and `net.load_state_dict(torch.load(PATH))` load into a new, bare model;
    # the conversion had made it `net.module.load_state_dict` (AttributeError on the H200). PATH is made
    # under tempfile.mkdtemp() and read back: each rank saves its own copy (rank 0 alone left the others
    # nothing to load; the oracle runs the two ranks).
    ("all_rw_cifar_tutorial", ["\ntorch.save(net.module.state_dict(), PATH)\n",
                               "\nnet.load_state_dict(torch.load(PATH, weights_only=True))\n"]),
    # `fit(model, ...)` keeps the best `model.state_dict()` and restores it with `model.load_state_dict`:
    # the save went through `.module` and the restore did not (missing "module." keys on the H200).
    ("all_rw_keras_style_fit", ["copy.deepcopy(model.module.state_dict())", "        model.module.load_state_dict(best_state)\n",
                                "torch.save(model.module, args.out)"]),
])
def test_converted_realworld_fixture_runs_to_its_end(name, kept, tmp_path):
    """Issue 30, from the GPU suite's --ddp variants: the converted script (a group of one) runs to its end."""
    target = tmp_path / "train.py"
    shutil.copyfile(FIX / f"{name}.in.py", target)
    result = fix_file(target, _settings(("ALL",)))
    assert "TC505" in result.applied, result.declined
    for text in kept:
        assert text in result.fixed
    target.write_text(result.fixed, encoding="utf-8")
    argv = re.search(r"#\s*run:\s*python\s+\{path\}(.*)", result.fixed).group(1).split()
    proc = run_training([sys.executable, str(target), *argv], tmp_path, {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
