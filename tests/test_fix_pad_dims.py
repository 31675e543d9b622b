"""``fix --pad-dims`` (TC101/TC102's script halves, tcaudit/rules/graph/widths.py): which widths are
padded and where, which are declined and why, and that without the opt-in nothing is edited."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from helpers import scan_code
from tcaudit.config import Settings, load_settings
from tcaudit.rules.graph.widths import one_width_finding
from tcaudit.findings import Finding, Fix, FixClass, Location, Severity
from tcaudit.fix.engine import fix_file

FIX_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"
PAD_FIXTURES = sorted(FIX_FIXTURES.glob("pad_*.in.py"))
PADDED = Settings(select=("TC101", "TC102"), pad_dims=True)


def _fix(tmp_path: Path, code: str, settings: Settings = PADDED):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return fix_file(path, settings)


def _changed_lines(result) -> list[str]:
    return [line for line in result.diff().splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_the_mlp_hidden_default_is_padded_and_nothing_else():
    result = fix_file(FIX_FIXTURES / "pad_mlp_hidden.in.py", PADDED)
    assert result.applied == ["TC101"]
    assert _changed_lines(result) == [
        '-parser.add_argument("--hidden", type=int, default=500)',
        '+parser.add_argument("--hidden", type=int, default=512)',
    ]


def test_the_convnet_channels_are_padded_through_the_norm():
    result = fix_file(FIX_FIXTURES / "pad_convnet_channels.in.py", PADDED)
    assert result.applied == ["TC102"]
    assert _changed_lines(result) == [
        "-    nn.Conv2d(32, 30, 3, padding=1, bias=False),",
        "-    nn.BatchNorm2d(30),",
        "+    nn.Conv2d(32, 32, 3, padding=1, bias=False),",
        "+    nn.BatchNorm2d(32),",
        "-    nn.Conv2d(30, 64, 3, padding=1),",
        "+    nn.Conv2d(32, 64, 3, padding=1),",
    ]


@pytest.mark.parametrize("path", PAD_FIXTURES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_without_the_opt_in_nothing_is_edited_or_declined(path):
    for settings in (Settings(select=("TC101", "TC102")), Settings(select=("ALL",))):
        padded_only = fix_file(path, settings)
        assert not any(f.rule in ("TC101", "TC102") for f, _ in padded_only.declined)
        assert "TC101" not in padded_only.applied and "TC102" not in padded_only.applied


def test_scan_reports_the_script_half_only_when_asked(tmp_path):
    """Without ``pad-dims`` scan's output is what it was: the model audit's findings alone."""
    code = (FIX_FIXTURES / "pad_mlp_hidden.in.py").read_text()
    assert not scan_code(tmp_path, code, select=("TC101", "TC102")).findings
    [finding] = scan_code(tmp_path, code, select=("TC101",), pad_dims=True).findings
    assert finding.location.line == 12 and finding.details == {"width": 500, "suggested": 512}
    assert finding.fix.option == "pad-dims" and finding.fix.fix_class is FixClass.NUMERICS
    assert finding.fix.available and not finding.fix.applies_by_default
    assert finding.fix.description == "pad `--hidden` 500 → 512"
    assert finding.fix.enabled(frozenset({FixClass.NUMERICS}), ("pad-dims",))
    assert not finding.fix.enabled(frozenset({FixClass.NUMERICS}), ())
    assert not finding.fix.enabled(frozenset({FixClass.SAFE}), ("pad-dims",))


def test_cli_flag_and_config_key(tmp_path):
    target = tmp_path / "train.py"
    target.write_bytes((FIX_FIXTURES / "pad_mlp_hidden.in.py").read_bytes())
    code, out, err = run_cli("fix", str(target), "--select", "TC101", "--color", "never", "--isolated")
    assert (code, out) == (0, "") and "TC101" not in err
    code, out, err = run_cli("fix", str(target), "--select", "TC101", "--pad-dims", "--color", "never", "--isolated")
    assert code == 1 and "+parser.add_argument(\"--hidden\", type=int, default=512)" in out
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\npad-dims = true\n", encoding="utf-8")
    assert load_settings([str(target)]).pad_dims is True
    code, out, err = run_cli("fix", str(target), "--select", "TC101", "--color", "never", cwd=tmp_path)
    assert code == 1 and "default=512" in out


def test_the_declined_fixtures_say_why():
    checkpoint = fix_file(FIX_FIXTURES / "pad_checkpoint_declined.in.py", PADDED)
    assert not checkpoint.changed
    assert [reason for _, reason in checkpoint.declined] == [
        "the file loads weights (`model.load_state_dict(...)` at line 23) whose tensors have the width 500; "
        "pad by hand or not at all"
    ]
    input_width = fix_file(FIX_FIXTURES / "pad_input_width_declined.in.py", PADDED)
    assert not input_width.changed
    assert [reason for _, reason in input_width.declined] == [
        "`WIDTH` is the model's input width (`nn.Linear(WIDTH, WIDTH)`, line 21): the data has that many "
        "features; it is not padded"
    ]


_TRAIN = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""
_HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@pytest.mark.parametrize(
    "body,reason",
    [
        # the width also shapes a tensor outside the layers
        ("H = 500\nmodel = nn.Sequential(nn.Linear(784, H), nn.ReLU(), nn.Linear(H, 10))\nbuf = torch.zeros(H)\n",
         "`H` also feeds `torch.zeros(H)` (line 6), not only layer widths"),
        # computed from another width
        ("DIM = 125\nH = 4 * DIM\nmodel = nn.Sequential(nn.Linear(784, H), nn.ReLU(), nn.Linear(H, 10))\n",
         "`H` is computed (`4 * DIM`)"),
        # the last layer's output: the loss sees it
        ("H = 500\nmodel = nn.Sequential(nn.Linear(784, H), nn.ReLU(), nn.Linear(H, H))\n",
         "`H` is the model's output width (`nn.Linear(H, H)`, line 5): the loss sees that many features"),
        # GroupNorm(3, ...) would not divide 32
        ("C = 30\nmodel = nn.Sequential(nn.Conv2d(3, C, 3), nn.GroupNorm(3, C), nn.Conv2d(C, 64, 3))\n",
         "`nn.GroupNorm(3, C)` (line 5) splits the width into groups that would not divide 32"),
        # a depthwise convolution takes its groups from the width
        ("C = 30\nmodel = nn.Sequential(nn.Conv2d(3, C, 3), nn.Conv2d(C, C, 3, groups=C), nn.Conv2d(C, 64, 1))\n",
         "`C` also feeds `nn.Conv2d(C, C, 3, groups=C)`"),
        # an inline literal written again in a shape
        ("model = nn.Sequential(nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 10))\nh = torch.zeros(8, 500)\n",
         "the width 500 is also written in `torch.zeros(8, 500)` (line 5)"),
    ],
)
def test_declined_with_the_reason(tmp_path, body, reason):
    result = _fix(tmp_path, _HEAD + body + _TRAIN)
    assert not result.changed, result.diff()
    assert any(reason in why for _, why in result.declined), result.declined


def test_a_model_class_of_another_file_is_declined(tmp_path):
    result = _fix(tmp_path, _HEAD + "from mymodels import Net\nH = 500\nmodel = nn.Sequential(nn.Linear(784, H), "
                  "nn.ReLU(), nn.Linear(H, 10))\nother = Net(H)\n" + _TRAIN)
    assert not result.changed
    assert any("`Net`, a model class defined in another file" in why for _, why in result.declined)


@pytest.mark.parametrize(
    "body",
    [
        # aligned (a multiple of 8): TC101's model half would not report it either
        "H = 1000\nmodel = nn.Sequential(nn.Linear(784, H), nn.ReLU(), nn.Linear(H, 10))\n",
        # only the number of classes (the output) and the input: no internal width
        "model = nn.Sequential(nn.Linear(100, 512), nn.ReLU(), nn.Linear(512, 10))\n",
        # an embedding's width is not a layer width this fix follows, and the vocabulary is TC104's
        "vocab_size = 1001\nmodel = nn.Sequential(nn.Embedding(vocab_size, 64), nn.Linear(64, vocab_size))\n",
    ],
)
def test_not_reported(tmp_path, body):
    assert not scan_code(tmp_path, _HEAD + body + _TRAIN, select=("TC101", "TC102"), pad_dims=True).findings


def test_a_class_parameter_default_and_forward_order(tmp_path):
    result = _fix(tmp_path, _HEAD + '''
class Net(nn.Module):
    def __init__(self, width=60):
        super().__init__()
        self.head = nn.Linear(width, 10)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x):
        x = self.conv2(torch.relu(self.bn(self.conv1(x))))
        return self.head(x.mean((2, 3)))


model = Net()
''' + _TRAIN)
    assert result.applied == ["TC102"], result.declined
    assert _changed_lines(result) == ["-    def __init__(self, width=60):", "+    def __init__(self, width=64):"]


def _finding(rule: str, line: int, details: dict, fix: Fix | None = None) -> Finding:
    return Finding(rule, "x", Severity.WARNING, Location("train.py", line, 1, line, 2), "m", fix, details)


def test_one_finding_per_width_with_the_model_audit():
    offered = _finding("TC101", 3, {"width": 500, "suggested": 512}, Fix(FixClass.NUMERICS, "pad", option="pad-dims"))
    up = _finding("TC101", 9, {"k": 784, "n": 500, "suggested": {"N": 512}, "unaligned": {"N": 500}})
    down = _finding("TC101", 10, {"k": 500, "n": 10, "suggested": {"K": 512, "N": 16}, "unaligned": {"K": 500, "N": 10}})
    script, model = one_width_finding([offered], [up, down])
    assert script == [offered] and model == [down]  # the head's N=10 is its own finding

    declined = _finding("TC101", 3, {"width": 500, "suggested": 512},
                        Fix(FixClass.NUMERICS, "pad", available=False, reason="checkpoint", option="pad-dims"))
    up = _finding("TC101", 9, {"k": 784, "n": 500, "suggested": {"N": 512}, "unaligned": {"N": 500}})
    script, model = one_width_finding([declined], [up])
    assert script == [] and model == [up] and up.fix.reason == "checkpoint"


def test_verify_takes_the_flag_and_hands_it_to_the_fix_it_runs():
    """``verify --pad-dims`` patches with the padding (its settings carry it to fix_file) and says so in
    the command it records."""
    import argparse

    from tcaudit.cli.fix import with_structural_flags
    from tcaudit.cli.verify import add_verify_parser

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_verify_parser(sub, lambda p: None)
    args = parser.parse_args(["verify", "train.py", "--pad-dims", "--compile"])
    settings = with_structural_flags(Settings(), args)
    assert settings.pad_dims and settings.structural_fixes == ("compile",)
    assert settings.fix_options == ("compile", "pad-dims")
    assert not with_structural_flags(Settings(), parser.parse_args(["verify", "train.py"])).pad_dims
