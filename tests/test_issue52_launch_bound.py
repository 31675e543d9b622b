"""Issue 52, items 3 and 4 for a launch-bound model: the default ``fix`` leaves out the numerics changes
the model audit says cannot pay (autocast + GradScaler, channels_last, TF32 on an MNIST Net at batch 64),
says so on each one's "no fix" line, and applies them when the rule is selected by its id; the findings'
explanations quote no measured speed-up for such a model, whatever the target GPU."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, run_cli
from tcaudit import gpus
from test_issue51_edges import MNIST, RESNET

HELD_BACK = ("no fix: not applied by default: the model audit measured the trained model as launch-bound at this "
             "batch, so it has little to gain; `--select {rule}` applies it")


@pytest.fixture
def mnist(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "mnist.py"
    script.write_text(MNIST.lstrip("\n"), encoding="utf-8")
    return script


@pytest.mark.slow
def test_the_default_fix_adds_no_autocast_scaler_layout_or_tf32_to_a_launch_bound_net(mnist, tmp_path):
    code, out, err = run_cli("fix", "--no-cache", "--gpu", "h200", str(mnist), cwd=tmp_path)
    assert code == 1, err  # the pipeline fixes (pin_memory, non_blocking, cudnn.benchmark) still apply
    for absent in ("autocast", "GradScaler", "channels_last", "set_float32_matmul_precision"):
        assert absent not in out, (absent, out)
    assert "pin_memory=True" in out and "non_blocking=True" in out
    for rule, line in (("TC201", 25), ("TC301", 27)):
        assert f"mnist.py:{line}: {rule} " + HELD_BACK.format(rule=rule) in err, (rule, err)
    # channels_last comes with the autocast TC201's fix would add: without it, TC303 has nothing to offer.
    assert "TC303" not in err


@pytest.mark.slow
def test_scan_says_what_the_default_fix_does(mnist, tmp_path):
    code, out, err = run_cli("scan", "--no-cache", "--gpu", "h200", "--format", "json", str(mnist), cwd=tmp_path)
    findings = json.loads(out)
    findings = findings["findings"] if isinstance(findings, dict) else findings
    held = {f["rule"]: f["fix"] for f in findings if f["rule"] in ("TC201", "TC301")}
    assert set(held) == {"TC201", "TC301"}, findings
    for rule, fix in held.items():
        assert fix["available"] is False and fix["reason"].startswith("not applied by default: the model audit"), fix


@pytest.mark.slow
def test_naming_the_rule_applies_it(mnist, tmp_path):
    code, out, err = run_cli("fix", "--no-cache", "--gpu", "h200", "--select", "TC1,TC201", str(mnist), cwd=tmp_path)
    assert code == 1, err
    assert "+    with torch.autocast(device_type=device.type, dtype=torch.float16" in out, out
    assert "+    scaler.scale(loss).backward()" in out
    assert "not applied by default" not in err
    # A prefix is no explicit choice: TC2 selects the family, and the launch-bound advice stays out (TC1 makes
    # the scan audit the model, as the default selection does).
    code, out, err = run_cli("fix", "--no-cache", "--gpu", "h200", "--select", "TC1,TC2", str(mnist), cwd=tmp_path)
    assert "autocast" not in out, out
    assert "TC201 " + HELD_BACK.format(rule="TC201") in err, err


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["h200", "h100", "t4", "rtx3090"])
def test_a_launch_bound_finding_quotes_no_speedup_for_any_gpu(mnist, tmp_path, gpu):
    code, out, err = run_cli("scan", "--no-cache", "--gpu", gpu, "--select", "TC1,TC201,TC301,TC303",
                             "--format", "json", str(mnist), cwd=tmp_path)
    assert code in (0, 1), err
    findings = json.loads(out)
    findings = findings["findings"] if isinstance(findings, dict) else findings
    discounted = [f for f in findings if "launch-bound" in f["message"]]
    assert {f.get("code") or f.get("rule") for f in discounted} >= ({"TC201"} if gpu == "t4" else {"TC201", "TC303"})
    for finding in discounted:
        explanation = finding.get("explanation") or ""
        for quoted in ("2.57×", "1.90×", "torch 2.11:", "published, not measured", "not measured on this GPU"):
            assert quoted not in explanation, (gpu, quoted, explanation)


@pytest.mark.parametrize("gpu", sorted(set(gpus.choices()) - {gpus.AUTO}))
def test_the_footer_quotes_a_measured_figure_only_for_the_gpu_it_was_measured_on(gpu):
    """Every GPU and architecture ``--gpu`` accepts: the footer's "est. N× measured on H200" only where the
    target is the H200 (``h200``, or ``sm_90``, which stands for it); for any other, the finding alone."""
    code, out, err = run_cli("scan", "--no-cache", "--no-exec", "--gpu", gpu, RESNET, cwd=REPO)
    assert code in (0, 1), err
    footer = out.rstrip("\n").splitlines()[-1]
    assert ("×" in footer) == (gpus.resolve(gpu).key == "h200"), (gpu, footer)
