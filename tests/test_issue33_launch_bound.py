"""Issue 33's remaining false alarms, each on a shape of our own, with the model audit on (one scan of
all of them, shared): tutorial-sized models whose step is launch-bound get their precision, TF32 and
memory-format advice as info, and near-miss models just past the line keep the warning; widths the
task fixes on layers the audit could only read from their parameters are not findings; a vocabulary
already a multiple of 8 is info; Lightning's fit switches anomaly detection off; a loop that takes
gradients of its inputs is no evaluation to wrap in no_grad."""

from __future__ import annotations

import textwrap

import pytest

from helpers import scan_code
from tcaudit.findings import Severity
from tcaudit.model.cost import STEP_MARGIN, CostModel

pytest.importorskip("torch")

LOOP = textwrap.dedent("""
    device = torch.device("cuda")
    model = {model}.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(dataset, batch_size={batch}, shuffle=True, num_workers=4,
                                         pin_memory=True, persistent_workers=True)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""")

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

MNIST_NET = """
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
"""

CIFAR_RESNET = """
import torchvision
"""

PPO_AGENT = """
class Agent(nn.Module):
    def __init__(self, observations, actions):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                    nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                   nn.Linear(64, actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x):
        logits = self.actor(x)
        return logits, self.critic(x)


device = torch.device("cuda")
agent = Agent(4, 2).to(device)
optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4)
for update in range(100):
    obs = torch.randn(128, 4, device=device)
    logits, value = agent.get_action_and_value(obs)
    loss = value.pow(2).mean() - logits.log_softmax(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

DETECTOR = """
class Detector(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc6 = nn.Linear(2048, 1002)
        self.fc7 = nn.Linear(1002, 1024)
        self.cls_score = nn.Linear(1024, num_classes)
        self.bbox_pred = nn.Linear(1024, num_classes * 4)

    def forward(self, features, targets):
        h = F.relu(self.fc7(F.relu(self.fc6(features))))
        return F.cross_entropy(self.cls_score(h), targets["labels"]) + self.bbox_pred(h).abs().mean()


device = torch.device("cuda")
model = Detector(3).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for features, targets in loader:
    loss = model(features.to(device), {k: v.to(device) for k, v in targets.items()})
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

CASES = {
    # the pytorch/examples MNIST Net at its batch of 64: 1.5 GFLOP over four ops
    "mnist.py": HEADER + MNIST_NET + LOOP.format(model="Net()", batch=64),
    # near miss: the same Net at a batch of 1024 is past the line
    "mnist_large_batch.py": HEADER + MNIST_NET + LOOP.format(model="Net()", batch=1024),
    # near miss: a CIFAR ResNet18 at batch 256 (0.9 GFLOP per op) keeps its warnings
    "cifar_resnet18.py": HEADER + CIFAR_RESNET
    + LOOP.format(model="torchvision.models.resnet18(num_classes=10)", batch=256).replace(
        "dataset,", 'torchvision.datasets.CIFAR10("data", train=True),'),
    # a lone layer trained as the model, and one of real size
    "lone_layer.py": HEADER + LOOP.format(model="nn.Linear(10, 2)", batch=64),
    "lone_layer_large.py": HEADER + LOOP.format(model="nn.Linear(4096, 4096)", batch=512),
    # a policy with no forward: only its parameters are audited
    "ppo.py": HEADER + PPO_AGENT,
    # a head traced only from its parameters: 3 classes and 12 box outputs are the task's, 1002 is not
    "detector.py": HEADER + DETECTOR,
    # a vocabulary already a multiple of 8
    "vocab_1000.py": HEADER + LOOP.format(model="nn.Sequential(nn.Embedding(1000, 256), nn.Linear(256, 1000))",
                                          batch=64),
}


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    from helpers import scan_paths

    root = tmp_path_factory.mktemp("launch")
    paths = []
    for name, code in CASES.items():
        (root / name).write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
        paths.append(str(root / name))
    result = scan_paths(paths, select=("TC1", "TC201", "TC301", "TC303"), model_audit=True, root=root, gpu="sm_90")
    by_file: dict[str, dict[str, list]] = {name: {} for name in CASES}
    for finding in result.findings:
        by_file[finding.location.path.rsplit("/", 1)[-1]].setdefault(finding.rule, []).append(finding)
    return by_file


def _severities(findings: dict[str, list], *rules: str) -> set:
    return {f.severity for rule in rules for f in findings.get(rule, [])}


def test_a_launch_bound_mnist_net_gets_precision_tf32_and_layout_advice_as_info(scanned):
    findings = scanned["mnist.py"]
    assert {"TC201", "TC303"} <= set(findings), findings
    assert _severities(findings, "TC201", "TC301", "TC303") == {Severity.INFO}
    assert all("launch-bound" in f.message for rule in ("TC201", "TC303") for f in findings[rule])


def test_the_same_net_at_a_large_batch_keeps_its_warnings(scanned):
    findings = scanned["mnist_large_batch.py"]
    assert Severity.WARNING in _severities(findings, "TC201")
    assert Severity.WARNING in _severities(findings, "TC303")


def test_a_cifar_resnet18_at_batch_256_is_not_launch_bound(scanned):
    findings = scanned["cifar_resnet18.py"]
    assert _severities(findings, "TC201") == {Severity.WARNING}
    assert not any("launch-bound" in f.message for fs in findings.values() for f in fs)


def test_a_lone_layer_is_audited_and_a_toy_one_is_launch_bound(scanned):
    assert "TC100" not in scanned["lone_layer.py"]
    assert _severities(scanned["lone_layer.py"], "TC201", "TC301") == {Severity.INFO}
    assert _severities(scanned["lone_layer_large.py"], "TC201") == {Severity.WARNING}


def test_a_small_policy_known_only_from_its_parameters(scanned):
    findings = scanned["ppo.py"]
    assert "TC101" not in findings  # K=4 is the observation, N=2 and N=1 the actions and the value
    assert _severities(findings, "TC201", "TC301") == {Severity.INFO}


def test_untraced_heads_keep_the_task_widths_and_report_the_hidden_one(scanned):
    findings = scanned["detector.py"].get("TC101", [])
    assert sorted(f.details["module"] for f in findings) == ["fc6", "fc7"]
    assert all(set(f.details["unaligned"].values()) == {1002} for f in findings)


def test_a_vocabulary_already_a_multiple_of_8_is_info(scanned):
    [finding] = scanned["vocab_1000.py"]["TC104"]
    assert finding.severity == Severity.INFO and "already a multiple of 8" in finding.message


def test_the_step_margin_is_what_the_docstring_says():
    assert STEP_MARGIN == 2.0 and "STEP_MARGIN" in (CostModel.step_within_launch.__doc__ or "")


def test_tc306_under_lightning_is_info_and_a_plain_script_keeps_the_warning(tmp_path):
    code = """
        {imports}
        import torch

        torch.autograd.set_detect_anomaly(True)
        model = torch.nn.Linear(8, 8).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            loss = model(x.cuda()).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        {fit}
    """
    lightning = scan_code(tmp_path, code.format(imports="import lightning as L", fit="L.Trainer().fit(module)"),
                          select=("TC306",), name="lit.py")
    plain = scan_code(tmp_path, code.format(imports="import os", fit=""), select=("TC306",), name="plain.py")
    assert [(f.location.line, f.severity) for f in lightning.findings] == [(4, Severity.INFO)]
    assert "Trainer(detect_anomaly=True)" in lightning.findings[0].message
    assert [(f.location.line, f.severity) for f in plain.findings] == [(4, Severity.WARNING)]


def test_tc606_a_loop_taking_input_gradients_is_not_an_evaluation(tmp_path):
    result = scan_code(tmp_path, """
        import torch

        def evaluate(model, loader):
            model.eval()
            for x, y in loader:
                print(model(x.cuda()).argmax(1))

        def saliency(model, loader):
            model.eval()
            maps = []
            for x, y in loader:
                x = x.cuda().requires_grad_()
                (grad,) = torch.autograd.grad(model(x).max(1).values.sum(), x)
                maps.append(grad.abs())
            return maps
    """, select=("TC606",))
    assert [f.location.line for f in result.findings] == [5]


def test_a_model_config_binding_is_not_a_trained_model(tmp_path):
    from tcaudit.engine import read_source
    from tcaudit.script.facts import ScriptFacts

    path = tmp_path / "mingpt.py"
    path.write_text(textwrap.dedent("""
        import torch
        from model import GPT

        model_config = GPT.get_default_config()
        model_path = str("out/gpt.pt")
        model = GPT(model_config)
    """).lstrip("\n"), encoding="utf-8")
    assert ScriptFacts(read_source(path, "mingpt.py")).model_names == {"model"}


def test_tc601_a_non_finite_guard_that_stops_the_run_is_info(tmp_path):
    code = """
        import math
        import sys

        import torch

        model = torch.nn.Linear(8, 8).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            loss = model(x.cuda()).sum()
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                {stop}
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
    guard = scan_code(tmp_path, code.format(stop="sys.exit(1)"), select=("TC601",), name="guard.py")
    logged = scan_code(tmp_path, code.format(stop='print("non-finite")'), select=("TC601",), name="logged.py")
    assert [(f.location.line, f.severity) for f in guard.findings] == [(10, Severity.INFO)]
    assert "non-finite-loss guard on `loss_value`" in guard.findings[0].message
    assert [(f.location.line, f.severity) for f in logged.findings] == [(10, Severity.WARNING)]


def test_tc401_an_in_memory_dataset_returned_by_a_helper_is_not_reported(tmp_path):
    code = """
        import torch
        from torch.utils.data import DataLoader, Dataset


        class {name}(Dataset):
            def __init__(self, size):
                self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]
                self.files = [f"{{i}}.pt" for i in range(size)]

            def __len__(self):
                return len(self.data)

            def __getitem__(self, index):
                return {item}


        def load_train_objs(size):
            train_set = {name}(size)
            model = torch.nn.Linear(20, 1)
            return train_set, model, torch.optim.SGD(model.parameters(), lr=0.01)


        def main():
            dataset, model, optimizer = load_train_objs(2048)
            model = model.cuda()
            loader = DataLoader(dataset, batch_size=32, shuffle=True, pin_memory=True)
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
    """
    memory = scan_code(tmp_path, code.format(name="InMemory", item="self.data[index]"), select=("TC401",),
                       name="memory.py")
    loading = scan_code(tmp_path, code.format(name="FromFiles", item="torch.load(self.files[index])"),
                        select=("TC401",), name="files.py")
    assert memory.findings == []
    assert [f.rule for f in loading.findings] == ["TC401"]


def test_an_rl_loop_with_an_unmeasured_policy_gets_info_and_a_trainer_step_method_does_not(tmp_path):
    rl = scan_code(tmp_path, """
        import torch

        policy = Policy().cuda()
        optimizer = torch.optim.Adam(policy.parameters())
        state = env.reset()
        for t in range(1000):
            action = policy(torch.as_tensor(state, device="cuda")).argmax()
            state, reward, done, info = env.step(action.item())
            loss = -policy(torch.as_tensor(state, device="cuda")).log_softmax(-1)[action] * reward
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """, select=("TC201", "TC301"), name="rl.py")
    trainer = scan_code(tmp_path, """
        import torch


        class Trainer:
            def __init__(self, model):
                self.model = model.cuda()
                self.optimizer = torch.optim.Adam(self.model.parameters())

            def step(self, x):
                loss = self.model(x).sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

            def fit(self, loader):
                for x in loader:
                    self.step(x.cuda())
    """, select=("TC201",), name="trainer.py")
    assert {(f.rule, f.severity) for f in rl.findings} == {("TC201", Severity.INFO), ("TC301", Severity.INFO)}
    assert all("an RL loop" in f.message for f in rl.findings)
    assert [(f.rule, f.severity) for f in trainer.findings] == [("TC201", Severity.WARNING)]
