"""TC408 on the shapes its TOML examples do not show: which reads are host tensors built once, and
where the fix is declined (a second binding on one path, an in-place write, loaded data)."""

from __future__ import annotations

import pytest

from helpers import scan_code

LOOP = """
import torch
device = torch.device("cuda")
{setup}
for epoch in range(3):
    for i in range(0, 1024, 64):
{body}
        loss = model(xb).sum()
        loss.backward()
        optimizer.step()
"""


def _tc408(tmp_path, setup: str, body: str):
    code = LOOP.format(setup=setup, body="\n".join("        " + line for line in body.splitlines()))
    return [f for f in scan_code(tmp_path, code, select=("TC408",)).findings]


@pytest.mark.parametrize(
    "setup,body",
    [
        ("X = torch.randn(1024, 8)", "xb = X[i:i + 64].to(device)"),  # a basic slice
        ("X = torch.randn(1024, 8)", "xb = X[i:i + 64:2].cuda()"),  # with a step
        ("X = torch.randn(1024, 8).float().view(1024, 8)", "xb = X.to(device)"),  # the tensor itself, through host methods
        ("batches = [torch.randn(64, 8) for _ in range(4)]", "xb = batches[i % 4]\nxb = xb.to(device)"),
        ("batches = (torch.randn(64, 8), torch.randn(64, 8))", "xb = batches[i % 2].cuda()"),
    ],
)
def test_reported_with_a_fix(tmp_path, setup, body):
    findings = _tc408(tmp_path, setup, body)
    assert len(findings) == 1
    assert findings[0].fix is not None and findings[0].fix.available, findings[0].fix


@pytest.mark.parametrize(
    "setup,body",
    [
        # fancy indexing gathers into a fresh pageable tensor: pinning X would not help
        ("X = torch.randn(1024, 8)\nperm = torch.randperm(1024)", "xb = X[perm[i:i + 64]].to(device)"),
        # built in the loop
        ("", "X = torch.randn(64, 8)\nxb = X[0:32].to(device)"),
        # already on the device
        ('X = torch.randn(1024, 8, device="cuda")', "xb = X[i:i + 64].to(device)"),
        ("X = torch.randn(1024, 8).to(device)", "xb = X[i:i + 64].to(device)"),
        # rebound in the loop before the copy: not the tensor built once
        ("X = torch.randn(1024, 8)", "X = X * 2\nxb = X.to(device)"),
        # already non-blocking, or blocking on purpose
        ("X = torch.randn(1024, 8)", "xb = X[i:i + 64].to(device, non_blocking=True)"),
        ("X = torch.randn(1024, 8)", "xb = X[i:i + 64].to(device, non_blocking=False)"),
        # a dtype conversion, not a copy to the device
        ("X = torch.randn(1024, 8)", "xb = X[i:i + 64].to(torch.float16)"),
        # something the script did not build as tensors
        ("X = make_data()", "xb = X[i:i + 64].to(device)"),
        ("batches = [b for b in loader]", "xb = batches[i].to(device)"),
    ],
)
def test_not_reported(tmp_path, setup, body):
    assert _tc408(tmp_path, setup, body) == []


@pytest.mark.parametrize(
    "setup,body,reason",
    [
        ("X = torch.randn(1024, 8)\nX = (X - X.mean()) / X.std()", "xb = X[i:i + 64].to(device)", None),
        ("X = torch.randn(1024, 8)\nY = torch.randn(8)\nX = torch.zeros(1024, 8)",
         "xb = X[i:i + 64].to(device)", "bound more than once on one path"),
        ("X = torch.randn(1024, 8)\nX[0] = 0", "xb = X[i:i + 64].to(device)", "written in place (line 4)"),
        ("X = torch.randn(1024, 8)", "X.mul_(0.5)\nxb = X[i:i + 64].to(device)", "written in place"),
        ('X = torch.from_numpy(np.load("x.npy")).float()', "xb = X[i:i + 64].to(device)", "comes from torch.from_numpy"),
    ],
)
def test_declined(tmp_path, setup, body, reason):
    findings = _tc408(tmp_path, setup, body)
    if reason is None:  # the second binding is not a tensor the script builds: not followed at all
        assert findings == []
        return
    assert len(findings) == 1
    fix = findings[0].fix
    assert fix is not None and not fix.available and reason in fix.reason, fix


def test_bindings_in_opposite_arms_are_pinned_in_each(tmp_path):
    setup = "if flag:\n    X = torch.randn(1024, 8)\nelse:\n    X = torch.zeros(1024, 8)"
    findings = _tc408(tmp_path, setup, "xb = X[i:i + 64].to(device)")
    assert len(findings) == 1 and findings[0].fix.available
    assert len(findings[0].fix.plan.after) == 2


def test_an_attribute_bound_outside_init_is_not_followed(tmp_path):
    code = """
    import torch
    class Trainer:
        def load(self):
            self.X = torch.randn(1024, 8)
        def fit(self):
            for i in range(0, 1024, 64):
                loss = self.model(self.X[i:i + 64].cuda()).sum()
                loss.backward()
                self.optimizer.step()
    """
    assert scan_code(tmp_path, code, select=("TC408",)).findings == []


def test_cpu_only_script_and_eval_loop_are_silent(tmp_path):
    code = """
    import torch
    X = torch.randn(1024, 8)
    with torch.no_grad():
        for i in range(0, 1024, 64):
            model(X[i:i + 64].to("cuda"))
    for i in range(0, 1024, 64):
        loss = model(X[i:i + 64]).sum()
        loss.backward()
        optimizer.step()
    """
    assert scan_code(tmp_path, code, select=("TC408",)).findings == []
