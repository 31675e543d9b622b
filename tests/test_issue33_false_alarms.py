"""Issue 33's false alarms and misses on real code, each on a shape of our own: what stays silent now,
and what is said instead of nothing (TC100 for a trained model that is not audited)."""

from __future__ import annotations

import pytest

from helpers import scan_code, scan_paths
from tcaudit.findings import Severity


def test_tc601_tolist_of_a_numpy_array_is_no_sync(tmp_path):
    """``(probs > 0.5).tolist()`` and ``probs.argmax(1).tolist()`` of ``probs = ....cpu().numpy()`` read
    host memory: the sync is the ``.cpu()`` (reported on its own line); a tensor's ``.tolist()`` is."""
    result = scan_code(tmp_path, """
        import numpy as np
        import torch

        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            x, y = x.cuda(), y.cuda()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            weights = np.array([0.1, 0.2]) * 2
            history.append((weights / 2).tolist())
            probs = torch.softmax(out, 1).detach().cpu().numpy()
            picked = (probs > 0.5).tolist()
            top = probs.argmax(1).tolist()
            wrong = out.argmax(1).tolist()
    """, select=("TC601",))
    assert sorted(f.location.line for f in result.findings) == [15, 18]


def test_tc201_a_loss_scaler_class_that_only_runs_the_backward_is_silent(tmp_path):
    """The loss comes into ``__call__`` from a caller the trace cannot resolve (``loss_scaler(...)`` of a
    parameter), in a file that uses autocast: where the forward runs is not known, so no claim."""
    code = """
        import torch


        class NativeScaler:
            def __init__(self):
                self._scaler = torch.amp.GradScaler("cuda")

            def __call__(self, loss, optimizer):
                self._scaler.scale(loss).backward()
                self._scaler.step(optimizer)
                self._scaler.update()


        def train_one_epoch(model, loader, optimizer, loss_scaler, amp_autocast):
            for x, y in loader:
                with amp_autocast():
                    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss_scaler(loss, optimizer)
        {}
    """
    silent = scan_code(tmp_path, code.format('amp = lambda: torch.autocast("cuda", dtype=torch.float16)'),
                       select=("TC201",))
    assert silent.findings == []
    # Without any autocast in the file the step's precision is plain fp32: still reported.
    plain = code.format("").replace("with amp_autocast():", "if True:").replace("amp_autocast", "context")
    reported = scan_code(tmp_path, plain, select=("TC201",))
    assert [f.rule for f in reported.findings] == ["TC201"]


def test_tc213_not_tc205_for_a_clip_after_the_scaler_step(tmp_path):
    result = scan_code(tmp_path, """
        import torch

        model = torch.nn.Linear(8, 8).cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """, select=("TC2",))
    assert [(f.rule, f.location.line) for f in result.findings] == [("TC213", 13)]


def test_tc307_decline_reasons_name_the_class_and_the_models_own_method(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters(), lr=1e-3)


        class Trainer:
            def __init__(self, model):
                self.model = model
                self.optimizer = torch.optim.Adam(model.parameters())

            def fit(self, loader):
                for x, y in loader:
                    loss = nn.functional.mse_loss(self.model(x.cuda()), y.cuda())
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()


        net = Net()
        Trainer(net).fit(loader)
        Trainer(net.cuda()).fit(loader)
        optimizer = net.configure_optimizers()
    """, select=("TC307",))
    reasons = {f.location.line: f.fix.reason for f in result.findings}
    assert "the model's own `configure_optimizers()`" in reasons[11]
    assert "`model` comes in as an argument of `Trainer(...)`" in reasons[17]
    assert all("is a parameter of" not in reason for reason in reasons.values())


# -- the model audit: every trained model is audited or named in a TC100 ------------------------------

NOT_AUDITED = {
    # a factory from a package that is not installed here
    "external_factory.py": """
        import torch
        from mylib.models import build_model

        model = build_model(cfg).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """,
    # a training function for a launcher to call: the module runs nothing itself
    "exported_main.py": """
        import torch
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.fc = nn.Linear(cfg.width, cfg.width)

            def forward(self, x):
                return self.fc(x)


        def main(cfg):
            model = Net(cfg).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """,
    # 500-wide GEMMs at batch 128: launch-bound on an H200, so info, but reported
    "mlp_500.py": """
        import torch
        import torch.nn as nn


        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 500), nn.ReLU(),
                                         nn.Linear(500, 10))

            def forward(self, x):
                return self.net(x.flatten(1))


        if __name__ == "__main__":
            model = MLP().cuda()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            loader = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True)
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """,
}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    pytest.importorskip("torch")
    import textwrap

    root = tmp_path_factory.mktemp("audit")
    paths = []
    for name, code in NOT_AUDITED.items():
        (root / name).write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
        paths.append(str(root / name))
    result = scan_paths(paths, select=("TC1",), model_audit=True, root=root, gpu="sm_90")
    by_file: dict[str, list] = {}
    for finding in result.findings:
        by_file.setdefault(finding.location.path.rsplit("/", 1)[-1], []).append(finding)
    return by_file


def test_a_model_from_a_package_that_is_not_installed_is_a_tc100(audited):
    [finding] = audited["external_factory.py"]
    assert finding.rule == "TC100" and "mylib" in finding.message and finding.location.line == 4


def test_a_model_trained_in_an_exported_function_is_a_tc100(audited):
    [finding] = audited["exported_main.py"]
    assert finding.rule == "TC100" and "Net(cfg)" in finding.message and finding.location.line == 15


def test_500_wide_gemms_are_reported_as_launch_bound_info(audited):
    findings = audited["mlp_500.py"]
    assert {f.rule for f in findings} == {"TC101"} and len(findings) == 3
    assert all(f.severity == Severity.INFO for f in findings)
