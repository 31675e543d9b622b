"""TC411 images-normalized-on-host: what it converts, what it declines (each with its reason), and that
the inserted helper computes exactly what ToTensor() and Normalize() computed. The before/after pairs that
the oracle runs are fixtures/fix/tc411_*; the catalog's examples are rules/TC411.toml."""

from __future__ import annotations

import textwrap

import pytest

from helpers import scan_paths
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

HEAD = '''
import torch
import torchvision.datasets as datasets
import torchvision.transforms as transforms

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
'''
LOOP = '''
for images, target in loader:
    images, target = images.to(device), target.to(device)
    loss = torch.nn.functional.cross_entropy(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''
STATS = "[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]"


def _write(tmp_path, body: str, loop: str = LOOP):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body) + textwrap.dedent(loop), encoding="utf-8")
    return path


def _tc411(path, **settings):
    result = scan_paths([str(path)], select=("TC411",), **settings)
    return [f for f in result.findings if f.rule == "TC411"]


def _reason(path, **settings) -> str | None:
    [finding] = _tc411(path, **settings)
    return None if finding.fix.available else finding.fix.reason


def _fixed(path) -> str:
    result = fix_file(path, Settings(select=("TC411",)))
    assert result.error is None
    return result.fixed


def test_a_lone_to_tensor_becomes_pil_to_tensor_and_the_loop_converts(tmp_path):
    path = _write(tmp_path, '''
        train_set = datasets.FakeData(64, (3, 224, 224), 10, transforms.ToTensor())
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    ''')
    fixed = _fixed(path)
    assert "datasets.FakeData(64, (3, 224, 224), 10, transforms.PILToTensor())" in fixed
    assert "    images = tcaudit_normalize(images)\n" in fixed


def test_a_copy_inside_the_forward_call_is_wrapped(tmp_path):
    path = _write(tmp_path, f'''
        train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    ''', loop='''
        for images, target in loader:
            loss = torch.nn.functional.cross_entropy(model(images.cuda()), target.cuda())
            loss.backward()
            optimizer.step()
    ''')
    fixed = _fixed(path)
    assert f"model(tcaudit_normalize(images.cuda(), {STATS}))" in fixed
    assert "transforms.Compose([transforms.PILToTensor()])" in fixed


def test_an_imported_to_tensor_gets_pil_to_tensor_imported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent('''
        import torch
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import Compose, Normalize, ToTensor

        train_set = ImageFolder("scans", Compose([ToTensor(), Normalize((0.1307,), (0.3081,))]))
        loader = torch.utils.data.DataLoader(train_set, batch_size=64)
        for x, y in loader:
            x = x.cuda()
            loss = model(x, y.cuda())
            loss.backward()
            optimizer.step()
    '''), encoding="utf-8")
    fixed = _fixed(path)
    assert "from torchvision.transforms import PILToTensor" in fixed
    assert 'ImageFolder("scans", Compose([PILToTensor()]))' in fixed
    assert "\n    x = tcaudit_normalize(x, (0.1307,), (0.3081,))\n" in fixed


@pytest.mark.parametrize(
    ("body", "loop", "reason"),
    [
        pytest.param(f'''
            train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
            first, _ = train_set[0]
        ''', LOOP, "`train_set` is used at line 10 beyond its DataLoader", id="dataset-read-elsewhere"),
        pytest.param(f'''
            train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8, collate_fn=my_collate)
        ''', LOOP, "has a `collate_fn`", id="collate-fn"),
        pytest.param('''
            train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize(args.mean, args.std)]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        ''', LOOP, "`Normalize`'s mean is not a list of numbers", id="statistics-at-run-time"),
        pytest.param(f'''
            train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        ''', '''
            for images, target in loader:
                images = mixup(images)
                images, target = images.to(device), target.to(device)
                loss = model(images, target)
                loss.backward()
                optimizer.step()
        ''', "`images` is read at line 12 before it reaches the device as floats", id="read-before-the-copy"),
        pytest.param(f'''
            train_set = datasets.ImageFolder("train", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        ''', '''
            for images, target in loader:
                loss = model(images, target)
                loss.backward()
                optimizer.step()
        ''', "does not copy `images` to the device", id="no-copy"),
        pytest.param(f'''
            if args.dummy:
                train_set = datasets.FakeData(64, (3, 32, 32), 10, transforms.ToTensor())
            else:
                train_set = datasets.ImageFolder("train", transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]))
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        ''', LOOP, "whose transform differs", id="two-pipelines-one-loop"),
        pytest.param(f'''
            train_set = datasets.ImageFolder("train", transforms.Compose([transforms.ToTensor(), transforms.Normalize({STATS})]), loader=read_tiff)
            loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        ''', LOOP, "has its own `loader=`", id="custom-image-loader"),
    ],
)
def test_declined_with_its_reason(tmp_path, body, loop, reason):
    path = _write(tmp_path, body, loop)
    findings = _tc411(path)
    assert findings and all(not f.fix.available and reason in f.fix.reason for f in findings), [
        f.fix.reason for f in findings]
    assert _fixed(path) == path.read_text(encoding="utf-8")


def test_silent_for_v2_transforms_an_eval_pipeline_and_a_cpu_only_script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(f'''
        import torch
        import torchvision.datasets as datasets
        import torchvision.transforms as transforms
        from torchvision.transforms import v2

        train_set = datasets.CIFAR10("data", transform=v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]))
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
        val_set = datasets.CIFAR10("data", train=False, transform=transforms.ToTensor())
        val_loader = torch.utils.data.DataLoader(val_set, batch_size=8)
        for x, y in loader:
            loss = model(x.cuda(), y.cuda())
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.cuda())
    '''), encoding="utf-8")
    assert _tc411(path) == []
    cpu = _write(tmp_path, f'''
        train_set = datasets.ImageFolder("train", transform=transforms.ToTensor())
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    ''', loop=LOOP.replace("images.to(device), target.to(device)", "images, target"))
    cpu.write_text(cpu.read_text().replace('device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n', ""))
    assert _tc411(cpu) == []


def test_under_fix_dali_the_dali_conversion_normalizes_instead(tmp_path):
    path = _write(tmp_path, f'''
        train_set = datasets.ImageFolder("train", transforms.Compose([
            transforms.RandomResizedCrop(224), transforms.ToTensor(), transforms.Normalize({STATS})]))
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    ''')
    assert _reason(path) is None
    result = scan_paths([str(path)], select=("TC405", "TC411"), structural_fixes=("dali",))
    [tc411] = [f for f in result.findings if f.rule == "TC411"]
    assert "`fix --dali` decodes and normalizes" in tc411.fix.reason


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_the_helper_computes_what_to_tensor_and_normalize_computed(mode):
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torchvision.transforms")
    import numpy as np
    from PIL import Image

    from tcaudit.rules.pipeline.tc411_images_normalized_on_host import HELPER, HELPER_CODE

    namespace: dict = {"torch": torch}
    exec(HELPER_CODE, namespace)
    normalize_on_device = namespace[HELPER]
    channels = 3 if mode == "RGB" else 1
    mean, std = [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels]
    rng = np.random.default_rng(1)
    pictures = [Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).convert(mode) for _ in range(4)]
    before = torch.stack([transforms.Normalize(mean, std)(transforms.ToTensor()(p)) for p in pictures])
    after = normalize_on_device(torch.stack([transforms.PILToTensor()(p) for p in pictures]), mean, std)
    assert after.dtype == before.dtype and torch.equal(after, before)
    floats = torch.stack([transforms.ToTensor()(p) for p in pictures])
    assert torch.equal(normalize_on_device(torch.stack([transforms.PILToTensor()(p) for p in pictures])), floats)
    assert normalize_on_device(floats, mean, std) is floats  # another source's float batch passes as it was


@pytest.mark.parametrize(
    ("dataset", "reported"),
    [
        ('datasets.CIFAR10("data", transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize(M, S)]))', False),
        ('datasets.MNIST("data", True, transforms.ToTensor())', False),
        ('datasets.FakeData(64, (3, 32, 32), 10, transforms.ToTensor())', False),
        ('datasets.CIFAR10("data", transform=transforms.Compose([transforms.Resize(224), transforms.ToTensor()]))', True),
        ('datasets.FakeData(64, transform=transforms.ToTensor())', True),  # FakeData's default is 224x224
    ],
)
def test_small_images_are_not_reported(tmp_path, dataset, reported):
    """28x28 and 32x32 datasets make float batches of a few MB: not reported unless the pipeline resizes."""
    path = _write(tmp_path, f"""
        train_set = {dataset.replace("M, S", STATS)}
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    """)
    assert bool(_tc411(path)) is reported


def test_a_batch_taken_whole_and_indexed_is_normalized_where_its_images_are_copied(tmp_path):
    """The CIFAR-10 tutorial's loop (``data[0].to(device)``), here on images resized to 224."""
    path = _write(tmp_path, f'''
        train_set = datasets.CIFAR10("data", transform=transforms.Compose([
            transforms.Resize(224), transforms.ToTensor(), transforms.Normalize({STATS})]))
        loader = torch.utils.data.DataLoader(train_set, batch_size=8)
    ''', loop='''
        for i, data in enumerate(loader, 0):
            inputs, labels = data[0].to(device), data[1].to(device)
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
    ''')
    fixed = _fixed(path)
    assert f"    inputs, labels = data[0].to(device), data[1].to(device)\n    inputs = tcaudit_normalize(inputs, {STATS})\n" in fixed
