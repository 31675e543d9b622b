"""The rules added for issue 18 (TC209, TC210, TC212, TC310, TC605, TC606) on whole scripts: every
`# expect:` line of their fixtures fires, nothing else of these rules does (the decoys stay silent),
and which findings offer a fix and which decline it, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from expectations import expected_findings
from helpers import scan_code, scan_paths

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
RULES = ("TC209", "TC210", "TC212", "TC310", "TC605", "TC606")
FIXTURES = sorted(
    p for p in SCRIPTS.glob("tc*.py") if p.name.split("_")[0].upper() in RULES
)


def test_every_new_rule_has_a_fixture_script():
    assert {p.name.split("_")[0].upper() for p in FIXTURES} == set(RULES)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_findings(path):
    result = scan_paths([str(path)], select=RULES)
    actual = {(f.rule, f.location.line) for f in result.findings}
    assert actual == expected_findings(path, RULES), "\n".join(
        f"{f.rule}:{f.location.line} {f.message}" for f in result.findings
    )


def _fixes(name: str, rule: str) -> dict[int, str | None]:
    """line → None when the fix is offered, else the decline reason."""
    result = scan_paths([str(SCRIPTS / name)], select=(rule,))
    return {f.location.line: (None if f.fix.available else f.fix.reason) for f in result.findings}


def test_tc210_declines_a_dict_built_elsewhere_and_a_helper_without_the_scaler():
    fixes = _fixes("tc210_checkpointing.py", "TC210")
    assert fixes[37] is None
    assert "not written as a literal" in fixes[39]
    assert "`save_checkpoint`, where `scaler` is not visible" in fixes[11]


def test_tc210_declines_a_scaler_created_after_the_save(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "init.pt")
        scaler = torch.amp.GradScaler("cuda")
    """, select=("TC210",))
    [finding] = result.findings
    assert "created after the checkpoint is saved" in finding.fix.reason


def test_tc209_declines_master_params():
    assert "apex.amp.master_params" in _fixes("tc209_apex_imagenet.py", "TC209")[46]


@pytest.mark.parametrize("code, reason", [
    ('model, optimizer = amp.initialize(model, optimizer, opt_level="O3")', "opt_level='O3'"),
    ("model, optimizer = amp.initialize(model, [opt_a, opt_b], opt_level='O1')", "lists of models or optimizers"),
    ("model, optimizer = amp.initialize(model, optimizer, opt_level='O2', keep_batchnorm_fp32=True)", "keep_batchnorm_fp32"),
])
def test_tc209_declines_what_torch_amp_cannot_express(tmp_path, code, reason):
    result = scan_code(tmp_path, f"""
        import torch
        from apex import amp
        {code}
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """, select=("TC209",))
    [finding] = result.findings
    assert reason in finding.fix.reason


def test_tc209_keeps_renamed_targets_bound(tmp_path):
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    path = tmp_path / "train.py"
    path.write_text(
        "import torch\nfrom apex import amp\n"
        "net, opt = amp.initialize(model, optimizer, opt_level='O1')\n"
        "for x in loader:\n"
        "    loss = net(x).sum()\n"
        "    with amp.scale_loss(loss, opt) as scaled_loss:\n"
        "        scaled_loss.backward()\n"
        "    opt.step()\n",
        encoding="utf-8",
    )
    result = fix_file(path, Settings(select=("TC209",)))
    assert result.fixed == (
        "import torch\n"
        "net, opt = model, optimizer\n"
        'scaler = torch.amp.GradScaler("cuda", enabled=True)\n'
        "for x in loader:\n"
        '    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n'
        "        loss = net(x).sum()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
    )


def test_tc606_leaves_a_loop_that_takes_gradients_alone():
    fixes = _fixes("tc606_eval_loops.py", "TC606")
    assert 46 not in fixes  # the saliency loop: torch.autograd.grad needs autograd
    assert fixes and all(reason is None for reason in fixes.values())


def test_tc310_only_when_the_script_compiles_or_compile_is_asked_for(tmp_path):
    code = """
        import torch.nn as nn

        class Net(nn.Module):
            def forward(self, x):
                return x / x.norm().item()

        model = Net()
    """
    assert scan_code(tmp_path, code, select=("TC310",)).findings == []
    result = scan_code(tmp_path, code, select=("TC310",), structural_fixes=("compile",))
    [finding] = result.findings
    assert "tcaudit fix --compile" in finding.explanation


def test_tc210_reports_a_checkpoint_name_rebound_before_the_save(tmp_path):
    """nanoGPT: ``checkpoint`` holds the loaded checkpoint, then None, then the dict saved in the loop;
    the dict bound just before the save is what is saved. The fix still edits only a literal in the call."""
    result = scan_code(tmp_path, """
        import torch
        scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
        if init_from == "resume":
            checkpoint = torch.load(ckpt_path)
            optimizer.load_state_dict(checkpoint["optimizer"])
        checkpoint = None
        while True:
            if iter_num % eval_interval == 0:
                checkpoint = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
                torch.save(checkpoint, "ckpt.pt")
            train_step(scaler)
    """, select=("TC210",))
    [finding] = result.findings
    assert finding.location.line == 10
    assert "not written as a literal" in finding.fix.reason


def test_tc210_a_rebound_name_whose_last_value_is_not_a_dict_is_not_reported(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        scaler = torch.amp.GradScaler("cuda")
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        state = make_state(model, optimizer, scaler)
        torch.save(state, "ckpt.pt")
    """, select=("TC210",))
    assert result.findings == []
