"""TC3 (backend and compilation) rules on whole training scripts: the exact (rule, line) findings
of every fixtures/scripts/tc3_*.py, and the decisions the rules make about them."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import scan_code, scan_paths
from tcaudit.catalog import load_catalog
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.registry import context as rule_context
from tcaudit.rules.registry import discover_script_rules
from tcaudit.source.parsing import read_source

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
MY_RULES = ("TC301", "TC302", "TC303", "TC305", "TC306", "TC307")

EXPECTED = {
    # model.half() training on GPU 0 by number: no TF32 advice (TC301); never compiled (TC305)
    "tc3_half_model.py": [("TC305", 7)],
    # torchvision ResNet under bf16 autocast (behind --amp), NCHW, SGD, eager; TF32 not reported (AMP).
    "tc3_resnet_amp_nchw.py": [("TC302", 51), ("TC303", 51), ("TC305", 51), ("TC307", 54)],
    # fp32 GPT, anomaly detection and an unscheduled profiler left on; `compile = True` compiles nothing.
    "tc3_fp32_gpt_debug.py": [("TC301", 85), ("TC305", 66), ("TC306", 26), ("TC306", 77), ("TC307", 67)],
    # benchmark=False under --seed, allow_tf32=False, foreach=False: deliberate, not reported.
    "tc3_seeded_unet.py": [("TC303", 58), ("TC305", 58)],
    # model from a factory, step split over methods; emit_nvtx around fit(); the rest behind flags.
    "tc3_trainer_class.py": [("TC302", 43), ("TC305", 43), ("TC306", 87)],
    # Lightning owns the loop: the module-level anomaly switch is plainly user code; the LightningModule given
    # to fit is never compiled (TC305, issue 47: declined, it defines no forward).
    "tc3_lightning.py": [("TC305", 55), ("TC306", 15), ("TC307", 36)],
    "tc3_tuned.py": [],
    "tc3_cpu_only.py": [],
    "tc3_inference.py": [],
}


def _findings(name: str, select: tuple[str, ...] = ("TC3",)):
    result = scan_paths([str(SCRIPTS / name)], select=select)
    return [f for f in result.findings if f.rule != "TC304" or "TC304" in select]


def test_every_tc3_fixture_has_expectations():
    assert sorted(p.name for p in SCRIPTS.glob("tc3_*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_findings(name):
    found = sorted((f.rule, f.location.line) for f in _findings(name) if f.rule in MY_RULES)
    assert found == sorted(EXPECTED[name])


def test_tuned_script_is_silent_for_tc3_and_tc4():
    assert [(f.rule, f.location.line) for f in _findings("tc3_tuned.py", ("TC3", "TC4"))] == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_triggers_hide_nothing(name):
    """Running every rule without its trigger finds nothing the engine (with triggers) did not."""
    source = read_source(SCRIPTS / name, name)
    facts = ScriptFacts(source)
    context = rule_context(Settings())  # the rules quote figures for settings.gpu
    rules = discover_script_rules()
    for rule_id in MY_RULES:
        rule = rules[rule_id]()
        direct = list(rule.check(facts, context))
        if direct:
            assert rule.may_match(source.text), rule_id


def test_tf32_finding_is_info_for_a_convnet_and_anchored_after_the_imports(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        import torchvision

        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """,
        select=("TC301",),
    )
    (finding,) = result.findings
    assert finding.severity == Severity.INFO
    assert finding.location.line == 8
    assert finding.fix.fix_class == FixClass.NUMERICS
    assert finding.fix.plan.to_dict() == {
        "kind": "insert-statement",
        "after_line": 2,
        "code": 'torch.set_float32_matmul_precision("high")',
        "imports": ["torch"],
    }


def test_tf32_finding_is_a_warning_for_a_transformer(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(512, 8), 6).cuda()
        opt = torch.optim.AdamW(model.parameters(), fused=True)
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """,
        select=("TC301",),
    )
    assert [f.severity for f in result.findings] == [Severity.WARNING]
    assert load_catalog()["TC301"].severity == Severity.WARNING


def test_channels_last_fix_names_the_model_line(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        from torchvision.models import resnet50 as build
        net = build(
            num_classes=10,
        ).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = net(x.cuda()).mean()
            loss.backward()
            opt.step()
        """,
        select=("TC303",),
    )
    (finding,) = result.findings
    assert finding.location.line == 3
    assert finding.fix.plan.line == 5
    assert finding.fix.plan.code == "net = net.to(memory_format=torch.channels_last)"


def test_compile_fix_compiles_in_place_when_the_builtin_is_shadowed():
    (finding,) = [f for f in _findings("tc3_fp32_gpt_debug.py") if f.rule == "TC305"]
    assert finding.severity == Severity.INFO
    assert finding.fix.fix_class == FixClass.STRUCTURAL
    assert finding.fix.plan.code == "model.compile()"


def test_unfused_optimizer_is_info_and_adds_fused(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        model = Net().cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """,
        select=("TC307",),
    )
    (finding,) = result.findings
    assert finding.severity == Severity.INFO
    assert "fused=True" in finding.message
    assert finding.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "fused", "value": "True"}


@pytest.mark.parametrize(
    "guard",
    [
        "if args.debug:\n    torch.autograd.set_detect_anomaly(True)",
        "torch.autograd.set_detect_anomaly(args.debug)",
        "if cfg.debug: torch.autograd.set_detect_anomaly(True)",
        "try:\n    import apex\nexcept ImportError:\n    torch.autograd.set_detect_anomaly(True)",
    ],
)
def test_debug_mode_behind_a_flag_is_deliberate(tmp_path, guard):
    code = "import torch\n" + guard + "\nfor x in loader:\n    loss = model(x.cuda()).mean()\n    loss.backward()\n    opt.step()\n"
    assert scan_code(tmp_path, code, select=("TC306",)).findings == []


def test_debug_mode_under_the_main_guard_is_still_on(tmp_path):
    code = """
    import torch

    def main():
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()

    if __name__ == "__main__":
        torch.autograd.set_detect_anomaly(True)
        main()
    """
    result = scan_code(tmp_path, code, select=("TC306",))
    assert [(f.rule, f.location.line) for f in result.findings] == [("TC306", 10)]
    assert result.findings[0].fix.fix_class == FixClass.SAFE


RESNET50 = Path(__file__).resolve().parent.parent / "fixtures" / "resnet50" / "train.py"


def test_channels_last_is_offered_before_autocast_when_tc201_will_add_it():
    """Issue 13 item 4: the naive ResNet50 has no autocast yet; TC201's fix adds fp16 autocast, so
    channels_last (its largest single win on Hopper) shows in scan, fixable, and fix applies it."""
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    result = scan_paths([str(RESNET50)], select=("TC201", "TC303", "TC307"))
    by_rule = {f.rule: f for f in result.findings}
    tc303 = by_rule["TC303"]
    assert tc303.message.startswith("with autocast (TC201), also channels_last:")
    assert tc303.fix.available and tc303.fix.plan.code == "model = model.to(memory_format=torch.channels_last)"
    # Fused SGD under the GradScaler that TC201's fix adds is declined at detection, not by the fix.
    assert not by_rule["TC307"].fix.available and "GradScaler" in by_rule["TC307"].fix.reason
    fixed = fix_file(RESNET50, Settings(select=("TC201", "TC303")))
    assert "TC303" in fixed.applied
    assert "model = model.to(memory_format=torch.channels_last)" in fixed.fixed


def test_channels_last_waits_for_autocast_when_tc201_is_off(tmp_path):
    result = scan_paths([str(RESNET50)], select=("TC303",))
    assert not result.findings


def test_a_legacy_jit_flag_that_tc304_deletes_does_not_silence_tc305(tmp_path):
    code = """
        import torch
        torch._C._jit_set_profiling_executor(False)
        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """
    result = scan_code(tmp_path, code, select=("TC304", "TC305"))
    assert sorted(f.rule for f in result.findings) == ["TC304", "TC305"]
    # A flag whose result is used stays (TC304 declines it), and it still counts as deliberate.
    used = code.replace("torch._C._jit_set_profiling_executor(False)", "old = torch._C._jit_set_profiling_executor(False)")
    result = scan_code(tmp_path, used, select=("TC304", "TC305"))
    (finding,) = result.findings
    assert finding.rule == "TC304" and not finding.fix.available
