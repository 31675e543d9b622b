"""Issue 51, the rough edges a new user meets first: the footer's figure only for the target GPU and never
for a launch-bound finding, ``--gpu`` as people write it, and the items after it (see each test)."""

from __future__ import annotations

import re
from pathlib import Path

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
    assert err.count("\n") == 1, err
    assert err.startswith("tcaudit: error: argument --gpu: unknown GPU '3090x' (one of auto, sm_70"), err


def test_gpu_3090_in_the_config(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\ngpu = "RTX 3090"\n', encoding="utf-8")
    (tmp_path / "train.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = run_cli("scan", "--no-cache", "--show-settings", "train.py", cwd=tmp_path)
    assert code == 0, err
    assert re.search(r"gpu\W+rtx3090", out), out


# -- 3. notebooks as users write them ------------------------------------------------------------------


def _notebook(path, cells: list[tuple[str, str]]):
    import json

    data = {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": source,
                       **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                      for i, (kind, source) in enumerate(cells)],
            "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


# A Colab-style notebook: shell lines and captures, a timing capture, help syntax, a %%bash cell, markdown.
COLAB = [
    ("markdown", "# Colab: FashionMNIST"),
    ("code", "!nvidia-smi\nfiles = !ls\nimport os\nimport torch\nfrom torch import nn\n"),
    ("markdown", "Some text"),
    ("code", "%%bash\necho hi\n"),
    ("code", "torch.randn?\nt = %time torch.randn(2)\nmodel = nn.Linear(32, 10).cuda()\n"
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"),
    ("code", "import sys\nfor x, y in loader:\n    x, y = x.cuda(), y.cuda()\n"
             "    loss = nn.functional.cross_entropy(model(x), y)\n    optimizer.zero_grad()\n    loss.backward()\n"
             "    optimizer.step()\n"),
]
# `ruff check --isolated --select F401 --output-format concise colab.ipynb`, ruff 0.17.6, on COLAB: ruff parses
# the IPython lines and numbers the notebook's cells counting the markdown ones.
RUFF_0_17_6 = ["colab.ipynb:cell 2:3:8: F401 [*] `os` imported but unused",
               "colab.ipynb:cell 6:1:8: F401 [*] `sys` imported but unused"]


def _ruff() -> str | None:
    import shutil
    import subprocess

    for candidate in ("/tmp/ruffpkg/bin/ruff", shutil.which("ruff")):
        if candidate and Path(candidate).is_file():
            version = subprocess.run([candidate, "--version"], capture_output=True, text=True).stdout.split()
            if version[-1:] == ["0.17.6"]:
                return candidate
    return None


def test_ipython_captures_help_and_cell_magics_leave_the_rest_of_the_notebook_read(tmp_path):
    path = _notebook(tmp_path / "colab.ipynb", COLAB)
    code, out, err = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "concise", "colab.ipynb",
                             cwd=tmp_path)
    assert code == 1, err
    rows = {f"{m[1]} {m[2]}" for m in re.finditer(r"^colab\.ipynb:(cell \d+:\d+:\d+): (TC\d+)", out, re.M)}
    assert "TC000" not in out
    assert {"cell 6:4:5 TC201", "cell 5:4:13 TC307", "cell 6:2:1 TC505"} <= rows, out
    assert "files = !ls" in path.read_text(encoding="utf-8")  # (a scan writes nothing)


def test_cells_are_numbered_as_ruff_numbers_them(tmp_path):
    import subprocess

    _notebook(tmp_path / "colab.ipynb", COLAB)
    ruff = _ruff()
    if ruff is not None:  # the recorded output is still ruff's
        found = subprocess.run([ruff, "check", "--isolated", "--select", "F401", "--output-format", "concise",
                                "--no-cache", "colab.ipynb"], capture_output=True, text=True, cwd=tmp_path).stdout
        assert [line for line in found.splitlines() if "F401" in line] == RUFF_0_17_6
    ruff_cells = {line.split(":")[1] + ":" + line.split(":")[2] for line in RUFF_0_17_6}  # "cell 2:3", "cell 6:1"
    _, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", "colab.ipynb",
                        cwd=tmp_path)
    import json

    ours = {(f["cell"], f["line"]) for f in json.loads(out)["findings"]}
    assert (6, 4) in ours and (5, 4) in ours  # the loop's forward in the sixth cell, the optimizer in the fifth
    assert ruff_cells == {"cell 2:3", "cell 6:1"}  # `import os` in cell 2 as ruff counts: the first code cell


CPU_NOTEBOOK = [
    ("markdown", "# 03. Computer vision"),
    ("code", "import torch\nfrom torch import nn\nfrom torchvision import datasets\nfrom torchvision.transforms import "
             "ToTensor\nfrom torch.utils.data import DataLoader\n"),
    ("code", "train_data = datasets.FashionMNIST(root=\"data\", train=True, download=True, transform=ToTensor())\n"
             "class_names = train_data.classes\n"
             "train_dataloader = DataLoader(train_data, batch_size=32, shuffle=True)\n"),
    ("markdown", "## Model 0: a baseline on the CPU"),
    ("code", "class FashionMNISTModelV0(nn.Module):\n    def __init__(self, input_shape, hidden_units, output_shape):\n"
             "        super().__init__()\n"
             "        self.layer_stack = nn.Sequential(nn.Flatten(), nn.Linear(input_shape, "
             "hidden_units), nn.Linear(hidden_units, output_shape))\n\n    def forward(self, x):\n"
             "        return self.layer_stack(x)\n\n\ntorch.manual_seed(42)\n"
             "model_0 = FashionMNISTModelV0(input_shape=784, hidden_units=10, "
             "output_shape=len(class_names)).to(\"cpu\")\n"),
    ("code", "loss_fn = nn.CrossEntropyLoss()\noptimizer = torch.optim.SGD(params=model_0.parameters(), lr=0.1)\n"),
    ("code", "for epoch in range(3):\n    train_loss = 0\n    for batch, (X, y) in enumerate(train_dataloader):\n"
             "        model_0.train()\n        y_pred = model_0(X)\n        loss = loss_fn(y_pred, y)\n"
             "        train_loss += loss\n        optimizer.zero_grad()\n        loss.backward()\n"
             "        optimizer.step()\n"),
    ("markdown", "## Device-agnostic code"),
    ("code", "device = \"cuda\" if torch.cuda.is_available() else \"cpu\"\ndevice\n"),
]


def _rules(tmp_path, name: str) -> set[str]:
    import json

    code, out, err = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", name, cwd=tmp_path)
    assert code in (0, 1), err
    return {f["rule"] for f in json.loads(out)["findings"]}


def test_a_notebook_model_kept_on_the_cpu_on_purpose_gets_no_gpu_advice(tmp_path):
    _notebook(tmp_path / "cpu.ipynb", CPU_NOTEBOOK)
    assert not _rules(tmp_path, "cpu.ipynb") & {"TC201", "TC505", "TC402", "TC307", "TC301", "TC305"}
    # near miss: the same notebook moving the model to `device` keeps it
    moved = [(kind, source.replace('.to("cpu")', ".to(device)")) for kind, source in CPU_NOTEBOOK]
    moved.insert(2, moved.pop())  # the device cell before the model's
    _notebook(tmp_path / "gpu.ipynb", moved)
    assert {"TC201", "TC505", "TC402"} <= _rules(tmp_path, "gpu.ipynb")


def test_a_script_with_one_cpu_model_and_one_cuda_model_keeps_the_advice(write):
    path = write("""
        import torch
        from torch import nn
        small = nn.Linear(8, 8).to("cpu")
        big = nn.Linear(8, 8).cuda()
        optimizer = torch.optim.SGD(list(small.parameters()) + list(big.parameters()), lr=0.1)
        opt_small = torch.optim.SGD(small.parameters(), lr=0.1)
        opt_big = torch.optim.SGD(big.parameters(), lr=0.1)
        for x, y in loader:
            loss = (big(x.cuda()) - y.cuda()).pow(2).mean()
            opt_big.zero_grad()
            loss.backward()
            opt_big.step()
    """)
    assert "TC201" in _rules(path.parent, path.name)


def test_tc401_in_a_notebook_declines_for_what_a_notebook_can_break(tmp_path):
    import json

    moved = [(kind, source.replace('.to("cpu")', ".to(device)")) for kind, source in CPU_NOTEBOOK]
    moved.insert(2, moved.pop())
    custom = list(moved)
    custom[3] = ("code", "from torch.utils.data import Dataset\n\n\nclass Noise(Dataset):\n    def __len__(self):\n"
                         "        return 64\n\n    def __getitem__(self, i):\n"
                         "        return torch.randn(1, 28, 28), i % 10\n\n\n"
                         "train_data = Noise()\nclass_names = list(range(10))\n"
                         "train_dataloader = DataLoader(train_data, batch_size=32, shuffle=True)\n")

    def tc401(cells) -> dict:
        _notebook(tmp_path / "nb.ipynb", cells)
        _, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", "--select", "TC401",
                            "nb.ipynb", cwd=tmp_path)
        [finding] = json.loads(out)["findings"]
        return finding["fix"]

    fix = tc401(custom)
    assert not fix["available"] and "__main__" not in fix["reason"]
    assert fix["reason"].startswith("in a notebook, worker processes started with spawn/forkserver (Windows, macOS, "
                                    "Linux from Python 3.14) cannot load `Noise`, defined in its cells")
    # a torchvision dataset pickles by reference: workers can load it, and a notebook needs no guard
    assert tc401(moved)["available"]


# -- 4. comments stay on their lines when a keyword is added to a multi-line call ----------------------

COMMENTED_LOADER = '''\
import torch
from torch import nn


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=16, # how many samples per batch?
        shuffle=True # shuffle data every epoch?
    )
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("done", loss.item() > 0)


if __name__ == "__main__":
    main()
'''
COMMENTED_LOADER_FIXED = COMMENTED_LOADER.replace(
    "        shuffle=True # shuffle data every epoch?\n",
    "        shuffle=True, # shuffle data every epoch?\n        pin_memory=True\n",
).replace("x, y = x.to(device), y.to(device)",
          "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)")


def test_a_keyword_added_to_a_multi_line_call_leaves_each_comment_on_its_argument(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "train.py"
    path.write_text(COMMENTED_LOADER, encoding="utf-8")
    code, _, err = run_cli("fix", "--apply", "--no-cache", "--isolated", "--select", "TC402,TC403", "train.py",
                           cwd=tmp_path)
    assert path.read_text(encoding="utf-8") == COMMENTED_LOADER_FIXED, err
    if importlib_util_find_spec("torch"):
        run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert run.returncode == 0 and run.stdout.strip() == "done True", run.stderr


@pytest.mark.parametrize("before, after", [
    # a trailing comma and comments: each stays on its argument's line, the new one has none
    ("f(\n    a,\n    b=1,  # the b\n    c=2,  # the c\n)\n",
     "f(\n    a,\n    b=1,  # the b\n    c=2,  # the c\n    key=True,\n)\n"),
    # the separator copied for the new argument's line is the line break without b's comment
    ("f(\n    a,\n    b=1,  # the b\n    c=2\n)\n", "f(\n    a,\n    b=1,  # the b\n    c=2,\n    key=True\n)\n"),
    # a comment line between arguments stays where it is
    ("f(\n    a,  # the a\n    # about c\n    c=2  # the c\n)\n",
     "f(\n    a,  # the a\n    # about c\n    c=2,  # the c\n    key=True\n)\n"),
    # a one-line call stays one line
    ("f(a, b=1)\n", "f(a, b=1, key=True)\n"),
    # arguments hanging after the open parenthesis
    ("f(a, b=1,  # the b\n  c=2)\n", "f(a, b=1,  # the b\n  c=2,\n  key=True)\n"),
])
def test_add_keyword_keeps_comments_with_their_arguments(before, after):
    import libcst as cst

    from tcaudit.rewrite.edits import add_keyword

    module = cst.parse_module(before)
    call = module.body[0].body[0].value
    new = module.deep_replace(call, add_keyword(call, "key", cst.Name("True")))
    assert new.code == after


def importlib_util_find_spec(name: str):
    import importlib.util

    return importlib.util.find_spec(name)


# -- 5. exit codes and positions of fix, declines about this model ------------------------------------------

# A module-level script: TC401's workers fix is declined (no __main__ guard) while TC301 inserts lines above it.
UNGUARDED = '''\
import torch
from torch import nn
from torchvision import datasets, transforms

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = datasets.FakeData(size=64, image_size=(3, 8, 8), num_classes=2, transform=transforms.ToTensor())
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Flatten(), nn.Linear(192, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done", loss.item() > 0)
'''
# `ruff check --fix`, ruff 0.17.6 (observed): exit 1 while violations remain after fixing ("Found 2 errors (1
# fixed, 1 remaining)"), 0 when all were fixed; the same for `ruff check --fix -`; --exit-zero gives 0.
RUFF_FIX_EXIT = {"remaining": 1, "all fixed": 0}


def test_fix_apply_exits_1_while_findings_remain_as_ruff_check_fix(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(UNGUARDED, encoding="utf-8")
    code, _, err = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "concise", "train.py",
                           cwd=tmp_path)
    assert code == 1 and "train.py:7:10: TC401" in _, err
    code, _, err = run_cli("fix", "--apply", "--no-cache", "--no-exec", "--isolated", "train.py", cwd=tmp_path)
    assert code == RUFF_FIX_EXIT["remaining"], err
    # the decline at the line scan gave (7), not at the fixed text's (below TC301's inserted lines)
    assert "train.py:7: TC401 no fix: the script has no `if __name" in err, err
    fixed = path.read_text(encoding="utf-8").splitlines()
    assert next(i for i, line in enumerate(fixed, 1) if line.startswith("loader = ")) == 9
    assert run_cli("fix", "--apply", "--no-cache", "--no-exec", "--isolated", "--exit-zero", "train.py",
                   cwd=tmp_path)[0] == 0
    assert run_cli("fix", "--apply", "--no-cache", "--no-exec", "--isolated", "--fail-on", "error", "train.py",
                   cwd=tmp_path)[0] == 0
    # a file whose findings are all fixed (what is left is info): 0
    clean = tmp_path / "clean.py"
    clean.write_text(COMMENTED_LOADER, encoding="utf-8")
    code, _, err = run_cli("fix", "--apply", "--no-cache", "--no-exec", "--isolated", "clean.py", cwd=tmp_path)
    assert code == RUFF_FIX_EXIT["all fixed"], err
    assert run_cli("scan", "--no-cache", "--no-exec", "--isolated", "clean.py", cwd=tmp_path)[0] == 0


def test_fix_apply_with_the_cache_keeps_the_exit_code(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(UNGUARDED, encoding="utf-8")
    first = run_cli("fix", "--no-exec", "--isolated", "train.py", cwd=tmp_path)
    second = run_cli("fix", "--no-exec", "--isolated", "train.py", cwd=tmp_path)  # answered from the cache
    assert first == second and first[0] == 1
    assert run_cli("fix", "--apply", "--no-exec", "--isolated", "train.py", cwd=tmp_path)[0] == 1


def test_fix_stdin_exits_as_ruff_check_fix_stdin(tmp_path, monkeypatch):
    import io
    import sys

    for text, expected in ((UNGUARDED, RUFF_FIX_EXIT["remaining"]), (COMMENTED_LOADER, RUFF_FIX_EXIT["all fixed"])):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
        code, out, err = run_cli("fix", "--isolated", "-", cwd=tmp_path)
        assert code == expected, err
        assert "torch.set_float32_matmul_precision" in out
        if expected:
            assert "-:7: TC401 no fix" in err, err


def test_a_notebook_decline_names_the_cell_of_the_original_text(tmp_path):
    """The known bug: a reason naming a line of the text after TC301 put lines into the first cell named the
    wrong cell ("cell 3:1" for the line that is the third cell's second)."""
    import shutil

    shutil.copytree(FIXTURES / "projects" / "notebook_settings", tmp_path / "nb")
    _, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", "--select", "TC401",
                        "train.ipynb", cwd=tmp_path / "nb")
    import json

    [finding] = json.loads(out)["findings"]
    related = finding["related"][0]
    place = f"train.ipynb:cell {related['cell']}:{related['line']}"
    assert place == "train.ipynb:cell 3:2"
    code, _, err = run_cli("fix", "--no-cache", "--no-exec", "--isolated", "train.ipynb", cwd=tmp_path / "nb")
    assert code == 1 and "torch.set_float32_matmul_precision" in _
    [line] = [line for line in err.splitlines() if "TC401 no fix" in line]
    assert line.startswith(f"train.ipynb:cell {finding['cell']}:{finding['line']}: ") and f"({place})" in line, line


def test_the_fused_sgd_decline_says_what_applies_here_and_the_explanation_cites_the_run(tmp_path):
    import json

    path = tmp_path / "train.py"
    path.write_text(UNGUARDED.replace("optimizer.step()", "scaler.step(optimizer)\n    scaler.update()")
                    .replace("    loss.backward()", "    scaler.scale(loss).backward()")
                    .replace("optimizer = torch", "scaler = torch.amp.GradScaler()\noptimizer = torch"),
                    encoding="utf-8")
    _, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", "--select", "TC307",
                        "train.py", cwd=tmp_path)
    [finding] = json.loads(out)["findings"]
    reason = finding["fix"]["reason"]
    assert reason.startswith("this script scales its loss with a GradScaler, and fused SGD under a GradScaler")
    assert "ResNet50" not in reason and "H200" not in reason
    assert "benchmarks/results/h200/verify_resnet50_synthetic_fused_sgd_nan.json" in finding["explanation"]
    assert (REPO / "benchmarks/results/h200/verify_resnet50_synthetic_fused_sgd_nan.json").is_file()


# -- 6. the conventions users reach for ------------------------------------------------------------------

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"  # TC202, a warning on line 2


def _project(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "src" / "other.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "skip").mkdir()
    (tmp_path / "skip" / "old.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC202"]\nexclude = ["skip"]\n',
                                             encoding="utf-8")
    return tmp_path


def test_show_files_lists_what_the_scan_reads(tmp_path):
    _project(tmp_path)
    code, out, err = run_cli("scan", "--show-files", ".", cwd=tmp_path)
    assert code == 0, err
    assert out.splitlines() == ["src/other.py", "src/train.py"]


def test_watch_scans_again_when_a_file_changes(tmp_path):
    import io

    from tcaudit.cli.watch import watch

    path = tmp_path / "train.py"
    path.write_text("x = 1\n", encoding="utf-8")
    scans: list[str] = []
    polls = []

    def wait(seconds):
        polls.append(seconds)
        if len(polls) == 2:  # nothing changed at the first poll; then the file is edited
            path.write_text("x = 22\n", encoding="utf-8")

    messages = io.StringIO()
    code = watch(lambda: scans.append(path.read_text()) or 7, lambda: [str(path)], messages, wait=wait, rounds=2)
    assert scans == ["x = 1\n", "x = 22\n"] and code == 7 and len(polls) == 2
    assert "a file changed; scanning again" in messages.getvalue()


def test_watch_refuses_stdin(tmp_path):
    code, _, err = run_cli("scan", "--watch", "-", cwd=tmp_path)
    assert code == 2 and err == "tcaudit: error: --watch reads files and folders, not stdin (-)\n"


def test_a_nested_config_extends_its_parent(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC202", "TC6"]\nignore = ["TC202"]\n',
                                             encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "sub" / "tcaudit.toml").write_text('fail-on = "error"\n', encoding="utf-8")
    # without extend the nested config drops the parent's ignore (the nearest config wins, as in ruff)
    assert "TC202" in run_cli("scan", "--no-cache", "--format", "concise", "sub/train.py", cwd=tmp_path)[1]
    (tmp_path / "sub" / "tcaudit.toml").write_text('extend = "../pyproject.toml"\nfail-on = "error"\n',
                                                   encoding="utf-8")
    code, out, err = run_cli("scan", "--no-cache", "--format", "concise", "sub/train.py", cwd=tmp_path)
    assert code == 0 and "TC202" not in out, err
    code, out, _ = run_cli("scan", "--show-settings", "sub/train.py", cwd=tmp_path)
    assert "ignore = ['TC202']" in out and "fail-on = error" in out
    # a cycle, and a base that does not exist: one-line config errors
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nextend = "sub/tcaudit.toml"\n', encoding="utf-8")
    code, _, err = run_cli("scan", "--no-cache", "sub/train.py", cwd=tmp_path)
    assert code == 2 and "extend makes a cycle" in err and err.count("\n") == 1
    (tmp_path / "sub" / "tcaudit.toml").write_text('extend = "../nope.toml"\n', encoding="utf-8")
    code, _, err = run_cli("scan", "--no-cache", "sub/train.py", cwd=tmp_path)
    assert code == 2 and "extend names a config file that does not exist: ../nope.toml" in err


def test_inline_config_settings(tmp_path):
    _project(tmp_path)
    assert run_cli("scan", "--no-cache", "src/train.py", cwd=tmp_path)[0] == 1
    code, _, err = run_cli("scan", "--no-cache", "--config", "fail-on = 'error'", "src/train.py", cwd=tmp_path)
    assert code == 0, err
    # an inline setting wins over the config file it is given with; flags win over both
    code, out, _ = run_cli("scan", "--config", "pyproject.toml", "--config", "exclude = []", "--config",
                           "fail-on = 'info'", "--fail-on", "error", "--show-settings", ".", cwd=tmp_path)
    assert "exclude = []" in out and "fail-on = error" in out and "config file: pyproject.toml" in out
    code, _, err = run_cli("scan", "--config", "fail-on = [", "src/train.py", cwd=tmp_path)
    assert code == 2 and err.startswith("tcaudit: error: --config: 'fail-on = [' is neither a config file nor")
    code, _, err = run_cli("scan", "--config", "colour = 'red'", "src/train.py", cwd=tmp_path)
    assert code == 2 and "--config: unknown key 'colour'" in err


def test_per_file_ignores_on_the_command_line(tmp_path):
    _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tcaudit]\nselect = ["TC202"]\nexclude = ["skip"]\nper-file-ignores = {"src/other.py" = ["TC202"]}\n',
        encoding="utf-8")

    def files(*flags: str) -> list[str]:
        _, out, _ = run_cli("scan", "--no-cache", "--format", "concise", *flags, ".", cwd=tmp_path)
        return sorted({line.split(":")[0] for line in out.splitlines()})

    assert files() == ["src/train.py"]
    assert files("--per-file-ignores", "src/train.py:TC2") == ["src/other.py"]  # replaces the config's
    assert files("--extend-per-file-ignores", "src/train.py:TC202") == []  # adds to it
    code, _, err = run_cli("scan", "--per-file-ignores", "TC202", ".", cwd=tmp_path)
    assert code == 2 and "must be GLOB:CODES" in err


def test_clean_removes_tcaudit_caches_only(tmp_path):
    _project(tmp_path)
    assert run_cli("scan", "src", cwd=tmp_path)[0] == 1
    cache = tmp_path / ".tcaudit_cache"
    assert (cache / "CACHEDIR.TAG").is_file()
    nested = tmp_path / "src" / ".tcaudit_cache"
    run_cli("scan", "--cache-dir", str(nested), "src", cwd=tmp_path)
    impostor = tmp_path / "skip" / ".tcaudit_cache"
    impostor.mkdir()
    (impostor / "keep.txt").write_text("not a cache", encoding="utf-8")
    code, out, err = run_cli("clean", cwd=tmp_path)
    assert code == 0, err
    assert not cache.exists() and not nested.exists() and (impostor / "keep.txt").is_file()
    assert sorted(err.splitlines()) == sorted(f"Removing cache at: {p.resolve()}" for p in (cache, nested))
    assert run_cli("clean", cwd=tmp_path) == (0, "", "")


def test_quiet_and_silent(tmp_path):
    _project(tmp_path)
    code, out, _ = run_cli("scan", "--no-cache", "src/train.py", cwd=tmp_path)
    assert code == 1 and out.splitlines()[-1].startswith("Found 1 finding")
    code, out, err = run_cli("scan", "--no-cache", "-q", "src/train.py", cwd=tmp_path)
    assert code == 1 and "TC202" in out and "Found" not in out and err == ""
    code, out, err = run_cli("scan", "--no-cache", "--silent", "src/train.py", cwd=tmp_path)
    assert (code, out, err) == (1, "", "")
    code, out, err = run_cli("fix", "--no-cache", "-q", "src/train.py", cwd=tmp_path)
    assert code == 1 and "+scaler = torch.amp.GradScaler" in out and "would change" not in err
    code, out, err = run_cli("fix", "--no-cache", "-s", "--apply", "src/train.py", cwd=tmp_path)
    assert (code, out, err) == (0, "", "")
    assert "torch.amp.GradScaler" in (tmp_path / "src" / "train.py").read_text()


# -- 7. the Python API and the summary line ----------------------------------------------------------------


def test_repr_of_a_fix_is_short():
    from tcaudit import api

    findings = api.scan((FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8"), filename="train.py")
    fixes = [f.fix for f in findings if f.fix is not None]
    assert fixes and max(len(repr(fix)) for fix in fixes) < 400
    assert repr(fixes[0]).startswith("Fix('") and "libcst" not in repr(fixes[0]).lower()
    assert all(len(repr(f)) < 2000 for f in findings)


@pytest.mark.parametrize("text, error", [
    ("def f(:\n    pass\n", "not fixed: cannot parse: invalid syntax"),
    ('print "hi"\n', "not fixed: cannot parse: this looks like Python 2 code"),
])
def test_api_fix_on_unparsable_text_says_so(text, error):
    from tcaudit import api

    result = api.fix(text)
    assert result.error is not None and result.error.startswith(error)
    assert result.text == text and not result.changed


@pytest.mark.parametrize("option, named", [
    ({"select": ["XX999"]}, "select= names unknown rule or prefix 'XX999'"),
    ({"fail_on": "bogus"}, "fail_on= must be one of info, warning, error"),
    ({"gpu": "bogus"}, "gpu= must be one of auto"),
    ({"per_file_ignores": {"a.py": ["XX1"]}}, "per_file_ignores= names unknown rule"),
    ({"models": [{"x": 1}]}, "models=: unknown key 'x'"),
])
def test_api_errors_name_the_keyword_not_a_flag(option, named):
    from tcaudit import api

    with pytest.raises(api.TcauditError) as caught:
        api.load(**option)
    assert str(caught.value).startswith(named) and "--" not in str(caught.value).split("(")[0]


def test_the_summary_counts_files_with_findings_and_the_baselined(tmp_path):
    _project(tmp_path)
    (tmp_path / "src" / "clean.py").write_text("x = 1\n", encoding="utf-8")
    _, out, _ = run_cli("scan", "--no-cache", "src", cwd=tmp_path)
    assert out.splitlines()[-1].startswith("Found 2 findings (2 warnings) in 2 files (3 scanned).")
    run_cli("scan", "--no-cache", "src", "--write-baseline", "base.json", cwd=tmp_path)
    code, out, _ = run_cli("scan", "--no-cache", "src", "--baseline", "base.json", cwd=tmp_path)
    assert code == 0 and out.strip() == "All clear: no new findings in 3 files; 2 findings are in the baseline."
    (tmp_path / "src" / "clean.py").write_text(BAD, encoding="utf-8")
    _, out, _ = run_cli("scan", "--no-cache", "src", "--baseline", "base.json", cwd=tmp_path)
    assert out.splitlines()[-1].startswith("Found 1 finding (1 warning) in 1 file (3 scanned). 2 more in the "
                                           "baseline. 1 fixable")


@pytest.mark.parametrize("reason, ends", [
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x9216 and 1024x128) while building the network "
     "from configuration files", "while building the…"),
    ("ModuleNotFoundError: No module named " + "'transformers.models.llama.modeling_llama_with_a_long_name_x'",
     "No module named…"),
    ("x" * 150, "x…"),
])
def test_tc100_messages_are_cut_where_a_word_ends(reason, ends):
    from tcaudit.findings import MESSAGE_LIMIT
    from tcaudit.rules.graph.tc100_model_not_audited import fitted, one_line

    message = fitted("could not build `Net`: ", one_line(reason, 80 if reason.startswith("Module") else 200))
    assert len(message) <= MESSAGE_LIMIT and message.endswith(ends), message
    words = set(reason.replace("'", " ").split())
    kept = message.removeprefix("could not build `Net`: ").removesuffix("…").replace("'", " ").split()
    assert all(word in words for word in kept[:-1]) and (kept[-1] in words or set(kept[-1]) == {"x"}), kept


# -- 8. verify on a notebook whose data cannot be downloaded -----------------------------------------------

DOWNLOADING_NOTEBOOK = [
    ("markdown", "# FashionMNIST in a notebook"),
    ("code", "!pip install -q torchvision\nimport torch\nfrom torch import nn\nfrom torchvision import datasets\n"
             "from torchvision.transforms import ToTensor\nfrom torch.utils.data import DataLoader\n"),
    ("code", "train_data = datasets.FashionMNIST(root=\"data\", train=True, download=True, transform=ToTensor())\n"
             "train_dataloader = DataLoader(train_data, batch_size=32, shuffle=True)\n"),
    ("code", "device = \"cuda\" if torch.cuda.is_available() else \"cpu\"\n"
             "model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).to(device)\n"
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "for X, y in train_dataloader:\n    X, y = X.to(device), y.to(device)\n"
             "    loss = nn.functional.cross_entropy(model(X), y)\n    optimizer.zero_grad()\n    loss.backward()\n"
             "    optimizer.step()\n"),
]


@pytest.mark.slow
def test_verify_on_a_notebook_whose_data_cannot_be_downloaded(tmp_path, monkeypatch):
    pytest.importorskip("torchvision")
    # No download may happen in the tests: every URL goes to a proxy that refuses the connection.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    path = _notebook(tmp_path / "fashion.ipynb", DOWNLOADING_NOTEBOOK)
    code, out, err = run_cli("verify", str(path), "--steps", "2", "--warmup", "1", "--rounds", "1",
                             "--out", str(tmp_path / "out"))
    assert code == 2, out + err
    head = err.splitlines()[0]
    assert head.startswith("tcaudit: error: the original run failed (exit 1): "), head
    assert "URLError" in head or "RuntimeError" in head, head
    assert "The script itself does not run here" in err and "the patched copy was not run" in err
    assert "it needs a download and the network cannot be reached" in err
    lines = err.split("The run's last lines (all of it: ", 1)[1].splitlines()[1:]
    assert lines and lines[0].startswith(("Traceback", "  File", "During", "The above", "Downloading", "http",
                                          "Failed", "urllib", "torch", "Runtime", "  ", "Error", "OSError",
                                          "Connection")), lines[0]
    log = next((tmp_path / "out").rglob("*.log")).read_text()
    assert all(line in log.splitlines() for line in lines)  # whole lines of the log, none cut mid-word


def test_a_failed_run_shows_its_last_lines_whole():
    from tcaudit.verify.runner import last_lines, run_failure

    output = "".join(f"line {i} " + "word " * 20 + "\n" for i in range(200)) + "ValueError: bad batch\n"
    shown = last_lines(output, chars=1000)
    assert shown.splitlines()[-1] == "ValueError: bad batch"
    assert all(line in output.splitlines() for line in shown.splitlines()) and len(shown) <= 1000
    message = run_failure("patched", "", 1, output, Path("/tmp/x.log"))
    assert message.startswith("the patched run failed (exit 1): ValueError: bad batch. The original ran, so "
                              "tcaudit's patch is what breaks it")


def test_the_readme_conventions_section_lists_each_convention_and_each_exists():
    from tcaudit.cli.main import build_parser

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### Conventions shared with ruff", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    flags = ["--watch", "--show-files", "--per-file-ignores", "--extend-per-file-ignores", "--quiet", "--silent",
             "--exit-zero", "--fail-on", "--statistics", "--show-settings", "--output-format", "--stdin-filename"]
    for needle in [*flags, "extend = \"../pyproject.toml\"", "--config \"key = value\"", "tcaudit clean", "`-q`",
                   "`-s`", "ruff check --fix", "cell 3:12:5"]:
        assert needle in section, needle
    parser = build_parser()
    sub = next(action for action in parser._actions if action.dest == "command").choices
    scan_flags = {flag for action in sub["scan"]._actions for flag in action.option_strings}
    fix_flags = {flag for action in sub["fix"]._actions for flag in action.option_strings}
    assert set(flags) <= scan_flags and {"-q", "-s", "-w"} <= scan_flags
    assert {"--quiet", "--silent", "--exit-zero", "--fail-on", "--per-file-ignores", "--config"} <= fix_flags
    assert "clean" in sub


def test_a_cpu_baseline_beside_a_cuda_model_gets_autocast_only_around_the_cuda_forward(tmp_path):
    import json

    mixed = [*CPU_NOTEBOOK, ("code", "model_1 = FashionMNISTModelV0(input_shape=784, hidden_units=10, "
                                     "output_shape=len(class_names)).to(device)\n"
                                     "optimizer_1 = torch.optim.SGD(params=model_1.parameters(), lr=0.1)\n"
                                     "for X, y in train_dataloader:\n    X, y = X.to(device), y.to(device)\n"
                                     "    loss = loss_fn(model_1(X), y)\n    optimizer_1.zero_grad()\n"
                                     "    loss.backward()\n    optimizer_1.step()\n")]
    path = _notebook(tmp_path / "mixed.ipynb", mixed)
    _, out, _ = run_cli("scan", "--no-cache", "--no-exec", "--isolated", "--format", "json", "--select", "TC201",
                        "mixed.ipynb", cwd=tmp_path)
    [finding] = json.loads(out)["findings"]
    assert (finding["cell"], finding["line"]) == (10, 5), finding
    run_cli("fix", "--apply", "--no-cache", "--no-exec", "--isolated", "--select", "TC201", "mixed.ipynb", cwd=tmp_path)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert "autocast" not in "".join(cells[6]["source"])  # model_0's CPU loop
    assert "autocast" in "".join(cells[9]["source"])
