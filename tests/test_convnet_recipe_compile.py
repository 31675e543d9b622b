"""Issue 32 item 5: the convnet recipe under ``fix --compile``. Compiled ResNet50 on an H200 (torch 2.11,
BENCHMARKS.md "Causal attention and the convnet recipe under compile") trained faster with bf16 and fused
SGD (6,533 img/s) than with fp16 + GradScaler + foreach SGD (6,175), and fused SGD under a GradScaler
still went NaN in eager mode. So where TC305 compiles every trained model the convnet gets bf16, no
GradScaler and fused SGD; a plain ``fix`` keeps eager's winner (fp16 + GradScaler, foreach SGD), and so
does a ``--compile`` whose TC305 leaves a trained model eager."""

from __future__ import annotations

import textwrap

from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

SELECT = ("TC201", "TC303", "TC305", "TC307")

CONVNET = textwrap.dedent('''
    import torch
    import torch.nn as nn

    device = "cuda" if torch.cuda.is_available() else "cpu"


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.conv2(x))
            return self.fc(x.mean((2, 3)))


    model = MODEL.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for step in range(3):
        images = torch.randn(8, 3, 32, 32, device=device)
        labels = torch.randint(0, 10, (8,), device=device)
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''')
# Dynamo skips torch.nn's own frames: TC305 declines to compile an ``nn.Sequential``.
SEQUENTIAL = "nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.Flatten(), nn.LazyLinear(10))"


def _fixed(tmp_path, model: str, structural: tuple[str, ...]) -> str:
    path = tmp_path / "train.py"
    path.write_text(CONVNET.replace("MODEL", model), encoding="utf-8")
    result = fix_file(path, Settings(select=SELECT, structural_fixes=structural))
    assert result.error is None
    return result.fixed


def test_a_compiled_convnet_gets_bf16_and_fused_sgd(tmp_path):
    fixed = _fixed(tmp_path, "Net()", ("compile",))
    assert "model.compile()" in fixed
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed
    assert "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)" in fixed
    assert "memory_format=torch.channels_last" in fixed  # channels_last is the convnet's either way


def test_an_eager_convnet_keeps_fp16_with_a_gradscaler_and_foreach_sgd(tmp_path):
    fixed = _fixed(tmp_path, "Net()", ())
    assert "model.compile()" not in fixed
    assert "dtype=torch.float16" in fixed and "scaler.scale(loss).backward()" in fixed
    assert "fused=True" not in fixed


def test_a_convnet_that_compile_leaves_eager_keeps_the_eager_recipe(tmp_path):
    fixed = _fixed(tmp_path, SEQUENTIAL, ("compile",))
    assert ".compile()" not in fixed
    assert "dtype=torch.float16" in fixed and "scaler.scale(loss).backward()" in fixed
    assert "fused=True" not in fixed


def test_the_compiled_recipe_is_what_scan_promises(tmp_path):
    """Scan with the same settings names bf16 for TC201 and offers TC307's fused SGD."""
    from helpers import scan_paths

    path = tmp_path / "train.py"
    path.write_text(CONVNET.replace("MODEL", "Net()"), encoding="utf-8")
    result = scan_paths([str(path)], select=SELECT, structural_fixes=("compile",))
    by_rule = {f.rule: f for f in result.findings}
    assert "bf16 autocast (convnet under torch.compile" in by_rule["TC201"].explanation
    assert by_rule["TC307"].fix is not None and by_rule["TC307"].fix.available


def test_no_autocast_wraps_a_helper_that_reaches_bce_two_calls_down(tmp_path):
    """The forward goes through ``_forward``, which calls ``compute_loss``, which takes BCE on
    probabilities: it raises under autocast (bf16 too), and TC208 cannot take it out of a helper. Where
    TC201 needed no GradScaler (bf16: a compiled convnet, or ``precision = bf16``) it used to wrap the
    ``_forward`` call (the oracle's generated corpus found it, gen07 under ``--ddp --compile``)."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent('''
        import torch
        import torch.nn.functional as F

        device = "cuda" if torch.cuda.is_available() else "cpu"


        def compute_loss(logits, y):
            return F.binary_cross_entropy(torch.sigmoid(logits), y)


        def main():
            model = torch.nn.Linear(8, 1).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

            def _forward(x, y):
                return compute_loss(model(x), y)

            for step in range(3):
                x, y = torch.randn(4, 8), torch.rand(4, 1)
                optimizer.zero_grad()
                loss = _forward(x.to(device), y.to(device))
                loss.backward()
                optimizer.step()


        main()
    '''), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC201", "TC208"), precision="bf16"))
    assert result.error is None and "autocast" not in result.fixed
