"""Cross-rule declines: a fix declined to keep the script out of a situation stops every other rule's
edit that would bring it about, at detection (so scan says so) and in the fix engine (an edit that
raises the situation's count is not kept, in this round or a later one)."""

from __future__ import annotations

import textwrap

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.findings import Finding, Fix, FixClass, FixPlan, Location, Severity, Situation, SituationKind
from tcaudit.fix.engine import fix_file
from tcaudit.rules.situations import block_created, covers, instances
from tcaudit.script.facts import ScriptFacts
from tcaudit.source.parsing import SourceFile

UNDER_AUTOCAST = SituationKind.RUNS_UNDER_AUTOCAST


class _Creates(FixPlan):
    def __init__(self, *situations: Situation) -> None:
        self.situations = situations

    def creates(self) -> tuple[Situation, ...]:
        return self.situations


def _finding(rule: str, fix: Fix) -> Finding:
    return Finding(rule, rule.lower(), Severity.WARNING, Location("t.py", 1, 1, 1, 2), f"{rule} here", fix=fix)


def _declined(rule: str, *protects: Situation) -> Finding:
    return _finding(rule, Fix(FixClass.NUMERICS, "d", available=False, reason="cannot", protects=protects))


def _creating(rule: str, *creates: Situation) -> Finding:
    plan = _Creates(*creates)
    return _finding(rule, Fix(FixClass.NUMERICS, "d", plan=plan, creates=plan.creates()))


def test_a_fix_that_creates_a_protected_situation_is_declined_with_the_situation_and_the_rule():
    helper = Situation(UNDER_AUTOCAST, "compute_loss")
    out = block_created([_declined("TC208", helper), _creating("TC201", helper)])
    blocked = out[1].fix
    assert not blocked.available and blocked.plan is None and blocked.creates == ()
    assert blocked.reason == ("it would bring about `compute_loss` running under autocast, which TC208 declined "
                              "to fix (cannot)")


def test_only_the_same_situation_of_another_rule_blocks():
    helper = Situation(UNDER_AUTOCAST, "compute_loss")
    other_helper = Situation(UNDER_AUTOCAST, "decode")
    findings = [
        _declined("TC208", helper),
        _creating("TC201", other_helper),  # another subject
        _creating("TC208", helper),  # the declining rule's own fix: it already respects its decline
        _creating("TC307", Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER)),  # another kind
    ]
    assert [f.fix.available for f in block_created(findings)] == [False, True, True, True]


def test_a_situation_of_the_whole_file_covers_every_subject():
    whole = Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER)
    assert covers(whole, Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER, "opt"))
    assert covers(Situation(UNDER_AUTOCAST, "f"), Situation(UNDER_AUTOCAST))
    assert not covers(Situation(UNDER_AUTOCAST, "f"), Situation(UNDER_AUTOCAST, "g"))


def _facts(code: str) -> ScriptFacts:
    from pathlib import Path

    text = textwrap.dedent(code).lstrip()
    return ScriptFacts(SourceFile(path=Path("t.py"), display_path="t.py", raw=text.encode(), text=text, encoding="utf-8"))


def test_calls_under_autocast_are_counted_directly_and_through_a_caller():
    facts = _facts('''
        import torch

        def loss_fn(p, y):
            return torch.nn.functional.binary_cross_entropy(p, y)

        def step(x, y):
            return loss_fn(model(x), y)

        with torch.autocast("cuda"):
            loss_fn(p, y)
            step(x, y)
        loss_fn(p, y)
    ''')
    assert instances(Situation(UNDER_AUTOCAST, "loss_fn"), facts) == 2
    assert instances(Situation(UNDER_AUTOCAST, "step"), facts) == 1


def test_fused_sgd_counts_only_beside_a_gradscaler():
    plain = _facts('''
        import torch
        opt = torch.optim.SGD(params, lr=0.1, fused=True)
    ''')
    scaled = _facts('''
        import torch
        opt = torch.optim.SGD(params, lr=0.1, fused=True)
        other = torch.optim.SGD(params, lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
    ''')
    situation = Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER)
    assert (instances(situation, plain), instances(situation, scaled)) == (0, 1)


SPARSE_HELPER = '''
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
adj = torch.eye(16, device=device).to_sparse()
model = nn.Linear(8, 4).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")


def propagate(x):
    return torch.sparse.mm(adj, model(x))


def pretrain_step(x):
    with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=device.type == "cuda"):
        loss = propagate(x).pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def finetune_step(x):
    loss = propagate(x).abs().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


for epoch in range(2):
    x = torch.randn(16, 8, device=device)
    pretrain_step(x)
    finetune_step(x)
'''


def test_tc208s_sparse_decline_records_the_helper_it_protects(tmp_path):
    result = scan_code(tmp_path, SPARSE_HELPER, select=("TC208",))
    (finding,) = result.findings
    assert not finding.fix.available
    assert finding.fix.protects == (Situation(UNDER_AUTOCAST, "propagate"),)


def test_the_fix_engine_refuses_an_autocast_wrap_that_puts_the_protected_helper_under_autocast(tmp_path):
    """TC201's plan does not say it wraps a call of `propagate`; counting the calls under autocast
    before and after its edit catches it, and the file is left as it was."""
    path = tmp_path / "train.py"
    path.write_text(SPARSE_HELPER.lstrip(), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC201", "TC208"), root=tmp_path))
    assert not result.changed
    reasons = {finding.rule: reason for finding, reason in result.declined}
    assert reasons["TC201"] == ("it would bring about `propagate` running under autocast, which TC208 declined "
                                "to fix (which inputs are sparse is not visible statically)")


def test_scan_declines_the_same_wrap_at_detection(tmp_path):
    """TC201's plan says which functions its wrap puts under autocast, so scan promises what fix does."""
    result = scan_code(tmp_path, SPARSE_HELPER, select=("TC201", "TC208"))
    [tc201] = [f for f in result.findings if f.rule == "TC201"]
    assert not tc201.fix.available
    assert tc201.fix.reason == ("it would bring about `propagate` running under autocast, which TC208 declined "
                                "to fix (which inputs are sparse is not visible statically)")


def test_without_the_decline_the_same_wrap_is_made(tmp_path):
    """The refusal above comes from TC208's decline, not from TC201: without TC208 the wrap is made."""
    path = tmp_path / "train.py"
    path.write_text(SPARSE_HELPER.lstrip(), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC201",), root=tmp_path))
    assert result.applied == ["TC201"]


def test_tc307s_scaler_decline_protects_against_fused_sgd_under_a_gradscaler(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x.cuda()).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    ''', select=("TC307",))
    (finding,) = result.findings
    assert not finding.fix.available and "NaN" in finding.fix.reason
    assert finding.fix.protects == (Situation(SituationKind.FUSED_SGD_UNDER_GRADSCALER),)


# -- an edit after a return ------------------------------------------------------------------------------

CONVNET_MAIN = '''
import torch
import torch.nn as nn


def main(loader):
    model = nn.Conv2d(3, 8, 3).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        loss = model(x.cuda()).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model
'''


def test_an_edit_that_lands_after_a_return_is_not_kept(tmp_path, monkeypatch):
    """Whatever a codemod plans, the engine refuses an edit that adds statements nobody reaches."""
    import libcst as cst

    import tcaudit.fix.engine as engine
    from tcaudit.rules.base import Codemod

    class AfterTheReturn(Codemod):
        rule = "TC301"

        def apply(self, module, findings, context):
            main = module.body[-1]
            body = list(main.body.body) + [cst.parse_statement('torch.set_float32_matmul_precision("high")\n')]
            return module.with_changes(body=[*module.body[:-1], main.with_changes(body=main.body.with_changes(body=body))])

    monkeypatch.setattr(engine, "discover_codemods", lambda: {"TC301": AfterTheReturn})
    path = tmp_path / "train.py"
    path.write_text(CONVNET_MAIN.lstrip(), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC301",), root=tmp_path))
    assert not result.changed
    ((finding, reason),) = result.declined
    assert finding.rule == "TC301" and reason.startswith("the edit would land after a `return`")


def test_unreachable_statements_are_counted_per_block():
    import libcst as cst

    from tcaudit.script.guards import unreachable_statements

    module = cst.parse_module(textwrap.dedent('''
        def f(x):
            for item in x:
                if item:
                    continue
                    print(item)
                break
            return x
            print(x)
            print(x)
        raise SystemExit
    ''').lstrip())
    assert unreachable_statements(module) == 3


# -- a name used before its import -------------------------------------------------------------------------


def test_an_edit_that_uses_a_name_before_its_import_is_not_kept(tmp_path, monkeypatch):
    """A setting written above the line that imports what it names raises NameError at start-up."""
    import libcst as cst

    import tcaudit.fix.engine as engine
    from tcaudit.rules.base import Codemod

    class AboveTheImport(Codemod):
        rule = "TC301"

        def apply(self, module, findings, context):
            setting = cst.parse_statement('torch.set_float32_matmul_precision("high")\n')
            return module.with_changes(body=[setting, *module.body])

    monkeypatch.setattr(engine, "discover_codemods", lambda: {"TC301": AboveTheImport})
    path = tmp_path / "train.py"
    path.write_text(CONVNET_MAIN.lstrip(), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC301",), root=tmp_path))
    assert not result.changed
    ((finding, reason),) = result.declined
    assert reason == "the edit would use `torch` before the line that imports it; left unchanged"


def test_names_read_before_their_import_at_module_level():
    import libcst as cst

    from tcaudit.script.guards import used_before_import

    module = cst.parse_module(textwrap.dedent('''
        torch.backends.cudnn.benchmark = True
        def rank():
            return dist.get_rank()  # runs later, after the import
        import torch
        import torch.distributed as dist
        sampler = DistributedSampler(dataset)
        from torch.utils.data import DistributedSampler
        class Model(Base):
            pass
        Base = object  # bound otherwise too: not judged
        import os.path
        print(os.sep)
    ''').lstrip())
    assert used_before_import(module) == {"torch", "DistributedSampler"}
