"""Issue 18's remaining TC2/TC4 false alarms and misses on whole scripts: TC206 round trips, TC203 with
``enabled=...``, TC406 through names and slices. Exact fix outputs where a fix is offered, the reason
where it is declined."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.fix.engine import fix_file

from helpers import scan_code, scan_paths

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


def _fixed(tmp_path: Path, code: str, rule: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return fix_file(path, Settings(select=(rule,))).fixed


def _fixes(name: str, rule: str) -> dict[int, str | None]:
    """line → None when the fix is offered, else the decline reason."""
    result = scan_paths([str(SCRIPTS / name)], select=(rule,))
    return {f.location.line: (None if f.fix.available else f.fix.reason) for f in result.findings}


# -- TC206: round trips ------------------------------------------------------------------------------


def test_tc206_a_round_trip_leaves_fp32_training_to_tc201(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        model = Net().cuda().half().float()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            optimizer.step()
    """, select=("TC201", "TC204", "TC206"))
    assert [f.rule for f in result.findings] == ["TC201"]


# -- TC203: enabled=... -------------------------------------------------------------------------------


def test_tc203_fix_removes_a_scaler_enabled_by_a_precision_test(tmp_path):
    assert _fixed(tmp_path, """
        import torch
        dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
        grad_scaler = torch.amp.GradScaler("cuda", enabled=(dtype == torch.float16))
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda()).mean()
            optimizer.zero_grad()
            grad_scaler.scale(loss).backward()
            grad_scaler.unscale_(optimizer)
            grad_scaler.step(optimizer)
            grad_scaler.update()
    """, "TC203") == textwrap.dedent("""
        import torch
        dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda()).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """).lstrip("\n")


def test_tc203_declines_a_scaler_whose_state_is_read():
    fixes = _fixes("tc2_scaler_enabled_flag.py", "TC203")
    assert fixes[21] is None and fixes[32] is None
    assert "get_scale, is_enabled" in fixes[69]


def test_tc203_not_when_the_autocast_dtype_follows_the_same_test(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        dtype = torch.float16 if args.fp16 else torch.bfloat16
        scaler = torch.amp.GradScaler("cuda", enabled=(dtype == torch.float16))
        for x, y in loader:
            with torch.autocast("cuda", dtype=dtype):
                loss = model(x.cuda()).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """, select=("TC203",))
    assert result.findings == []


# -- TC406: through names and slices --------------------------------------------------------------------


def test_tc406_through_names_and_slices_fixture():
    from expectations import expected_findings

    path = SCRIPTS / "tc406_moved_through_names.py"
    result = scan_paths([str(path)], select=("TC406",))
    assert {(f.rule, f.location.line) for f in result.findings} == expected_findings(path, ("TC406",))
    assert all(f.fix.available for f in result.findings)


def test_tc406_fix_folds_the_device_through_a_name_and_a_slice(tmp_path):
    assert _fixed(tmp_path, """
        import torch
        for x, y in loader:
            noise = torch.randn(x.size(0), 100)
            noise = noise.to(device)
            pos = torch.arange(1024)[: x.size(1)].cuda()
            ones = torch.ones(8)
            w = (ones.cuda())
            loss = model(x.cuda(), noise, pos, w).mean()
            loss.backward()
            optimizer.step()
    """, "TC406") == textwrap.dedent("""
        import torch
        for x, y in loader:
            noise = torch.randn(x.size(0), 100, device=device)
            pos = torch.arange(1024, device="cuda")[: x.size(1)]
            ones = torch.ones(8, device="cuda")
            w = (ones)
            loss = model(x.cuda(), noise, pos, w).mean()
            loss.backward()
            optimizer.step()
    """).lstrip("\n")


def test_tc406_not_when_the_device_is_chosen_after_the_tensor_or_it_is_read_elsewhere(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        def setup(args):
            table = torch.zeros(64, 2)
            device = torch.device("cuda", args.local_rank)
            table = table.to(device)
            counts = torch.zeros(10)
            moved = counts.cuda()
            print(counts.sum())
            return table, moved
        for x, y in loader:
            ids = torch.tensor(y.tolist())[:4].cuda()
            loss = model(x.cuda(), ids).mean()
            loss.backward()
            optimizer.step()
    """, select=("TC406",))
    assert result.findings == []


def test_tc406_a_random_sample_drawn_under_no_grad_is_info_and_declined(tmp_path):
    """pytorch/examples vae: after each epoch, ``torch.randn(64, 20).to(device)`` under no_grad decodes
    samples. Not a training step's copy; on the device the draw would leave the CPU generator that the
    next epoch's shuffle uses, so the seeded run would change."""
    result = scan_code(tmp_path, """
        import torch
        device = torch.device("cuda")
        for epoch in range(epochs):
            for x, _ in loader:
                loss = model(x.to(device)).mean()
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                sample = torch.randn(64, 20).to(device)
                zeros = torch.zeros(64, 20).to(device)
                images = model.decode(sample + zeros)
    """, select=("TC406",))
    by_line = {f.location.line: f for f in result.findings}
    sample, zeros = by_line[9], by_line[10]
    assert sample.severity == Severity.INFO and "every step" not in sample.message
    assert not sample.fix.available and "CPU generator" in sample.fix.reason
    # built once per epoch, not per step: info without the "every step" claim, still fixable
    assert zeros.severity == Severity.INFO and "every step" not in zeros.message
    assert zeros.fix.available
