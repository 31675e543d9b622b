"""TC6 (host overhead) on whole training scripts: the exact findings per fixture.

The negatives are most of the work: interval-guarded logging (`if i % log_interval == 0`, nanoGPT's
`if iter_num % log_interval == 0 and master_process`), evaluation loops that sync freely, RL loops
where `env.step(action)` needs host values, Hogwild workers, per-epoch summaries.
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import FIXTURES
from helpers import scan_code, scan_paths

SCRIPTS = FIXTURES / "scripts"

# (rule, line) of every TC6 finding, per fixture; a line twice means two syncs on it.
EXPECTED = {
    "tc5_accelerate.py": [],
    "tc5_dataparallel_ddp_job.py": [],
    "tc5_int_device.py": [],
    "tc5_loader_helpers.py": [],  # evaluate() syncs under no_grad
    "tc5_windows_gloo.py": [],
    "tc5_yolov5_dp_mode.py": [],
    "tc5_frozen_teacher_ema.py": [],
    "tc6_cpu_only.py": [],  # .item(), print(loss) and a tqdm postfix every step, but no GPU to wait for (F8)
    # tqdm postfix/description and an f-string to logger.debug per step; .item() after the
    # accumulation micro-steps (info); --debug and self.verbose prints are opt-in
    "tc6_flags_accumulation.py": [("TC601", 46), ("TC601", 47), ("TC601", 49), ("TC601", 63)],
    "tc5_dataparallel_alias.py": [],  # .item() under `if i % args.log_interval == 0`
    "tc5_fsdp_helper.py": [],
    "tc5_hogwild.py": [],  # logging guarded by batch_idx % log_interval
    "tc5_imagenet_distributed.py": [],  # guarded by i % args.print_freq
    "tc5_mp_spawn_ddp.py": [],  # .item() only in test() under no_grad
    "tc5_nanogpt_ddp.py": [],  # eval in @torch.no_grad, log under iter_num % log_interval and master_process
    "tc5_rl_actor_critic.py": [],  # RL: action.item() feeds env.step; the update runs once per episode
    "tc5_single_gpu.py": [],
    "tc5_torchrun_ddp.py": [],  # per-epoch print after the step loop
    # D(x), D(G(z)) and both losses read every step for the print
    "tc6_dcgan.py": [("TC601", 25), ("TC601", 33), ("TC601", 42), ("TC601", 46), ("TC601", 46)],
    # meter update with loss.item(), set_to_none=False, synchronize for timing, -b default 100
    "tc6_imagenet_meters.py": [("TC601", 46), ("TC601", 51), ("TC602", 48), ("TC604", 71)],
    "tc6_mnist_style.py": [("TC602", 26), ("TC603", 74), ("TC604", 53)],
    "tc6_nanogpt_logging.py": [],  # everything behind interval guards; batch 12 x block 1024 is aligned
    "tc6_rl_dqn.py": [],  # optimize_model() runs inside the environment loop
    # add_scalar(tensor), add_scalar(x.item()), set_postfix(loss=loss.item()), len(list(loader)),
    # for ... in list(val_loader), DataLoader(batch_size=100) of an MLP
    "tc6_tensorboard_tqdm.py": [
        ("TC601", 37), ("TC601", 38), ("TC601", 39), ("TC603", 26), ("TC603", 44), ("TC604", 24)
    ],
    "tc6_trainer_class.py": [("TC601", 22)],  # in _run_batch, called per step from _run_epoch
}


def findings(path, select=("TC6",)):
    result = scan_paths([str(path)], select=select)
    return sorted((f.rule, f.location.line) for f in result.findings)


def test_every_tc5_tc6_fixture_is_listed():
    on_disk = {p.name for p in SCRIPTS.glob("tc[56]_*.py")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_findings(name):
    assert findings(SCRIPTS / name) == sorted(EXPECTED[name])


def test_resnet50_fixture_prints_loss_item_every_step():
    # The SPEC's demo script (owned elsewhere, so matched by text rather than line number).
    result = scan_paths([str(FIXTURES / "resnet50" / "train.py")], select=("TC6",))
    assert [(f.rule, f.message.split(" makes the host")[0]) for f in result.findings] == [("TC601", "`loss.item()`")]
    assert 'print("epoch %d step %d loss %.4f"' in result.findings[0].source_line


def _scan(tmp_path, code, select=("TC601",)):
    # A device-agnostic snippet on CUDA (a CPU-only script gets no TC601 at all: F8); the line is
    # appended so that line numbers stay as written.
    return scan_code(tmp_path, textwrap.dedent(code) + "model.cuda()\n", select=select)


def test_one_finding_per_sync_chain_and_kinds_named(tmp_path):
    result = _scan(
        tmp_path,
        """
        import torch
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            arr = loss.detach().cpu().numpy()
            torch.cuda.synchronize()
        """,
    )
    assert [(f.location.line, f.message.split(" makes the host")[0]) for f in result.findings] == [
        (6, "`loss.detach().cpu()`"),
        (7, "`torch.cuda.synchronize()`"),
    ]


def test_accumulator_and_other_sites_are_declined_with_a_reason(tmp_path):
    result = _scan(
        tmp_path,
        """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            print(loss.item())
        """,
    )
    accumulate, printed = result.findings
    # No codemod exists for either: both are declined, the accumulator with its by-hand recipe.
    assert not accumulate.fix.available and "`running_loss`" in accumulate.fix.reason
    assert ".detach()" in accumulate.fix.reason
    assert not printed.fix.available and printed.fix.reason


@pytest.mark.parametrize(
    "guard",
    [
        "if i % 10 == 0:",
        "if (i + 1) % args.print_freq == 0:",
        "if i % log_interval == 0 and master_process:",
        "if log_now:",
        "if i == 0:",
        "if time.time() - last_log > 30:",
    ],
)
def test_interval_guards(tmp_path, guard):
    result = _scan(
        tmp_path,
        f"""
        import time
        for i, (x, y) in enumerate(loader):
            log_now = i % 50 == 0
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            {guard}
                print(loss.item())
        """,
    )
    assert result.findings == []


def test_a_flag_or_rank_check_is_not_an_interval_guard(tmp_path):
    result = _scan(
        tmp_path,
        """
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if master_process:
                print(loss.item())
            if i % 10 == 0:
                pass
            else:
                print(loss.item())
        """,
    )
    assert [f.location.line for f in result.findings] == [6, 10]


def test_sync_in_a_helper_called_every_step(tmp_path):
    result = _scan(
        tmp_path,
        """
        def log_metrics(writer, loss, step):
            writer.add_scalar("loss", loss.item(), step)
        def train():
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                log_metrics(writer, loss, step)
                if step % 100 == 0:
                    log_metrics(writer, loss, step)
        """,
    )
    assert [f.location.line for f in result.findings] == [2]


def test_loops_without_a_training_step_are_not_per_step(tmp_path):
    result = _scan(
        tmp_path,
        """
        import torch
        for x, y in loader:
            preds.append(model(x).argmax(-1).cpu())
        total = sum(l.item() for l in losses)
        """,
    )
    assert result.findings == []


def test_zero_grad_fix_declined_when_grads_are_used_in_place(tmp_path):
    result = _scan(
        tmp_path,
        """
        optimizer.zero_grad(set_to_none=False)
        for p in model.parameters():
            p.grad.data.add_(noise)
        """,
        select=("TC602",),
    )
    (finding,) = result.findings
    assert not finding.fix.available and ".grad.data" in finding.fix.reason


def test_batch_size_fix_is_never_applied(tmp_path):
    result = _scan(
        tmp_path,
        """
        import torch
        loader = torch.utils.data.DataLoader(train_set, batch_size=100)
        model = MLP().cuda()
        for x, y in loader:
            model(x.cuda()).sum().backward()
            opt.step()
        """,
        select=("TC604",),
    )
    (finding,) = result.findings
    assert not finding.fix.available
    assert "96 or 104" in finding.fix.description
    assert str(finding.severity) == "info"


def test_print_of_a_helper_parameter_is_not_assumed_to_be_a_tensor(tmp_path):
    result = _scan(
        tmp_path,
        """
        def log(step, loss):
            print(f"{step}: {loss:.3f}")
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            log(step, loss.item())
        """,
    )
    assert [f.location.line for f in result.findings] == [7]


def test_numpy_is_a_sync_only_when_forced(tmp_path):
    result = _scan(
        tmp_path,
        """
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
            raw = x.numpy()
            probe = loss.numpy(force=True)
        """,
    )
    assert [f.location.line for f in result.findings] == [6]


def test_sync_after_accumulation_micro_steps_is_info():
    result = scan_paths([str(SCRIPTS / "tc6_flags_accumulation.py")], select=("TC601",))
    by_line = {f.location.line: f for f in result.findings}
    assert str(by_line[63].severity) == "info" and "`args.grad_accum` accumulation micro-steps" in by_line[63].message
    assert {str(by_line[n].severity) for n in (46, 47, 49)} == {"warning"}


def test_message_quotes_the_measured_gpu_only(tmp_path):
    code = """
    import torch
    loader = torch.utils.data.DataLoader(ds, batch_size=100)
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
    """
    h200 = scan_code(tmp_path, code, select=("TC604",), gpu="sm_90").findings[0]
    ampere = scan_code(tmp_path, code, select=("TC604",), gpu="sm_80").findings[0]
    assert "H200" not in h200.message and "(H200, torch 2.11: " in h200.explanation
    h200, ampere = h200.explanation, ampere.message + ampere.explanation
    assert "H200" not in ampere and "1.13" not in ampere
