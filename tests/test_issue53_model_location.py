"""Issue 53: where the model lives, and the precision recipe of contrastive models.

A script whose trained models never leave the CPU (graykode/nlp-tutorial's module-level Transformer:
nothing moved anywhere) gets no GPU advice and no GPU patch, also under ``fix --compile``; a script
that may move them keeps its advice. A model with InfoNCE logits divided by a temperature gets bf16
autocast where the GPU has bf16 (fp16's GradScaler skips the first updates at small per-GPU batches,
benchmarks/results/h100/moco_fp16_*.json), and fp16 with a GradScaler where it has not or where the
configuration asks for fp16. The fixtures (fixtures/fix/all_rw_moco, all_rw_nlp_transformer_cpu) are
fixed, compared byte for byte and run by tests/test_fix.py and the oracle (tests/test_oracle.py), and
on a GPU by tests/test_gpu_fp16.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

from helpers import rules_of, scan_code, scan_paths

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"
# The GPU advice a CUDA training script of this shape gets (TC201 autocast, TC305 compile, TC307 fused
# optimizer, TC301 TF32, TC505 DDP, TC601 host sync).
GPU_RULES = {"TC201", "TC301", "TC305", "TC307", "TC505", "TC601"}

CPU_SCRIPT = """
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.table = nn.Embedding.from_pretrained(torch.FloatTensor([[0.0] * 64] * 8))

        def forward(self, x):
            return self.fc(x) + self.table.weight[0]


    model = Net(){prep}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64){move}
    for step in range(4):
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        print("loss", loss)
        loss.backward()
        optimizer.step()
"""


def _cpu_script(prep: str = "", move: str = "") -> str:
    return textwrap.dedent(CPU_SCRIPT).replace("{prep}", prep).replace("{move}", move)


def test_a_model_that_never_leaves_the_cpu_gets_no_gpu_advice(tmp_path):
    # `torch.FloatTensor` is the CPU tensor type: it names no accelerator.
    result = scan_code(tmp_path, _cpu_script())
    assert not GPU_RULES & set(rules_of(result)), rules_of(result)


@pytest.mark.parametrize(
    "prep, move, why",
    [
        (".to(device)", "", "the model is moved to a device the script chooses"),
        ("", ".to(device)", "the data goes to a device: the model must be there too"),
        ("\nmodel.cuda()", "", "moved to CUDA by a method call"),
        ("\nmodel = prepare(model)", "", "handed to a function this file does not show"),
        ("\nmodel = nn.DataParallel(model)", "", "DataParallel puts the model on the first GPU"),
    ],
)
def test_a_model_that_may_leave_the_cpu_keeps_its_advice(tmp_path, prep, move, why):
    # The device comes from the command line: the file names no CUDA.
    header = "import sys\nimport torch.nn as nn\nfrom helpers_elsewhere import prepare\n\ndevice = sys.argv[1]\n"
    code = _cpu_script(prep, move).replace("import torch.nn as nn\n", header)
    assert "TC201" in rules_of(scan_code(tmp_path, code)), why


def test_a_model_built_by_another_modules_factory_is_not_judged(tmp_path):
    # build_model may return `net.cuda()`: this file cannot tell, so the advice stays.
    factory = "import torch.nn as nn\n\ndef build_model():\n    return nn.Linear(64, 64).cuda()\n"
    (tmp_path / "models.py").write_text(factory)
    code = _cpu_script().replace("model = Net()", "from models import build_model\nmodel = build_model()")
    assert "TC201" in rules_of(scan_code(tmp_path, code))


def test_the_graykode_transformer_is_left_as_it_is_by_every_fix(tmp_path):
    """The issue's shape: `fix --compile --ddp` used to compile the CPU model (Inductor's C++ build on a GPU
    machine, other dropout streams) and wrap its step in CUDA autocast that does nothing to CPU tensors."""
    source = FIXTURES / "all_rw_nlp_transformer_cpu.in.py"
    target = tmp_path / "train.py"
    target.write_bytes(source.read_bytes())
    result = fix_file(target, Settings(select=("ALL",), structural_fixes=("compile", "ddp")))
    assert result.error is None
    assert not result.changed, result.diff()
    found = scan_paths([str(target)], root=tmp_path)
    assert not GPU_RULES & set(rules_of(found)), rules_of(found)


# -- contrastive models ---------------------------------------------------------------------------------

MOCO = FIXTURES / "all_rw_moco.in.py"


def _tc201_fix(tmp_path: Path, **settings) -> tuple[str, str]:
    target = tmp_path / "train.py"
    target.write_bytes(MOCO.read_bytes())
    result = scan_paths([str(target)], select=("TC201",), root=tmp_path, **settings)
    (finding,) = result.findings
    fixed = fix_file(target, Settings(select=("TC201",), root=tmp_path, **settings)).fixed
    return finding.message + " " + (finding.explanation or ""), fixed


def test_moco_gets_bf16_without_a_scaler_where_the_gpu_has_bf16(tmp_path):
    text, fixed = _tc201_fix(tmp_path, gpu="H100")
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed
    assert "`self.T` at line 154, a momentum encoder, a queue of past keys" in text, text


@pytest.mark.parametrize(
    "settings", [{"gpu": "T4"}, {"gpu": "H100", "precision": "fp16"}], ids=["no-bf16", "fp16-asked"]
)
def test_moco_gets_fp16_and_a_scaler_where_bf16_is_not_the_choice(tmp_path, settings):
    _, fixed = _tc201_fix(tmp_path, **settings)
    assert "dtype=torch.float16" in fixed and "scaler.scale(loss).backward()" in fixed


@pytest.mark.parametrize(
    "division, contrastive",
    [
        ("logits /= self.T", True),
        ("logits = logits / temperature", True),
        ("logits = logits / args.moco_t", True),
        ("logits = logits / self.tau", True),
        ("logits = logits / math.sqrt(d)", False),  # attention's scale, not a temperature
        ("logits = logits / total", False),
        ("logits = logits / self.warmup_t", False),  # a schedule's length
        ("logits = logits / t", False),  # a loop's step
    ],
)
def test_a_temperature_is_told_from_other_divisions(tmp_path, division, contrastive):
    code = textwrap.dedent(f"""
        import math
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)
                self.T = self.tau = self.warmup_t = 0.07

            def forward(self, x, temperature=0.07, d=8, total=8.0, t=1.0, args=None):
                q = F.normalize(self.conv(x).flatten(1), dim=1)
                logits = q @ q.T
                {division}
                return logits


        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            logits = model(x.cuda())
            loss = F.cross_entropy(logits, torch.arange(len(x), device="cuda"))
            loss.backward()
            optimizer.step()
    """)
    path = tmp_path / "train.py"
    path.write_text(code)
    fixed = fix_file(path, Settings(select=("TC201",), gpu="H100")).fixed
    # A convnet gets fp16 + GradScaler unless its logits are divided by a temperature.
    assert ("dtype=torch.bfloat16" in fixed) is contrastive, fixed


def test_a_sampling_temperature_is_not_a_contrastive_loss(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)

            def forward(self, x):
                return self.conv(x).flatten(1)

            @torch.no_grad()
            def generate(self, x, temperature=0.8):
                logits = self(x) @ self.conv.weight.flatten(1) / temperature
                return logits.argmax(dim=-1)


        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
    """))
    fixed = fix_file(path, Settings(select=("TC201",), gpu="H100")).fixed
    assert "dtype=torch.float16" in fixed, fixed  # the convnet recipe
