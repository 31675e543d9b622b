"""Issue 51, the rough edges a new user meets first: the footer's figure only for the target GPU and never
for a launch-bound finding, ``--gpu`` as people write it, and the items after it (see each test)."""

from __future__ import annotations

import re
import textwrap

import pytest

from conftest import FIXTURES, REPO, run_cli
from tcaudit import gpus
from tcaudit.catalog import load_catalog
from tcaudit.findings import LITTLE_TO_GAIN, Finding, Location, Severity
from tcaudit.report.order import ordered
from tcaudit.report.text_report import top_line

RESNET = str((FIXTURES / "resnet50" / "train.py").relative_to(REPO))


def _footer(*args: str) -> str:
    code, out, err = run_cli("scan", "--no-cache", "--no-exec", *args, cwd=REPO)
    assert code in (0, 1), err
    return out.rstrip("\n").splitlines()[-1]


# -- 1. the footer -----------------------------------------------------------------------------------


def test_the_footer_quotes_the_h200_figure_only_when_the_target_is_the_h200():
    assert _footer("--gpu", "h200", RESNET).endswith("Top: TC201 missing-autocast (fixtures/resnet50/train.py:90), "
                                                     "est. 2.57× measured on H200.")
    for other in ("t4", "rtx3090", "h100"):
        footer = _footer("--gpu", other, RESNET)
        assert footer.endswith("Top: TC201 missing-autocast (fixtures/resnet50/train.py:90)."), (other, footer)
        assert "×" not in footer


def test_the_footer_quotes_no_figure_without_a_known_target(monkeypatch):
    monkeypatch.setattr(gpus, "detected", lambda: None)
    footer = _footer("--gpu", "auto", RESNET)
    assert "×" not in footer and "measured" not in footer


def _launch_bound(rule: str, line: int) -> Finding:
    return Finding(rule=rule, name="missing-autocast", severity=Severity.INFO,
                   location=Location("mnist.py", line, 1, line, 2),
                   message="training step at module level runs forward and loss in fp32 (line 9) "
                           "(a launch-bound model: little to gain)",
                   details={LITTLE_TO_GAIN: "launch-bound"})


def test_a_launch_bound_finding_is_neither_ranked_nor_quoted_by_the_figure_it_discounts():
    rules = load_catalog()
    warnings = [Finding(rule="TC401", name="dataloader-no-workers", severity=Severity.WARNING,
                        location=Location("mnist.py", 4, 1, 4, 2), message="m"),
                Finding(rule="TC402", name="dataloader-no-pin-memory", severity=Severity.WARNING,
                        location=Location("mnist.py", 4, 1, 4, 2), message="m")]
    info = _launch_bound("TC201", 9)
    ranked = ordered([info, *warnings], rules)
    assert [f.rule for f in ranked] == ["TC401", "TC402", "TC201"]
    assert top_line(info, rules, {"setting": "h200"}) == " Top: TC201 missing-autocast (mnist.py:9)."


MNIST = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


device = torch.device("cuda")
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.slow
def test_a_launch_bound_mnist_net_scanned_for_the_h200_quotes_no_figure(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "mnist.py"
    script.write_text(MNIST.lstrip("\n"), encoding="utf-8")
    code, out, err = run_cli("scan", "--no-cache", "--gpu", "h200", "--select", "TC1,TC201,TC401,TC402",
                             "--format", "concise", str(script), cwd=tmp_path)
    assert code == 1, err
    assert "TC201" in out and "launch-bound" in out, out
    assert [line.split()[1] for line in out.splitlines() if re.match(r"\S+:\d+:\d+: TC\d+", line)][-1] == "TC201"
    code, out, err = run_cli("scan", "--no-cache", "--gpu", "h200", "--select", "TC1,TC201,TC401,TC402", str(script),
                             cwd=tmp_path)
    footer = out.rstrip("\n").splitlines()[-1]
    assert "Top: TC401" in footer and "×" not in footer, footer


@pytest.mark.parametrize("written, key", [("3090", "rtx3090"), ("RTX 3090", "rtx3090"), ("rtx-3090", "rtx3090"),
                                          ("NVIDIA H100", "h100"), ("Tesla T4", "t4"), ("sm_90", "sm_90"),
                                          ("GeForce RTX 4090", "rtx4090"), ("A100", "a100")])
def test_gpu_names_as_people_write_them(written, key):
    assert gpus.canonical(written) == key


def test_gpu_3090_is_accepted_and_an_unknown_gpu_is_one_line():
    assert _footer("--gpu", "3090", RESNET).endswith("(fixtures/resnet50/train.py:90).")
    code, out, err = run_cli("scan", "--no-cache", "--no-exec", "--gpu", "3090x", RESNET, cwd=REPO)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tcaudit: error: argument --gpu: unknown GPU '3090x' (one of auto, sm_70"), err


def test_gpu_3090_in_the_config(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\ngpu = "RTX 3090"\n', encoding="utf-8")
    (tmp_path / "train.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = run_cli("scan", "--no-cache", "--show-settings", "train.py", cwd=tmp_path)
    assert code == 0, err
    assert re.search(r"gpu\W+rtx3090", out), out
