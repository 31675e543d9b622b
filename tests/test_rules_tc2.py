"""TC2 on whole training scripts shaped like the TRAPS.md items: exact (rule, line) sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from expectations import expected_findings
from helpers import scan_paths

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
FAMILIES = ("TC2", "TC000", "TC304")


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("tc2_*.py")), ids=lambda p: p.stem)
def test_tc2_fixture(path):
    result = scan_paths([str(path)], select=FAMILIES)
    actual = {(f.rule, f.location.line) for f in result.findings}
    expected = expected_findings(path, FAMILIES)
    assert actual == expected, "\n".join(
        f"{f.rule}:{f.location.line} {f.message}" for f in result.findings
    )


def test_resnet50_fixture_mixed_precision():
    """The naive FP32 ResNet50 script: one TC201 at its forward, fp16 + GradScaler for a convnet."""
    path = FIXTURES.parent / "resnet50" / "train.py"
    result = scan_paths([str(path)], select=("TC2",))
    assert [f.rule for f in result.findings] == ["TC201"]
    finding = result.findings[0]
    assert "output = model(images)" in path.read_text().splitlines()[finding.location.line - 1]
    assert finding.fix.plan.dtype == "float16" and finding.fix.plan.scaler is True


def test_precision_setting_changes_the_recipe():
    path = FIXTURES.parent / "resnet50" / "train.py"
    result = scan_paths([str(path)], select=("TC201",), precision="bf16")
    plan = result.findings[0].fix.plan
    assert (plan.dtype, plan.scaler, plan.grad_scaler) == ("bfloat16", False, None)


def test_tc205_silent_on_a_clip_after_the_step():
    """torchvision's historical reference clips after scaler.step() + update(): TC213's finding, never a
    place for unscale_ (the next step's gradients would be unscaled twice)."""
    path = FIXTURES.parent / "fix" / "tc205_clip_after_step.in.py"
    result = scan_paths([str(path)], select=("TC205", "TC213"))
    assert [f.rule for f in result.findings] == ["TC213"]
    assert "clip_grad_norm_" in path.read_text().splitlines()[result.findings[0].location.line - 1]
