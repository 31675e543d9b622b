"""``tcaudit fix --dali`` (TC405): what it converts and declines, that the conversion is invisible to
the other rules, and that the converted scripts train on a folder of JPEGs made here: through DALI's
CPU pipeline where DALI is installed, and through the fallback (the DataLoader as written, on this
machine without a GPU) where it is hidden, with the original's batches and samples per epoch.

The before/after pairs (fixtures/fix/dali_*) and their idempotence run in test_fix.py."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file
from tcaudit.rules.pipeline.tc405_cpu_image_decode import helper_block
from helpers import scan_paths

ROOT = Path(__file__).resolve().parent.parent
FIX_FIXTURES = ROOT / "fixtures" / "fix"
RESNET50 = ROOT / "fixtures" / "resnet50" / "train.py"
MAKE_JPEGS = ROOT / "fixtures" / "resnet50" / "make_jpegs.py"
DALI = Settings(select=("TC405",), structural_fixes=("dali",))
IMAGES, CLASSES = 40, 4

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
needs_dali = pytest.mark.skipif(
    not HAS_DALI, reason="DALI is not installed (pip install -e '.[dali]', Linux x86-64 only)"
)
# Runs a script with ``import nvidia.dali`` failing, as on a machine without DALI.
WITHOUT_DALI = (
    "import runpy, sys; sys.modules['nvidia.dali'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)

HEAD = """\
import torch
import torchvision.transforms as T
from torchvision import datasets
from torch.utils.data import DataLoader

"""
LOOP = """
for epoch in range(3):
    for x, y in loader:
        loss = crit(model(x.cuda()), y.cuda())
        loss.backward()
        opt.step()
"""
AUGMENT = "T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])"


def _fix(tmp_path: Path, code: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return fix_file(path, DALI), path


# -- what is converted, and how -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,edited",
    [
        pytest.param(
            HEAD + f"for x, y in DataLoader(datasets.ImageFolder(root, transform={AUGMENT}), batch_size=32):\n"
            "    loss = crit(model(x.cuda()), y.cuda())\n    loss.backward()\n    opt.step()\n",
            f"for x, y in tcaudit_dali_loader(DataLoader(datasets.ImageFolder(root, transform={AUGMENT}), batch_size=32)):",
            id="iterated-where-built",
        ),
        pytest.param(
            HEAD.rstrip("\n") + "\nloader = DataLoader(datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(224), T.ToTensor()])))\n" + LOOP,
            # Straight after the imports: the block goes between them, two blank lines on either side.
            "from torch.utils.data import DataLoader\n\n\n# -- tcaudit fix --dali",
            id="module-level-after-imports",
        ),
        pytest.param(
            HEAD + "class Trainer:\n    def __init__(self, root):\n"
            f"        self.train_set = datasets.ImageFolder(root, {AUGMENT})\n"
            "        self.train_loader = DataLoader(self.train_set, batch_size=32, shuffle=True)\n\n"
            "    def fit(self):\n        for x, y in self.train_loader:\n"
            "            loss = crit(model(x.cuda()), y.cuda())\n            loss.backward()\n            opt.step()\n",
            "        self.train_loader = tcaudit_dali_loader(self.train_loader)\n",
            id="attribute",
        ),
        pytest.param(
            HEAD + f"augment = {AUGMENT}\nds = datasets.ImageFolder(root, transform=augment)\n"
            "sampler = torch.utils.data.distributed.DistributedSampler(ds) if args.distributed else None\n"
            "loader = DataLoader(ds, batch_size=32, shuffle=(sampler is None), sampler=sampler)\n" + LOOP,
            "loader = DataLoader(ds, batch_size=32, shuffle=(sampler is None), sampler=sampler)\n"
            "loader = tcaudit_dali_loader(loader)\n",
            id="distributed-sampler",
        ),
    ],
)
def test_converted_shapes(tmp_path, code, edited):
    result, path = _fix(tmp_path, code)
    assert result.applied == ["TC405"], result.declined
    assert edited in result.fixed
    assert result.fixed.count("def tcaudit_dali_loader(") == 1
    assert helper_block().rstrip("\n") + "\n\n\n" in result.fixed  # two blank lines after the block
    compile(result.fixed, "train.py", "exec")
    path.write_text(result.fixed, encoding="utf-8")
    again = fix_file(path, DALI)
    assert not again.changed and not [f for f in again.remaining if f.rule == "TC405"]


def test_helper_block_is_the_runtime_module_verbatim():
    assert helper_block() in (FIX_FIXTURES / "dali_imagefolder.out.py").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(import|from)\s+tcaudit", helper_block(), re.MULTILINE)  # self-contained


def test_helper_block_has_no_words_other_rules_read_in_the_text():
    """Some rules read the file's text, comments stripped (TC303: ``channels_last`` anywhere means the
    script has it; TC505: ``LOCAL_RANK`` means it is launched multi-process; TC301: TF32 settings).
    The inserted code must not say them, or it would silence those rules on the user's code."""
    from tcaudit.source.syntax import strip_comments

    code = strip_comments(helper_block())
    words = r"channels_last|LOCAL_RANK|local_rank|world_size|allow_tf32|set_float32_matmul_precision|torchrun"
    assert not re.findall(rf"\b({words})\b", code)


def test_layout_follows_the_scripts_channels_last():
    out = (FIX_FIXTURES / "dali_imagefolder.out.py").read_text(encoding="utf-8")
    assert "    train_loader = tcaudit_dali_loader(train_loader, nhwc=True)\n" in out
    assert "val_loader = tcaudit_dali_loader" not in out  # evaluation stays as written
    inline = (FIX_FIXTURES / "dali_inline_loader.out.py").read_text(encoding="utf-8")
    assert "return tcaudit_dali_loader(DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True))" in inline


def _other_findings(path: Path) -> Counter:
    result = scan_paths([str(path)], select=("ALL",), root=path.parent)
    # Messages may cite line numbers, which the inserted block shifts; the flagged code does not change.
    # TC411 (float images made in the workers) goes with the conversion: DALI normalizes on the GPU.
    return Counter((f.rule, " ".join(f.source_line.split())) for f in result.findings if f.rule not in ("TC405", "TC411"))


def test_conversion_changes_no_other_rules_findings(tmp_path):
    """The inserted code is tcaudit's, not the user's: no rule looks inside it (its DataLoader, its
    ``set_epoch``, its words), and loops over the wrapped loader are still loops over the DataLoader."""
    original = tmp_path / "original.py"
    original.write_bytes(RESNET50.read_bytes())
    converted = tmp_path / "converted.py"
    result = fix_file(original, DALI)
    assert result.applied == ["TC405"]
    converted.write_text(result.fixed, encoding="utf-8")
    assert _other_findings(converted) == _other_findings(original)


def test_full_fix_with_dali_keeps_the_other_fixes(tmp_path):
    """``fix --dali`` with every rule: the loader, autocast and channels_last fixes still land beside it."""
    path = tmp_path / "train.py"
    path.write_bytes(RESNET50.read_bytes())
    code, _, err = run_cli("fix", "--dali", "--apply", str(path))
    assert code in (0, 1), err
    text = path.read_text(encoding="utf-8")
    for expected in (
        "loader = tcaudit_dali_loader(loader, nhwc=True)",  # channels_last batches: TC303 made the model NHWC
        "persistent_workers=True",
        "model = model.to(memory_format=torch.channels_last)",
        "images = images.contiguous(memory_format=torch.channels_last)",
        "with torch.autocast(",
    ):
        assert expected in text, expected
    assert run_cli("fix", "--dali", str(path))[0] == 0  # nothing left to change


# -- what is declined, with the reason ------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,reason",
    [
        pytest.param(
            HEAD + "ds = datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(224), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor()]))\n"
            "loader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "`T.ColorJitter` in the training transform has no counterpart in the DALI conversion",
            id="unknown-transform",
        ),
        pytest.param(
            HEAD.replace("import torchvision.transforms as T", "from torchvision.transforms import v2 as T")
            + "ds = datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(224), T.ToImage(), T.ToDtype(torch.float32, scale=True)]))\n"
            "loader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "`T.ToImage` in the training transform",
            id="v2-to-image",
        ),
        pytest.param(
            HEAD + "ds = datasets.ImageFolder(root, T.Compose([T.RandomHorizontalFlip(), T.RandomResizedCrop(224), T.ToTensor()]))\n"
            "loader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "(RandomHorizontalFlip, RandomResizedCrop, ToTensor) is not RandomResizedCrop",
            id="order",
        ),
        pytest.param(
            HEAD + "ds = datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(224, interpolation=T.InterpolationMode.BICUBIC), T.ToTensor()]))\n"
            "loader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "`RandomResizedCrop(interpolation=...)`",
            id="interpolation",
        ),
        pytest.param(
            HEAD + "ds = datasets.ImageFolder(root, make_transform())\nloader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "the training transform `make_transform()` is not a torchvision `Compose([...])` built here",
            id="transform-from-elsewhere",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT}, target_transform=lambda t: t % 2)\n"
            "loader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "has a `target_transform=`",
            id="target-transform",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\nloader = DataLoader(ds, batch_sampler=buckets)\n" + LOOP,
            "the DataLoader has a `batch_sampler=`",
            id="batch-sampler",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\nloader = DataLoader(ds, batch_size=32, collate_fn=mixup)\n" + LOOP,
            "the DataLoader has a `collate_fn=`",
            id="collate-fn",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\n"
            "loader = DataLoader(ds, batch_size=32, sampler=ClassBalancedSampler(ds))\n" + LOOP,
            "the DataLoader's sampler `ClassBalancedSampler(ds)` is not a random, sequential or distributed one",
            id="custom-sampler",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\nloader = FastLoader(ds, batch_size=32)\n" + LOOP,
            "no training DataLoader over this `ImageFolder` was found",
            id="no-dataloader",
        ),
        pytest.param(
            HEAD + f"train_set = datasets.ImageFolder(root, {AUGMENT})\nval_set = datasets.ImageFolder(root, T.Compose([T.CenterCrop(32), T.ToTensor()]))\n"
            "make_loader = lambda dataset, shuffle: DataLoader(dataset, batch_size=32, shuffle=shuffle)\n"
            "loader = make_loader(train_set, True)\nval_loader = make_loader(val_set, False)\n" + LOOP,
            "the `ImageFolder` reaches its DataLoader through `make_loader(...)`, a helper, lambda or `partial`",
            id="lambda-loader-factory",
        ),
        pytest.param(
            HEAD + f"import functools\ntrain_set = datasets.ImageFolder(root, {AUGMENT})\n"
            "make_loader = functools.partial(DataLoader, batch_size=32, num_workers=4)\nloader = make_loader(train_set, shuffle=True)\n" + LOOP,
            "through `make_loader(...)`",
            id="partial-loader-factory",
        ),
        pytest.param(
            HEAD + "def build_loader(dataset, train):\n    return DataLoader(dataset, batch_size=32, shuffle=train)\n\n"
            f"train_set = datasets.ImageFolder(root, {AUGMENT})\nval_set = datasets.ImageFolder(root, T.Compose([T.CenterCrop(32), T.ToTensor()]))\n"
            "loader = build_loader(train_set, True)\nval_loader = build_loader(val_set, False)\n" + LOOP,
            "through `build_loader(...)`",
            id="helper-loader-shared-with-eval",
        ),
        pytest.param(
            HEAD + f"import functools\nds = datasets.ImageFolder(root, {AUGMENT})\n"
            "loader = DataLoader(ds, batch_size=32, collate_fn=functools.partial(mixup, alpha=0.2))\n" + LOOP,
            "the DataLoader has a `collate_fn=`",
            id="partial-collate",
        ),
        pytest.param(
            HEAD + "def make_transform(train):\n    if train:\n        return T.Compose([T.RandomResizedCrop(224), T.ToTensor()])\n"
            "    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])\n\n"
            "ds = datasets.ImageFolder(root, make_transform(True))\nloader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "`T.Resize` in the training transform has no counterpart",  # the helper's other return is checked too
            id="helper-transform-with-eval-arm",
        ),
        pytest.param(
            HEAD + f"augment = {AUGMENT} if args.light else T.Compose([T.RandomResizedCrop(224), T.ColorJitter(0.4), T.ToTensor()])\n"
            "ds = datasets.ImageFolder(root, augment)\nloader = DataLoader(ds, batch_size=32)\n" + LOOP,
            "`T.ColorJitter` in the training transform",
            id="transform-picked-by-flag",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\nif args.distributed:\n    loader = DataLoader(ds, batch_size=32)\n"
            "loader = DataLoader(ds, batch_size=64, shuffle=True)\n" + LOOP,
            "several DataLoaders read this `ImageFolder`",  # not on opposite arms: both may run
            id="two-loaders-not-exclusive",
        ),
        pytest.param(
            HEAD + f"ds = datasets.ImageFolder(root, {AUGMENT})\nif args.distributed:\n"
            "    loader = DataLoader(ds, batch_size=32, sampler=torch.utils.data.distributed.DistributedSampler(ds))\n"
            "else:\n    loader = DataLoader(ds, batch_size=32, sampler=ClassBalancedSampler(ds))\n" + LOOP,
            "the DataLoader's sampler `ClassBalancedSampler(ds)`",  # every arm's loader is checked
            id="one-arm-custom-sampler",
        ),
        pytest.param(
            "import torch\nfrom PIL import Image\n\nclass Photos(torch.utils.data.Dataset):\n"
            "    def __getitem__(self, i):\n        return Image.open(self.paths[i])\n\n"
            "loader = torch.utils.data.DataLoader(Photos(), batch_size=8)\n" + LOOP,
            "this file's own code decodes the samples (a Dataset or a loader function)",
            id="pil-dataset-report-only",
        ),
    ],
)
def test_declined_with_reason(tmp_path, code, reason):
    result, path = _fix(tmp_path, code)
    assert not result.changed
    reasons = [why for finding, why in result.declined if finding.rule == "TC405"]
    assert len(reasons) == 1 and reason in reasons[0], reasons
    assert [f.rule for f in result.remaining] == ["TC405"]
    # scan said so before: the fix is declined at detection, with the same reason.
    (finding,) = scan_paths([str(path)], select=("TC405",), root=path.parent).findings
    assert finding.fix.available is False and finding.fix.plan is None
    assert finding.fix.reason == reasons[0]


def test_scan_says_which_findings_have_no_fix(tmp_path):
    fixture = FIX_FIXTURES / "dali_declined.in.py"
    result = scan_paths([str(fixture)], select=("TC405",), root=fixture.parent)
    by_line = {f.location.line: f for f in result.findings}
    assert sorted(by_line) == [17, 35]
    assert not by_line[17].fix.available and "Image.open" in by_line[17].message
    # The ImageFolder's conversion is declined at scan, as fix declines it: ColorJitter has no DALI step.
    assert by_line[35].fix.option == "dali" and not by_line[35].fix.available
    assert "`transforms.ColorJitter` in the training transform has no counterpart" in by_line[35].fix.reason


# -- the converted scripts train ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """An ImageFolder of small JPEGs (train/ and val/), made with the ResNet50 fixture's generator."""
    root = tmp_path_factory.mktemp("jpegs")
    for split, count, seed in (("train", IMAGES, 0), ("val", 12, 1)):
        out = root / f"{split}-gen"
        subprocess.run(
            [sys.executable, str(MAKE_JPEGS), str(out), "--images", str(count), "--classes", str(CLASSES),
             "--size", "64x48", "--jobs", "1", "--seed", str(seed)],
            check=True, capture_output=True, timeout=120,
        )
        (out / "train").rename(root / split)
    return root


@pytest.fixture(scope="module")
def originals() -> dict[str, str]:
    """The unconverted fixtures' output, by name: each runs once."""
    return {}


def _run(script: Path, args: list[str], cwd: Path, dali: bool) -> subprocess.CompletedProcess:
    command = [sys.executable, script.name, *args] if dali else [sys.executable, "-c", WITHOUT_DALI, script.name, *args]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _epochs(stdout: str) -> list[tuple[str, str, float]]:
    """(batches, samples, loss) of each ``epoch N batches B samples S loss L`` line."""
    rows = re.findall(r"epoch \d+ batches (\S+) samples (\d+) loss (\S+)", stdout)
    assert rows, stdout
    return [(batches, samples, float(loss)) for batches, samples, loss in rows]


def _same_epochs(original: str, converted: str) -> None:
    before, after = _epochs(original), _epochs(converted)
    assert [row[:2] for row in after] == [row[:2] for row in before]
    assert all(math.isfinite(row[2]) for row in after)


@pytest.mark.slow
@pytest.mark.parametrize("dali", [pytest.param(True, marks=needs_dali, id="dali-cpu"), pytest.param(False, id="no-dali")])
@pytest.mark.parametrize(
    "name,args",
    [
        ("dali_imagefolder", ["--epochs", "2", "--batch-size", "16", "--image-size", "32", "--workers", "0"]),
        ("dali_inline_loader", ["2", "16", "32"]),  # epochs, batch size, image size; drop_last
    ],
)
def test_converted_fixture_trains_like_the_original(jpegs, originals, tmp_path, name, args, dali):
    data = ["--data", str(jpegs)] if name == "dali_imagefolder" else [str(jpegs)]
    if name not in originals:
        original = tmp_path / "original.py"
        original.write_bytes((FIX_FIXTURES / f"{name}.in.py").read_bytes())
        originals[name] = _run(original, data + args, tmp_path, dali=True).stdout
    converted = tmp_path / "converted.py"
    converted.write_bytes((FIX_FIXTURES / f"{name}.out.py").read_bytes())
    after = _run(converted, data + args, tmp_path, dali=dali)
    expected = "DALI, decoding on the CPU (no GPU)" if dali else "kept the DataLoader (no DALI, no GPU)"
    assert f"tcaudit_dali_loader: {expected}" in after.stderr
    _same_epochs(originals[name], after.stdout)


@pytest.mark.slow
@needs_dali
@pytest.mark.parametrize("name", ["dali_flag_arms", "dali_trainer"])
def test_converted_flag_paths_read_the_same_batches(tmp_path, name):
    """The fixtures that make their own JPEGs (the loader built on the arms of flags, in a trainer's
    ``__init__``, beside an evaluation loader): through DALI's CPU pipeline the same batches and
    samples per epoch and the evaluation still runs; with the DataLoader forced (TCAUDIT_INPUT=cpu)
    exactly the original's output, so the wrap sits where the script's own loader is used."""
    fixture = FIX_FIXTURES / f"{name}.in.py"
    args = re.search(r"#\s*run:\s*python\s+\{path\}(.*)", fixture.read_text(encoding="utf-8")).group(1).split()
    original, converted = tmp_path / "original.py", tmp_path / "converted.py"
    original.write_bytes(fixture.read_bytes())
    converted.write_bytes((FIX_FIXTURES / f"{name}.out.py").read_bytes())
    before = _run(original, args, tmp_path, dali=True).stdout
    after = _run(converted, args, tmp_path, dali=True)
    assert "tcaudit_dali_loader: DALI, decoding on the CPU (no GPU)" in after.stderr
    _same_epochs(before, after.stdout)
    assert re.findall(r"epoch \d+ correct", after.stdout) == re.findall(r"epoch \d+ correct", before)
    forced = subprocess.run(
        [sys.executable, converted.name, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TCAUDIT_INPUT": "cpu"},
    )
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert forced.stdout == before


@pytest.mark.slow
@needs_dali
def test_converted_resnet50_trains_through_dali(jpegs, tmp_path):
    """The bundled ResNet50 script after ``tcaudit fix --dali`` (every rule) trains from ``--data`` in
    DALI's CPU mode."""
    script = tmp_path / "train.py"
    script.write_bytes(RESNET50.read_bytes())
    code, _, err = run_cli("fix", "--dali", "--apply", str(script))
    assert code in (0, 1), err
    args = ["--data", str(jpegs), "--epochs", "1", "--steps", "2", "--batch-size", "8", "--image-size", "32",
            "--num-classes", str(CLASSES)]
    proc = _run(script, args, tmp_path, dali=True)
    assert "tcaudit_dali_loader: DALI, decoding on the CPU (no GPU)" in proc.stderr
    losses = [float(x) for x in re.findall(r"step \d+ loss (\S+)", proc.stdout)]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), proc.stdout


# -- the inserted loader itself, in this process --------------------------------------------------------------


def _folder_loader(root: Path, batch_size=16, **loader_args):
    """A DataLoader whose crops are deterministic (the whole 64x48 image, resized to 32x24), so that
    each path's pixels can be compared with the original's."""
    import torchvision.datasets as datasets
    import torchvision.transforms as transforms
    import torch

    transform = transforms.Compose([
        transforms.RandomResizedCrop((24, 32), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3)),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    return torch.utils.data.DataLoader(datasets.ImageFolder(root / "train", transform), batch_size=batch_size, **loader_args)


def _runtime():
    from tcaudit.rewrite import dali_runtime as tc405_dali_runtime

    return tc405_dali_runtime


@pytest.mark.slow
@pytest.mark.parametrize("dali", [pytest.param(True, marks=needs_dali, id="dali-cpu"), pytest.param(False, id="torchvision-cpu")])
@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
def test_batches_match_the_original_pixels(jpegs, monkeypatch, dali, nhwc):
    """Same labels in the same order, pixels within a level or two of 255 of PIL's, the layout asked for.
    Without DALI the torchvision path is made to decode on the CPU (``device="cpu"``): the code the GPU runs."""
    import torch

    if not dali:
        monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    loader = _folder_loader(jpegs)
    converted = _runtime().tcaudit_dali_loader(loader, nhwc=nhwc, device="cpu")
    assert type(converted).__name__ == "TcauditGpuLoader" and ("DALI" in converted.kind) == dali
    assert len(converted) == len(loader) == math.ceil(IMAGES / 16)
    assert converted.dataset is loader.dataset  # the loader's other attributes are still there
    pairs = list(zip(loader, converted))
    assert len(pairs) == len(loader)
    for (images, target), (new_images, new_target) in pairs:
        assert new_target.dtype == torch.int64 and new_target.shape == target.shape
        assert torch.equal(new_target, target)
        assert new_images.shape == images.shape and new_images.dtype == images.dtype
        assert new_images.is_contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        difference = (new_images - images).abs()
        if dali:
            assert difference.max() < 0.05  # 0.0175 seen: one level of 255 over std 0.225
        else:  # roi_align's box-like antialiasing against PIL's triangle filter: 0.13 and 0.019 seen
            assert difference.max() < 0.25 and difference.mean() < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("dali", [pytest.param(True, marks=needs_dali, id="dali-cpu"), pytest.param(False, id="torchvision-cpu")])
@pytest.mark.parametrize("drop_last", [False, True])
def test_each_rank_reads_as_many_batches_as_its_distributed_sampler(jpegs, monkeypatch, dali, drop_last):
    """Under DDP every rank must run the same number of steps. DALI splits the files into shards of
    13, 13 and 14 where the DistributedSampler pads each rank to 14 with repeats; the torchvision path
    keeps the script's sampler."""
    import torch

    if not dali:
        monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    samples = 0
    for rank in range(3):
        sampler = torch.utils.data.DistributedSampler(_folder_loader(jpegs).dataset, num_replicas=3, rank=rank)
        loader = _folder_loader(jpegs, batch_size=8, sampler=sampler, drop_last=drop_last)
        converted = _runtime().tcaudit_dali_loader(loader, device="cpu")
        sizes = [len(target) for _, target in converted]
        assert len(sizes) == len(converted) == len(loader)
        if not dali:
            assert sizes == [len(target) for _, target in loader]
        samples += sum(sizes)
    if dali and not drop_last:
        assert samples == IMAGES  # every file once, none repeated


def test_an_unexpected_transform_keeps_the_loader(jpegs, capsys):
    """The transform is read again at run time: one the conversion did not see keeps the DataLoader."""
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as transforms

    dataset = datasets.ImageFolder(jpegs / "train", transforms.Compose([transforms.CenterCrop(32), transforms.ToTensor()]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=8)
    assert _runtime().tcaudit_dali_loader(loader, device="cpu") is loader
    assert "kept the DataLoader (its dataset, transform or sampler changed)" in capsys.readouterr().err


@needs_dali
def test_dali_that_cannot_run_here_falls_back(jpegs, monkeypatch, capsys):
    """DALI installed but unusable (a driver too old for its CUDA): the next option, not a crash."""
    import nvidia.dali.plugin.pytorch as dali_torch

    def unusable(*args, **kwargs):
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version\n(details)")

    monkeypatch.setattr(dali_torch, "DALIGenericIterator", unusable)
    loader = _folder_loader(jpegs)
    converted = _runtime().tcaudit_dali_loader(loader, device="cpu")
    assert converted.kind == "torchvision, decoding on cpu (the workers read the files)"
    assert "DALI failed: CUDA driver version is insufficient for CUDA runtime version\n" in capsys.readouterr().err
    assert _runtime().tcaudit_dali_loader(loader) is loader  # and with no GPU, the DataLoader itself


# -- the batched decode path (nvjpeg on a GPU), run here on the CPU ---------------------------------------------


def test_crop_boxes_fall_back_like_torchvision():
    """No draw fits (the ratio asks for a crop wider than the image): the centre crop clamped to the
    ratio range, as RandomResizedCrop.get_params returns it."""
    import torch
    from torchvision.transforms import RandomResizedCrop

    image = torch.zeros(3, 48, 64)
    for ratio in ((10.0, 12.0), (0.05, 0.1)):
        expected = RandomResizedCrop.get_params(image, [1.0, 1.0], list(ratio))
        boxes = _runtime().tcaudit_crop_boxes([48, 48], [64, 64], (1.0, 1.0), ratio, torch.Generator().manual_seed(0))
        assert [[int(b[i]) for b in boxes] for i in range(2)] == [list(expected)] * 2


def test_crop_boxes_are_distributed_like_torchvision():
    """Areas and aspect ratios of many boxes against as many of get_params' own, on a wide, a tall and a
    small image; every box inside its image."""
    import torch
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    count, scale, ratio = 2000, (0.08, 1.0), (3 / 4, 4 / 3)
    for height, width in ((375, 500), (500, 333), (40, 30)):
        top, left, h, w = _runtime().tcaudit_crop_boxes([height] * count, [width] * count, scale, ratio,
                                                        torch.Generator().manual_seed(1))
        assert bool((top >= 0).all() and (left >= 0).all() and (h > 0).all() and (w > 0).all())
        assert bool((top + h <= height).all() and (left + w <= width).all())
        image = torch.zeros(3, height, width)
        theirs = torch.tensor([RandomResizedCrop.get_params(image, list(scale), list(ratio)) for _ in range(count)],
                              dtype=torch.float64)
        ours = torch.stack([top, left, h, w], 1).double()
        for column in range(4):  # position and size: means within a few standard errors
            spread = theirs[:, column].std() / count**0.5 * 5 + 0.5
            assert abs(ours[:, column].mean() - theirs[:, column].mean()) < spread, (height, width, column)
        ours_area, theirs_area = (ours[:, 2] * ours[:, 3]).mean(), (theirs[:, 2] * theirs[:, 3]).mean()
        assert abs(ours_area / theirs_area - 1) < 0.05


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    """A folder where the batched JPEG decode cannot take everything: a PNG, a greyscale JPEG, a CMYK
    JPEG, and ordinary RGB JPEGs of two sizes."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    for label in range(2):
        (root / "train" / f"c{label}").mkdir(parents=True)
    for index in range(10):
        size = (64, 48) if index % 2 else (48, 64)
        small = rng.integers(0, 256, size=(size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize(size, Image.BILINEAR)
        folder = root / "train" / f"c{index % 2}"
        if index == 3:
            image.save(folder / f"{index}.png")
        elif index == 4:
            image.convert("L").save(folder / f"{index}.jpg", quality=95)
        elif index == 5:
            image.convert("CMYK").save(folder / f"{index}.jpg", quality=95)
        else:
            image.save(folder / f"{index}.jpg", quality=95)
    return root


def _pil_and_batched(root, transform, batch_size=4, **loader_args):
    import torch
    import torchvision.datasets as datasets

    loader = torch.utils.data.DataLoader(datasets.ImageFolder(root / "train", transform), batch_size=batch_size, **loader_args)
    return loader, _runtime().tcaudit_dali_loader(loader, device="cpu")


@pytest.mark.slow
def test_png_grey_and_cmyk_files_decode_like_pil(odd_files, monkeypatch):
    """Whole-image crops (scale 1, the image's own ratio, no flip): the batched path's pixels against
    PIL's, for files the batched JPEG decode refuses or converts; uint8 out of PILToTensor."""
    import torch
    import torchvision.transforms as transforms

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    transform = transforms.Compose([transforms.RandomResizedCrop((24, 32), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3)),
                                    transforms.PILToTensor()])
    wide = [i for i, (path, _) in enumerate(_pil_and_batched(odd_files, transform)[0].dataset.samples)
            if Path(path).stem in ("1", "3", "5", "7", "9")]
    loader, converted = _pil_and_batched(odd_files, transform, batch_size=10)
    (images, target), = list(loader)
    (new_images, new_target), = list(converted)
    assert new_images.dtype == torch.uint8 and new_images.shape == images.shape
    assert torch.equal(new_target, target)
    difference = (new_images[wide].float() - images[wide].float()).abs()  # the 4:3 ones are whole images
    assert difference.mean() < 3 and difference.max() < 40, (difference.mean(), difference.max())
    for path, _ in loader.dataset.samples:  # grey stays grey: the three channels agree
        if Path(path).stem == "4":
            grey = new_images[[p for p, _ in loader.dataset.samples].index(path)].float()
            assert (grey[0] - grey[1]).abs().max() <= 1 and (grey[1] - grey[2]).abs().max() <= 1


@pytest.mark.slow
def test_random_crops_have_the_statistics_of_the_pil_path(jpegs, monkeypatch):
    """ImageNet's own augmentation (random crop, flip, normalize): per-channel means and spreads of the
    batched path's images against the original's over the folder, same labels in the same order."""
    import torch
    import torchvision.transforms as transforms

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    torch.manual_seed(0)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(32), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    loader, converted = _pil_and_batched(jpegs, transform, batch_size=8)
    assert len(converted) == len(loader)
    before, after = [], []
    for (images, target), (new_images, new_target) in zip(loader, converted):
        assert torch.equal(new_target, target) and new_images.shape == images.shape and new_images.dtype == images.dtype
        before.append(images)
        after.append(new_images)
    before, after = torch.cat(before), torch.cat(after)
    assert (after.mean((0, 2, 3)) - before.mean((0, 2, 3))).abs().max() < 0.1
    assert ((after.std((0, 2, 3)) / before.std((0, 2, 3))) - 1).abs().max() < 0.15
    assert not torch.equal(after[:, :, :, :16], after.flip(-1)[:, :, :, :16])  # not all flipped, not none


@pytest.mark.slow
def test_a_loop_that_stops_early_stops_the_decode_thread(jpegs, monkeypatch):
    import threading

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    converted = _runtime().tcaudit_dali_loader(_folder_loader(jpegs, batch_size=4), device="cpu")
    batches = iter(converted)
    next(batches)
    batches.close()  # what a `break` out of the training loop does
    assert not [t for t in threading.enumerate() if t.name == "tcaudit-decode"]
    assert sum(len(target) for _, target in converted) == IMAGES  # and a new epoch starts from the top


def test_a_file_that_cannot_be_read_fails_the_loop(tmp_path, monkeypatch):
    """An error in the decode thread is raised in the training loop, not swallowed."""
    import torch
    import torchvision.datasets as datasets

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    (tmp_path / "train" / "c0").mkdir(parents=True)
    (tmp_path / "train" / "c0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    import torchvision.transforms as transforms

    dataset = datasets.ImageFolder(tmp_path / "train", transforms.Compose([transforms.RandomResizedCrop(8), transforms.ToTensor()]))
    converted = _runtime().tcaudit_dali_loader(torch.utils.data.DataLoader(dataset, batch_size=2), device="cpu")
    with pytest.raises(RuntimeError):
        list(converted)


@pytest.mark.slow
def test_the_probe_times_each_candidate_and_keeps_the_epoch_whole(jpegs, monkeypatch, capsys):
    """probe=True (on a GPU, the default): each candidate runs a few batches on a throwaway iterator, the
    fastest is kept and named with the rates, and the epoch that follows still has every sample once."""
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    loader = _folder_loader(jpegs, batch_size=8, shuffle=True)
    converted = _runtime().tcaudit_dali_loader(loader, device="cpu", probe=True)
    err = capsys.readouterr().err
    assert re.search(r"the fastest of (nvjpeg|cpu) \d+, (nvjpeg|cpu) \d+ images/s over 4 batches each", err), err
    assert "no dali: DALI is not installed" in err
    seen = [len(target) for _, target in converted]
    assert len(seen) == len(loader) and sum(seen) == IMAGES


@pytest.mark.parametrize(
    "value,expected",
    [("cpu", "the DataLoader as written (TCAUDIT_INPUT=cpu)"),
     ("nvjpeg", "torchvision, decoding on cpu (the workers read the files) (TCAUDIT_INPUT=nvjpeg)")],
)
def test_tcaudit_input_forces_a_pipeline(jpegs, monkeypatch, capsys, value, expected):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    monkeypatch.setenv("TCAUDIT_INPUT", value)
    loader = _folder_loader(jpegs)
    converted = _runtime().tcaudit_dali_loader(loader, device="cpu", probe=True)
    assert (converted is loader) == (value == "cpu")
    assert f"tcaudit_dali_loader: {expected}" in capsys.readouterr().err


@pytest.mark.parametrize("value,message", [("dali", "TCAUDIT_INPUT=dali: DALI is not installed"),
                                           ("gpu", "TCAUDIT_INPUT='gpu': expected dali, nvjpeg or cpu")])
def test_tcaudit_input_that_cannot_be_had_is_an_error(jpegs, monkeypatch, value, message):
    """A forced pipeline that is not there fails loudly: a benchmark must not measure another one."""
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    monkeypatch.setenv("TCAUDIT_INPUT", value)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        _runtime().tcaudit_dali_loader(_folder_loader(jpegs), device="cpu")
