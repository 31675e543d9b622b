"""The model audit's FLOP shares decide TC302/TC303/TC305 and the precision where it built the model;
scan and fix decide alike. One audit of both fixtures (module-scoped: it builds the models)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tcaudit.config import Settings
from tcaudit.engine import scan
from tcaudit.findings import FixClass
from tcaudit.engine import audited_models_for
from tcaudit.fix.engine import fix_enabled, fix_file

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "profile"
CLASSES = frozenset({FixClass.SAFE, FixClass.NUMERICS})
SELECT = ("TC1", "TC2", "TC3")


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile")
    for name in ("nets.py", "factory_convnet.py", "patch_transformer.py"):
        shutil.copy(FIXTURES / name, folder / name)
    settings = Settings(select=SELECT, root=folder, structural_fixes=("compile",))
    scripts = [folder / "factory_convnet.py", folder / "patch_transformer.py"]
    result = scan([str(p) for p in scripts], settings, model_audit=True)
    models = audited_models_for(scripts, settings)
    fixes = {p.name: fix_file(p, settings, CLASSES, p.name, models.get(os.path.realpath(p))) for p in scripts}
    return result, models, fixes, settings


def _rules(result, name):
    return sorted({f.rule for f in result.findings if Path(f.location.path).name == name})


def test_a_convnet_from_another_modules_factory_gets_the_convnet_recipe(audited):
    result, models, fixes, _ = audited
    [profile] = next(m.profiles for path, m in models.items() if path.endswith("factory_convnet.py"))
    assert profile.is_convnet and profile.image_input and profile.assigned == "model"
    assert {"TC302", "TC303"} <= set(_rules(result, "factory_convnet.py"))
    [tc201] = [f for f in result.findings if f.rule == "TC201" and f.location.path.endswith("factory_convnet.py")]
    # The recipe is in the explanation (the message is short). These settings compile (``fix --compile``),
    # and compiled convnets get bf16, whose lack of a GradScaler lets SGD be fused (issue 32 item 5).
    assert "bf16 autocast (convnet under torch.compile" in tc201.explanation
    fixed = fixes["factory_convnet.py"].fixed
    assert "torch.backends.cudnn.benchmark = True" in fixed
    assert "model = model.to(device, memory_format=torch.channels_last)" in fixed
    assert "dtype=torch.bfloat16" in fixed and "GradScaler" not in fixed
    assert "torch.optim.SGD(model.parameters(), lr=0.1, fused=True)" in fixed
    assert "model.compile()" in fixed


def test_a_transformer_with_a_conv_patch_embedding_is_no_convnet(audited):
    result, models, fixes, _ = audited
    [profile] = next(m.profiles for path, m in models.items() if path.endswith("patch_transformer.py"))
    assert not profile.is_convnet and profile.conv_share < 0.1
    rules = _rules(result, "patch_transformer.py")
    assert "TC302" not in rules and "TC303" not in rules  # the script's text alone reports both
    [tc305] = [f for f in result.findings if f.rule == "TC305" and f.location.path.endswith("patch_transformer.py")]
    assert "GPT-2" in tc305.explanation and "in convolutions" in tc305.explanation
    assert "channels_last" not in fixes["patch_transformer.py"].fixed


@pytest.mark.parametrize("name", ["factory_convnet.py", "patch_transformer.py"])
def test_scan_promises_what_fix_does_with_the_audit(audited, name):
    result, _, fixes, settings = audited
    fixed = fixes[name]
    assert fixed.error is None
    promised = {
        f.rule for f in result.findings
        if Path(f.location.path).name == name and f.fix is not None and f.fix.available
        and fix_enabled(f, CLASSES, settings.structural_fixes)
    }
    assert promised == set(fixed.applied)
    assert not promised & {finding.rule for finding, _ in fixed.declined}
