"""TC4 (input pipeline) rules on whole training scripts: the exact (rule, line) findings of every
fixtures/scripts/tc4_*.py, the fixes they record and the ones they decline."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import scan_code, scan_paths
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.script.facts import ScriptFacts
from tcaudit.rules.registry import context as rule_context
from tcaudit.rules.registry import discover_script_rules
from tcaudit.rules.pipeline.tc401_dataloader_no_workers import WORKERS
from tcaudit.source.parsing import read_source

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
TC4_RULES = ("TC401", "TC402", "TC403", "TC404", "TC405", "TC406")

EXPECTED = {
    # **train_kwargs with cuda_kwargs merged in (workers, pinning set); copies in train() block.
    "tc4_mnist_kwargs.py": [("TC403", 33), ("TC403", 33), ("TC404", 76)],
    # every default left; only the training loader/dataset, not the validation ones.
    # TC404 too: TC401's fix gives the loader workers, which the same fix run then keeps alive.
    "tc4_imagenet_naive.py": [
        ("TC401", 48), ("TC402", 48), ("TC403", 54), ("TC403", 55), ("TC404", 48), ("TC405", 40), ("TC406", 37),
    ],
    # module level, no main guard: TC401 is reported with its fix declined.
    "tc4_no_main_guard.py": [("TC401", 17), ("TC402", 17), ("TC403", 44), ("TC403", 44)],
    # helper-built loader, custom loader class, batch_sampler loader, next(it) loop.
    "tc4_helpers_custom.py": [("TC402", 51), ("TC403", 68), ("TC404", 51)],
    # NestedTensor and pack_padded_sequence batches behind custom collate_fns: nothing.
    "tc4_nontensor_batches.py": [],
    # GPU / in-memory / unsharded iterable datasets silent; factories then .cuda()/.to().
    "tc4_datasets_and_factories.py": [
        ("TC401", 50), ("TC402", 50), ("TC406", 37), ("TC406", 45), ("TC406", 46), ("TC406", 52), ("TC406", 53),
    ],
    # accelerate prepares and moves batches; the loader is tuned.
    "tc4_accelerate.py": [],
}
# The TC3 fixtures seen through the TC4 rules: the tuned, Lightning, CPU-only and inference scripts.
EXPECTED_TC3_FIXTURES = {
    "tc3_tuned.py": [],
    "tc3_lightning.py": [],
    "tc3_cpu_only.py": [],
    "tc3_inference.py": [],
    "tc3_resnet_amp_nchw.py": [],
    "tc3_fp32_gpt_debug.py": [],
    "tc3_seeded_unet.py": [],
    "tc3_trainer_class.py": [],
}


def _findings(name: str):
    return scan_paths([str(SCRIPTS / name)], select=("TC4",)).findings


def _one(name: str, rule: str, line: int | None = None):
    hits = [f for f in _findings(name) if f.rule == rule and (line is None or f.location.line == line)]
    assert hits, (name, rule, line)
    return hits[0]


def test_every_tc4_fixture_has_expectations():
    assert sorted(p.name for p in SCRIPTS.glob("tc4_*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(EXPECTED_TC3_FIXTURES))
def test_fixture_findings(name):
    expected = {**EXPECTED, **EXPECTED_TC3_FIXTURES}[name]
    assert sorted((f.rule, f.location.line) for f in _findings(name)) == sorted(expected)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_triggers_hide_nothing(name):
    source = read_source(SCRIPTS / name, name)
    facts = ScriptFacts(source)
    context = rule_context(Settings())  # the rules quote figures for settings.gpu
    rules = discover_script_rules()
    for rule_id in TC4_RULES:
        rule = rules[rule_id]()
        if list(rule.check(facts, context)):
            assert rule.may_match(source.text), rule_id


def test_no_main_guard_declines_the_workers_fix_but_not_pinning():
    workers = _one("tc4_no_main_guard.py", "TC401")
    assert workers.fix.available is False
    assert "__main__" in workers.fix.reason and "spawn" in workers.fix.reason
    pin = _one("tc4_no_main_guard.py", "TC402")
    assert pin.fix.available is True
    assert pin.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "pin_memory", "value": "True", "imports": []}


def test_workers_fix_under_a_main_guard():
    finding = _one("tc4_imagenet_naive.py", "TC401")
    assert finding.fix.available is True
    assert finding.fix.fix_class == FixClass.NUMERICS
    # The script imports os already: nothing to import.
    assert finding.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "num_workers", "value": WORKERS, "imports": []}


def test_workers_fix_imports_os_where_the_script_does_not(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch

        def main():
            loader = torch.utils.data.DataLoader(ds, batch_size=64, pin_memory=True)
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """,
        select=("TC401",),
    )
    (finding,) = result.findings
    assert finding.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "num_workers", "value": WORKERS, "imports": ["os"]}


def test_os_bound_to_something_else_declines_the_workers_fix_at_scan(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        os = "linux"

        def main():
            loader = torch.utils.data.DataLoader(ds, batch_size=64, pin_memory=True)
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """,
        select=("TC401",),
    )
    (finding,) = result.findings
    assert finding.fix.available is False
    assert finding.fix.reason == "the name `os` is bound to something else in this file"


LOADER_WITHOUT_WORKERS = """
    import os
    import torch

    def main():
        loader = torch.utils.data.DataLoader(ds, batch_size=64, pin_memory=True)
        for epoch in range(10):
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()

    if __name__ == "__main__":
        main()
    """


def test_persistent_workers_reported_where_the_workers_fix_adds_workers(tmp_path):
    """Issue 13 item 4 (F9): fix applied TC404 after TC401's fix added workers; scan reports it too."""
    result = scan_code(tmp_path, LOADER_WITHOUT_WORKERS, select=("TC4",))
    assert sorted((f.rule, f.location.line) for f in result.findings) == [("TC401", 5), ("TC404", 5)]
    persistent = next(f for f in result.findings if f.rule == "TC404")
    assert "with workers (TC401), also pass `persistent_workers=True`" in persistent.message
    assert persistent.fix.available is True and persistent.fix.fix_class == FixClass.NUMERICS
    assert persistent.fix.plan.to_dict() == {
        "kind": "add-kwarg", "key": "persistent_workers", "value": "True", "after": "TC401",
    }


@pytest.mark.parametrize(
    "select,ignore",
    [(("TC404",), ()), (("TC4",), ("TC401",))],
    ids=["only-TC404-selected", "TC401-ignored"],
)
def test_persistent_workers_not_reported_when_tc401_does_not_run(tmp_path, select, ignore):
    result = scan_code(tmp_path, LOADER_WITHOUT_WORKERS, select=select, ignore=ignore)
    assert result.findings == []


def test_persistent_workers_not_reported_when_the_workers_fix_is_declined(tmp_path):
    code = LOADER_WITHOUT_WORKERS.replace('    if __name__ == "__main__":\n        main()\n', "    main()\n")
    assert "__main__" not in code
    result = scan_code(tmp_path, code, select=("TC4",))
    assert [(f.rule, f.fix.available) for f in result.findings] == [("TC401", False)]


def test_conditional_workers_decline_persistent_workers():
    finding = _one("tc4_mnist_kwargs.py", "TC404")
    assert finding.severity == Severity.INFO
    assert finding.fix.available is False
    assert "ValueError" in finding.fix.reason


def test_literal_workers_allow_persistent_workers():
    finding = _one("tc4_helpers_custom.py", "TC404")
    assert finding.fix.available is True
    assert finding.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "persistent_workers", "value": "True", "imports": []}


def test_flag_workers_make_persistent_workers_conditional(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=args.workers, pin_memory=True)
        for epoch in range(10):
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
        """,
        select=("TC4",),
    )
    (finding,) = result.findings
    assert finding.rule == "TC404"
    assert finding.fix.plan.value == "args.workers > 0"


def test_kwargs_dict_holding_the_key_declines_the_fix(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader

        def main():
            loader_kwargs = {"batch_size": 64, "num_workers": 0, "pin_memory": False}
            loader = DataLoader(train_set, **loader_kwargs)
            for x, y in loader:
                loss = model(x.cuda()).mean()
                loss.backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """,
        select=("TC401", "TC402"),
    )
    assert sorted((f.rule, f.location.line) for f in result.findings) == [("TC401", 6), ("TC402", 6)]
    for finding in result.findings:
        assert finding.fix.available is False
        assert "TypeError" in finding.fix.reason
        assert "the `loader_kwargs` dict passed as **loader_kwargs" in finding.fix.reason
        assert finding.fix.plan is None


def test_kwargs_built_with_dict_update_and_subscripts(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader as DL
        kwargs = dict(batch_size=64)
        kwargs.update(num_workers=8)
        kwargs["pin_memory"] = True
        kwargs.setdefault("persistent_workers", True)
        loader = DL(ds, **kwargs)
        for epoch in range(3):
            for x, y in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
        """,
        select=("TC4",),
    )
    assert result.findings == []


def test_custom_loader_named_dataloader_is_not_torch(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        from mylib import DataLoader
        loader = DataLoader(ds, batch_size=64)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            opt.step()
        """,
        select=("TC4",),
    )
    assert result.findings == []


def test_blocking_copy_fix_and_hint():
    finding = _one("tc4_imagenet_naive.py", "TC403", 54)
    assert finding.fix.fix_class == FixClass.SAFE
    assert finding.fix.plan.to_dict() == {"kind": "add-kwarg", "key": "non_blocking", "value": "True", "imports": []}
    assert "pin_memory=True" in finding.explanation  # the hint: the message says what and where


def test_created_then_moved_severity_follows_repetition():
    by_line = {f.location.line: f for f in _findings("tc4_datasets_and_factories.py") if f.rule == "TC406"}
    assert by_line[37].severity == Severity.WARNING  # in forward
    assert by_line[52].severity == Severity.WARNING  # in the training loop
    assert by_line[45].severity == Severity.INFO  # set-up
    assert "device=device" in by_line[53].explanation
    assert by_line[52].fix.plan.to_dict() == {"kind": "move-device-into-factory", "device": '"cuda"', "method": "cuda"}


def test_factory_fold_declined_at_scan_when_the_tensor_requires_grad(tmp_path):
    result = scan_code(
        tmp_path,
        """
        import torch
        w = torch.ones(8, requires_grad=True).cuda()
        b = torch.zeros(8).to("cuda", dtype=torch.half)
        """,
        select=("TC406",),
    )
    by_line = {f.location.line: f.fix for f in result.findings}
    assert not by_line[2].available and "requires grad" in by_line[2].reason
    assert not by_line[3].available and by_line[3].reason == "`.to()` also changes the dtype or layout; fold it by hand"


def test_cpu_decode_is_info_and_structural():
    finding = _one("tc4_imagenet_naive.py", "TC405")
    assert finding.severity == Severity.INFO
    assert finding.fix.fix_class == FixClass.STRUCTURAL
