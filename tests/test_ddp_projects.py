"""``fix --ddp`` on projects (issue 48): the model as the rest of the project sees it, the DDP tutorial's
single-GPU Trainer, and one line per file saying what was converted or why not.

The two-rank runs of the converted project fixtures (fixtures/projects/ddp_*) are in tests/test_projects.py
(``test_a_ddp_patch_trains_two_ranks_on_their_own_data_or_says_why_not``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "fixtures" / "projects"
EXPECTED = Path(__file__).parent / "expected"


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(PROJECTS / name, folder, ignore=shutil.ignore_patterns(".tcaudit_cache", "__pycache__"))
    return folder


def _fix(folder: Path, target: str, *extra: str) -> tuple[int, str, str]:
    return run_cli("fix", target, "--ddp", "--select", "TC5", "--isolated", "--no-cache", "--no-exec", *extra,
                   cwd=folder)


def test_the_tutorial_trainer_becomes_its_torchrun_version(tmp_path):
    """The wrap on ``self.model`` in ``__init__``, the DistributedSampler in prepare_dataloader(),
    ``set_epoch`` through ``self.train_data``, rank-0 checkpoint of ``self.model.module.state_dict()``."""
    folder = _copy("ddp_tutorial", tmp_path)
    code, out, err = _fix(folder, "single_gpu.py", "--apply")
    assert code == 0, err
    assert "single_gpu.py: --ddp: converted (TC505)" in err
    assert (folder / "single_gpu.py").read_text(encoding="utf-8") == (
        EXPECTED / "ddp_tutorial.single_gpu.py").read_text(encoding="utf-8")
    # A fixed point: a second run changes nothing and says the file is already distributed.
    before = (folder / "single_gpu.py").read_bytes()
    code, out, err = _fix(folder, "single_gpu.py", "--apply")
    assert (folder / "single_gpu.py").read_bytes() == before, err


def test_a_function_of_another_module_reading_the_models_attributes_gets_the_bare_model(tmp_path):
    folder = _copy("ddp_unet", tmp_path)
    code, out, err = _fix(folder, "train.py")
    assert "+        val_score = evaluate(model.module, val_loader, device)" in out, out
    assert "+    masks = torch.randint(0, model.module.n_classes, (24, 16, 16), generator=generator)" in out
    # The modules it reads are not edited: the call hands them what they expect.
    assert "+++ b/evaluate.py" not in out


def test_the_model_is_followed_through_the_functions_a_helper_hands_it_to(tmp_path):
    folder = _copy("ddp_yolo", tmp_path)
    code, out, err = _fix(folder, "train.py")
    assert "+            loss, loss_components = compute_loss(outputs, targets, model.module)" in out, out
    assert "+++ b/utils/loss.py" not in out


TRAINS_ELSEWHERE = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from engine import train_one_epoch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_classes = 4
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,))), batch_size=4, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        HELPER


if __name__ == "__main__":
    main()
'''


def _project(tmp_path: Path, helper_call: str, engine: str) -> Path:
    (tmp_path / "train.py").write_text(TRAINS_ELSEWHERE.replace("HELPER", helper_call), encoding="utf-8")
    (tmp_path / "engine.py").write_text(engine, encoding="utf-8")
    return tmp_path


def test_a_helper_that_reads_the_models_attributes_and_trains_it_declines_naming_the_read(tmp_path):
    folder = _project(tmp_path, "train_one_epoch(model, loader, optimizer)", '''\
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, model.n_classes), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''')
    before = (folder / "train.py").read_bytes()
    code, out, err = _fix(folder, "train.py", "--apply")
    assert (folder / "train.py").read_bytes() == before
    assert "TC505 no fix: `train_one_epoch()` (engine.py) reads `model.n_classes` (line 7)" in err, err
    assert "without DDP's gradient sync" in err


def test_an_object_keeping_the_model_and_reading_its_attributes_declines(tmp_path):
    folder = _project(tmp_path, "Reporter(model).report()", '''\
class Reporter:
    def __init__(self, net):
        self.net = net

    def report(self):
        print(self.net.n_classes)
''')
    (folder / "train.py").write_text((folder / "train.py").read_text().replace(
        "from engine import train_one_epoch", "from engine import Reporter"), encoding="utf-8")
    code, out, err = _fix(folder, "train.py")
    assert "TC505 no fix: `Reporter(...)` (engine.py) keeps the model it is handed and reads `self.net.n_classes` " \
           "(line 6)" in err, err


def test_library_functions_and_helpers_that_only_call_the_model_keep_the_wrapper(tmp_path):
    """Near misses: a helper that only runs the model's forward and nn.Module's own API (train/eval,
    parameters) gets the wrapped model, as does a library's function."""
    folder = _project(tmp_path, "evaluate(model, loader)", '''\
import torch


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    total = sum(float(model(x).sum()) for x, _ in loader)
    n = sum(p.numel() for p in model.parameters())
    model.train()
    return total / n
''')
    (folder / "train.py").write_text((folder / "train.py").read_text().replace(
        "from engine import train_one_epoch", "from engine import evaluate"), encoding="utf-8")
    code, out, err = _fix(folder, "train.py")
    assert "train.py: --ddp: converted (TC505)" in err, err
    assert "model.module" not in out, out


def test_a_loader_module_gets_its_sampler_only_while_a_process_group_is_up(tmp_path):
    """The factory is shared: after ``fix train.py --ddp --apply`` a caller without a process group still
    gets a shuffling loader over the whole dataset; under a group (of one, here) a DistributedSampler."""
    import subprocess
    import sys

    folder = _copy("ddp_loader_module", tmp_path)
    code, out, err = _fix(folder, "train.py", "--apply")
    assert "fixed train.py (TC505, TC504)" in err and "fixed data/factory.py (TC503)" in err, err
    factory = (folder / "data" / "factory.py").read_text(encoding="utf-8")
    assert factory.endswith(
        "    # DDP (tcaudit fix --ddp): each rank reads its own shard while a process group is up.\n"
        "    sampler = DistributedSampler(dataset, shuffle=True) if dist.is_available() and dist.is_initialized() "
        "else None\n"
        "    return DataLoader(dataset, batch_size=batch_size, shuffle=sampler is None, drop_last=True, "
        "sampler=sampler)\n")
    probe = (
        "import torch.distributed as dist\n"
        "from data.factory import build_train_loader\n"
        "print(type(build_train_loader(4).sampler).__name__)\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print(type(build_train_loader(4).sampler).__name__)\n"
        "dist.destroy_process_group()\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["RandomSampler", "DistributedSampler"]


def test_a_factory_that_also_builds_another_loader_declines(tmp_path):
    folder = _copy("ddp_loader_module", tmp_path)
    train = folder / "train.py"
    train.write_text(train.read_text(encoding="utf-8").replace(
        "    val_loader = DataLoader(TensorDataset(torch.randn(8, 8), torch.randint(0, 4, (8,))), batch_size=4)\n",
        "    val_loader = build_train_loader(4)\n"), encoding="utf-8")
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, "train.py", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert ("TC505 no fix: the training DataLoader is built by `build_train_loader` (data/factory.py:10), which "
            "line 15 calls for another loader too") in err, err


def test_a_folder_fix_writes_the_loader_module_first_and_still_converts_the_script(tmp_path):
    """``fix . --ddp --apply`` fixes data/factory.py before train.py (path order): the script then meets its
    loader already sharded by the guarded sampler, and converts (reseeding it each epoch)."""
    folder = _copy("ddp_loader_module", tmp_path)
    code, out, err = run_cli("fix", ".", "--ddp", "--apply", "--select", "TC5", "--isolated", "--no-cache",
                             "--no-exec", cwd=folder)
    assert "fixed data/factory.py (TC503)" in err and "fixed train.py (TC505, TC504)" in err, err
    assert err.index("fixed data/factory.py") < err.index("fixed train.py")
    assert 'train_loader.sampler.set_epoch(epoch)' in (folder / "train.py").read_text(encoding="utf-8")
    again = {p: p.read_bytes() for p in folder.rglob("*.py")}
    run_cli("fix", ".", "--ddp", "--apply", "--select", "TC5", "--isolated", "--no-cache", "--no-exec", cwd=folder)
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == again


def test_a_datamodule_classs_training_loader_is_sharded_where_it_is_built_and_reseeded_where_the_loop_is(tmp_path):
    """Plain PyTorch, no Lightning: data/module.py's ``DataModule.train_dataloader()`` builds the training
    loader, the epoch loop iterates ``dm.train_dataloader()``. The method gets the guarded DistributedSampler,
    the loop names that epoch's loader and reseeds it; val_dataloader() stays whole. TC503 afterwards sees the
    same loader: silent on the fixed project, and it reports it again once the module loses its sampler."""
    folder = _copy("ddp_datamodule", tmp_path)
    original = (folder / "data" / "module.py").read_text(encoding="utf-8")
    code, out, err = _fix(folder, "train.py", "--apply")
    assert "fixed data/module.py (TC503)" in err and "fixed train.py (TC505, TC504)" in err, err
    module = (folder / "data" / "module.py").read_text(encoding="utf-8")
    assert module == original.replace(
        "import torch\n", "import torch\nimport torch.distributed as dist\n").replace(
        "from torch.utils.data import DataLoader, TensorDataset\n",
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "from torch.utils.data.distributed import DistributedSampler\n"
    ).replace(
        "        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)\n",
        "        # DDP (tcaudit fix --ddp): each rank reads its own shard while a process group is up.\n"
        "        sampler = DistributedSampler(self.train_set, shuffle=True) if dist.is_available() and "
        "dist.is_initialized() else None\n"
        "        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=sampler is None, "
        "drop_last=True, sampler=sampler)\n")
    assert "        return DataLoader(self.val_set, batch_size=self.batch_size)\n" in module
    train = (folder / "train.py").read_text(encoding="utf-8")
    assert ("    for epoch in range(2):\n"
            "        model.train()\n"
            "        train_loader = dm.train_dataloader()\n"
            "        if hasattr(train_loader.sampler, \"set_epoch\"):\n"
            "            train_loader.sampler.set_epoch(epoch)\n"
            "        for x, y in train_loader:\n") in train, train
    code, out, err = run_cli("scan", ".", "--select", "TC503,TC504,TC505", "--isolated", "--no-cache", "--no-exec",
                             "--format", "json", cwd=folder)
    assert code == 0 and json.loads(out)["findings"] == [], out
    (folder / "data" / "module.py").write_text(original, encoding="utf-8")
    code, out, err = run_cli("scan", ".", "--select", "TC503", "--isolated", "--no-cache", "--no-exec",
                             "--format", "json", cwd=folder)
    assert sorted((f["path"], f["line"]) for f in json.loads(out)["findings"]) == [("data/module.py", 20),
                                                                                ("train.py", 22)], out


def test_a_datamodule_the_script_gets_from_a_factory_declines_naming_the_loader(tmp_path):
    """``dm = make_datamodule(4)``: the object's class is not followed through the factory, so the loader
    its method builds cannot get a sampler. Converting anyway (the script's own evaluation loader is
    visible) would train every rank on the same batches: the conversion declines, naming the loop's loader."""
    folder = _copy("ddp_datamodule", tmp_path)
    with open(folder / "data" / "module.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef make_datamodule(batch_size):\n    return DataModule(batch_size)\n")
    train = folder / "train.py"
    train.write_text(train.read_text(encoding="utf-8").replace(
        "from data.module import DataModule\n",
        "from torch.utils.data import DataLoader, TensorDataset\n\nfrom data.module import make_datamodule\n").replace(
        "    dm = DataModule(batch_size=4)\n", "    dm = make_datamodule(4)\n").replace(
        "    dm.setup()\n",
        "    dm.setup()\n    val_loader = DataLoader(TensorDataset(torch.randn(8, 8), torch.randint(0, 4, (8,))), "
        "batch_size=4)\n").replace("for x, y in dm.val_dataloader())", "for x, y in val_loader)"), encoding="utf-8")
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, ".", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert ("train.py:20: TC505 no fix: the training loop iterates `dm.train_dataloader()` (line 20), whose DataLoader "
            "tcaudit cannot follow to give it a DistributedSampler") in err, err


def test_a_trainer_handing_itself_to_callbacks_of_another_module_declines_naming_the_call(tmp_path):
    """engine/callbacks.py reads ``trainer.model.head`` and saves ``trainer.model.state_dict()``: with
    ``self.model`` wrapped, the first would raise AttributeError and the second save ``module.`` keys from every
    rank. The callbacks are reached through a list the conversion cannot follow: declined, nothing written."""
    folder = _copy("ddp_trainer_callbacks", tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, ".", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert ("train.py:22: TC505 no fix: `self`, which holds the wrapped `self.model`, is handed to "
            "`callback.on_epoch_end(...)` (line 30), which tcaudit cannot follow") in err, err
    assert "engine/callbacks.py: --ddp: not converted: " in err


def _reporting_trainer(tmp_path: Path, reads: str) -> Path:
    """ddp_trainer_callbacks with the callbacks replaced by a function of the script that is handed the
    trainer and reads ``reads`` of it."""
    folder = _copy("ddp_trainer_callbacks", tmp_path)
    train = folder / "train.py"
    train.write_text(train.read_text(encoding="utf-8").replace(
        "from engine.callbacks import Checkpoint, LogClasses\n", "").replace(
        "            for callback in self.callbacks:\n                callback.on_epoch_end(self, epoch)\n",
        "            report(self, epoch)\n").replace(
        "class Trainer:\n", f"def report(trainer, epoch):\n    print(epoch, {reads})\n\n\nclass Trainer:\n").replace(
        ", callbacks=[LogClasses(), Checkpoint(\"last.pt\")]", ""), encoding="utf-8")
    return folder


def test_a_function_handed_the_trainer_that_reads_the_wrapped_models_attributes_declines(tmp_path):
    folder = _reporting_trainer(tmp_path, "trainer.model.head.out_features")
    code, out, err = _fix(folder, "train.py")
    assert ("TC505 no fix: `report()` (train.py) reads `trainer.model.head` (line 11) of the object holding the "
            "wrapped `self.model`") in err, err
    assert out == ""


def test_a_function_handed_the_trainer_that_reads_only_what_ddp_answers_converts_and_the_kept_loader_is_reseeded(
        tmp_path):
    """``report(self, epoch)`` reads the trainer's loss and ``trainer.model.training`` (DDP answers that itself):
    converted. The loader is built in main() and kept by ``Trainer.__init__`` as ``self.loader``: the epoch loop
    reseeds its sampler through that attribute."""
    folder = _reporting_trainer(tmp_path, "trainer.last_loss, trainer.model.training")
    code, out, err = _fix(folder, "train.py", "--apply")
    assert "train.py: --ddp: converted (TC505)" in err, err
    text = (folder / "train.py").read_text(encoding="utf-8")
    assert ("        for epoch in range(epochs):\n"
            "            self.loader.sampler.set_epoch(epoch)\n"
            "            for x, y in self.loader:\n") in text, text
    assert "        self.model = DistributedDataParallel(self.model, gradient_as_bucket_view=True)\n" in text


def test_a_config_driven_builder_of_every_split_declines_and_leaves_its_module_alone(tmp_path):
    """``build_dataloader(cfg, "train")`` and ``build_dataloader(cfg, "val")``: a sampler in data.py would split
    the validation set too. Declined in train.py, and data.py is not given a sampler for a conversion that
    is not made."""
    folder = _copy("ddp_config_loader", tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, ".", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert ("train.py:25: TC505 no fix: the training DataLoader is built by `build_dataloader` (data.py:14), which "
            "line 22 calls for another loader too") in err, err
    assert "data.py: --ddp: not converted: " in err and "fixed data.py" not in err


def test_a_factory_returning_the_train_and_val_loaders_shards_only_the_training_one(tmp_path):
    folder = _copy("ddp_loader_tuple", tmp_path)
    code, out, err = _fix(folder, ".", "--apply")
    assert "fixed data/loaders.py (TC503)" in err and "fixed train.py (TC505, TC504)" in err, err
    loaders = (folder / "data" / "loaders.py").read_text(encoding="utf-8")
    assert ("    val_loader = DataLoader(val_set, batch_size=batch_size, shuffle=False, "
            "num_workers=workers)\n") in loaders
    assert ("    sampler = DistributedSampler(train_set, shuffle=True) if dist.is_available() and "
            "dist.is_initialized() else None\n") in loaders
    train = (folder / "train.py").read_text(encoding="utf-8")
    assert ('        if hasattr(train_loader.sampler, "set_epoch"):\n'
            "            train_loader.sampler.set_epoch(epoch)\n"
            "        for step, (x, y) in enumerate(train_loader):\n") in train, train
    code, out, err = run_cli("scan", ".", "--select", "TC503,TC504,TC505", "--isolated", "--no-cache", "--no-exec",
                             "--format", "json", cwd=folder)
    assert code == 0 and json.loads(out)["findings"] == [], out


def test_a_datamodule_that_builds_its_loader_in_setup_declines_naming_the_loader(tmp_path):
    """``setup()`` keeps ``self._train = DataLoader(...)`` and ``train_dataloader()`` returns it: the DataLoader
    is not built where the method returns it, so no sampler is placed; declined rather than unsharded."""
    folder = _copy("ddp_datamodule", tmp_path)
    module = folder / "data" / "module.py"
    module.write_text(module.read_text(encoding="utf-8").replace(
        "    def train_dataloader(self):\n"
        "        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)\n",
        "        self._train = DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)\n\n"
        "    def train_dataloader(self):\n        return self._train\n"), encoding="utf-8")
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, ".", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert "train.py:17: TC505 no fix: the training loop iterates `dm.train_dataloader()` (line 17)" in err, err


def test_a_helper_module_whose_fix_cannot_find_the_script_declines_the_conversion(tmp_path, monkeypatch):
    """The sampler in data/module.py is placed by that module's own fix (TC503), which finds the scripts that
    train with its loader by searching the project for their imports, up to a number of files. In a large
    repository the search can stop before it reaches train.py (here: after none): the script is then not
    converted, naming the loader, rather than converted with every rank reading the whole dataset."""
    import tcaudit.project.importers as importers

    folder = _copy("ddp_datamodule", tmp_path)
    monkeypatch.setattr(importers, "MAX_IMPORTERS_LOOKED_AT", 0)
    before = {p: p.read_bytes() for p in folder.rglob("*.py")}
    code, out, err = _fix(folder, ".", "--apply")
    assert {p: p.read_bytes() for p in folder.rglob("*.py")} == before
    assert ("train.py:17: TC505 no fix: the training DataLoader is built by `train_dataloader` (data/module.py:20), "
            "and that module's fix cannot find this script among the project's files that import it (the search "
            "stops after 0 files)") in err, err
