"""Fixes that never break or mis-train a real script: the failure classes seen on public training
scripts (F1-F8), each in a shape of our own. Exact before/after pairs live in fixtures/fix
(tc205_amp_flag, tc205_trainer_branches); these tests pin the decisions."""

from __future__ import annotations

from pathlib import Path

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

F1_CLIP_AFTER_STEP = '''
import argparse
import torch
from torch.nn.utils import clip_grad_norm_

def train(args, model, loader, optimizer):
    scaler = torch.amp.GradScaler("cuda") if args.amp else None
    for x, y in loader:
        with torch.autocast("cuda", enabled=args.amp):
            loss = model(x.cuda()).sum()
        if args.amp:
            scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
        else:
            loss.backward(); optimizer.step()
        if args.clip > 0:
            clip_grad_norm_(model.parameters(), args.clip)
        optimizer.zero_grad()
'''


def test_f1_a_clip_after_the_step_gets_no_unscale_but_a_finding_of_its_own(tmp_path):
    """Inserting scaler.unscale_ there would raise on the plain path (scaler is None) and, with
    --amp, unscale the next step's gradients a second time: the divergence seen in the field."""
    result = scan_code(tmp_path, F1_CLIP_AFTER_STEP, select=("TC205", "TC213"))
    assert [f.rule for f in result.findings] == ["TC213"]
    assert "optimizer.step()" in result.findings[0].message or "scaler.step" in result.findings[0].message
    fixed = fix_file(tmp_path / "train.py", Settings(select=("TC205", "TC213"), root=tmp_path))
    assert not fixed.changed


def test_f1_the_plain_arm_of_the_amp_flag_is_never_edited(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        def step(self, loss):
            if self.use_amp:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
    ''', select=("TC205",))
    assert result.findings == []


def test_f1_a_scaled_backward_under_a_condition_that_calls_something_is_declined(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        def step(self, loss):
            if self.amp_enabled():
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
    ''', select=("TC205",))
    (finding,) = result.findings
    assert not finding.fix.available and "condition that calls something" in finding.fix.reason


F2_BCE_HELPER = '''
import torch
import torch.nn as nn

criterion = nn.BCELoss()

def compute_loss(output, target):
    return criterion(torch.sigmoid(output), target)

def train(model, loader, optimizer):
    model.cuda()
    for x, y in loader:
        output = model(x.cuda())
        loss = compute_loss(output, y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_f2_autocast_is_not_wrapped_around_a_bce_helper_that_tc208_cannot_move(tmp_path):
    """TC208 cannot take BCE out of a helper; TC201 wrapping the helper's call in autocast would make
    the script raise on the GPU, so TC201's fix is declined with that reason."""
    result = scan_code(tmp_path, F2_BCE_HELPER, select=("TC201", "TC208"))
    autocast = [f for f in result.findings if f.rule == "TC201"]
    assert autocast and not autocast[0].fix.available
    assert "compute_loss" in autocast[0].fix.reason and "binary cross-entropy" in autocast[0].fix.reason
    fixed = fix_file(tmp_path / "train.py", Settings(select=("TC201", "TC208"), root=tmp_path))
    assert "autocast" not in fixed.fixed


def test_f7_a_seeded_split_keeps_the_cpu_generator(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        torch.manual_seed(0)
        perm = torch.randperm(1000).cuda()
        train_idx, val_idx = perm[:900], perm[900:]
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
    ''', select=("TC406",))
    (finding,) = result.findings
    assert not finding.fix.available and "other numbers" in finding.fix.reason


def test_f5_ddp_conversion_waits_for_the_rank0_checkpoint_before_anyone_reloads_it(tmp_path):
    """Saving on rank 0 only, then reloading the checkpoint on every rank for evaluation, raced:
    rank 1 opened the file before rank 0 had written it. A barrier follows the save."""
    path = tmp_path / "train.py"
    path.write_text('''
import torch
from torch import nn


def main():
    model = nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    for (x,) in loader:
        loss = model(x.cuda()).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), "checkpoint.pt")
    best = nn.Linear(4, 1)
    best.load_state_dict(torch.load("checkpoint.pt"))


if __name__ == "__main__":
    main()
'''.lstrip(), encoding="utf-8")
    result = fix_file(path, Settings(select=("TC505",), structural_fixes=("ddp",), root=tmp_path))
    assert result.applied, result.declined
    lines = [line.strip() for line in result.fixed.splitlines()]
    save = lines.index('torch.save(model.module.state_dict(), "checkpoint.pt")')
    assert lines[save - 1] == "if dist.get_rank() == 0:" and lines[save + 1] == "dist.barrier()"


# -- each edit in its anchor's branch, only where the objects it names exist ------------------------------
# Exact before/after pairs: fixtures/fix/tc210_amp_branch, tc204_amp_flag_arm, all_flag_paths,
# all_try_return (each also runs in the oracle, tests/test_oracle.py).

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"


def test_a_scaler_set_in_one_arm_of_init_is_not_saved_from_another_method():
    """`self.scaler` exists only when `use_amp` was true in `__init__`; `save` naming it raises
    AttributeError on the plain path, and `use_amp` is a local of `__init__`, not testable in `save`."""
    path = FIXTURES / "tc210_trainer_branch.in.py"
    result = fix_file(path, Settings(select=("TC210",)))
    assert not result.changed
    (reason,) = [why for finding, why in result.declined if finding.rule == "TC210"]
    assert "`self.scaler` exists only under the `if` on line 18" in reason
    assert path.with_name("tc210_trainer_branch.out.py").read_bytes() == path.read_bytes()


def test_a_scaler_made_on_both_arms_is_saved_with_its_none_test_only(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        def train(args, model, optimizer, loader):
            if args.amp:
                scaler = torch.amp.GradScaler("cuda")
            else:
                scaler = None
            for x in loader:
                loss = model(x.cuda()).sum()
                scaler.scale(loss).backward() if scaler is not None else loss.backward()
                optimizer.step()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
    ''', select=("TC210",))
    (finding,) = result.findings
    assert finding.fix.plan.value == "scaler.state_dict() if scaler is not None else None"


def test_a_scaler_made_on_the_other_arm_is_not_saved_there(tmp_path):
    result = scan_code(tmp_path, '''
        import torch
        def train(args, model, optimizer, loader):
            if args.amp:
                scaler = torch.amp.GradScaler("cuda")
            else:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
    ''', select=("TC210",))
    (finding,) = result.findings
    assert not finding.fix.available and "the other arm of the `if` on line 3" in finding.fix.reason


def test_an_fp16_autocast_under_a_test_the_loop_changes_gets_no_scaler(tmp_path):
    """The scaler is made before the loop; a flag the loop itself assigns cannot be read there."""
    result = scan_code(tmp_path, '''
        import torch
        def train(model, optimizer, loader):
            for i, x in enumerate(loader):
                warm = i < 10
                if not warm:
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = model(x.cuda()).sum()
                else:
                    loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
    ''', select=("TC204",))
    (finding,) = result.findings
    assert not finding.fix.available and "`warm` assigned in the training loop" in finding.fix.reason
