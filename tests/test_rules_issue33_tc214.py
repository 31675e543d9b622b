"""Issue 33: TC214 accumulation-loss-not-divided.

Gradient accumulation behind a modulo guard on the optimizer step with the loss never divided by N
(a warning), the loss divided by the constant N while the last, shorter cycle of an epoch steps too
(info), and the near misses that must stay silent. No automatic fix: the finding says what to do.
The undivided loop is also run on CPU to show the N-times-larger gradient the finding describes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from expectations import expected_findings
from helpers import scan_code, scan_paths
from tcaudit.config import Settings
from tcaudit.findings import Severity
from tcaudit.fix.engine import fix_file


SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "tc214_accumulation_shapes.py"


def _hits(tmp_path, code):
    return [f for f in scan_code(tmp_path, code, select=("TC214",)).findings if f.rule == "TC214"]


HEAD = """
import torch
import torch.nn as nn

model = nn.Linear(4, 2)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _loop(body: str) -> str:
    return HEAD + textwrap.dedent(body)


# -- the warning ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    # the plain shape
    """
     for i, (x, y) in enumerate(loader):
         loss = criterion(model(x), y)
         loss.backward()
         if (i + 1) % args.accum_steps == 0:
             optimizer.step()
             optimizer.zero_grad()
     """,
    # a GradScaler, the guard bound to a name, an integer N, clip under the guard
    """
     scaler = torch.amp.GradScaler("cuda")
     for step, (x, y) in enumerate(loader):
         with torch.autocast("cuda", dtype=torch.float16):
             loss = criterion(model(x.cuda()), y.cuda())
         scaler.scale(loss).backward()
         sync = (step + 1) % 8 == 0
         if sync:
             scaler.unscale_(optimizer)
             torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
             scaler.step(optimizer)
             scaler.update()
             optimizer.zero_grad(set_to_none=True)
     """,
    # a while loop with a counter it increments; nanoGPT's `logits, loss = model(x, y)`
    """
     it = 0
     while it < max_iters:
         x, y = get_batch("train")
         logits, loss = model(x, y)
         loss.backward()
         it += 1
         if it % gradient_accumulation_steps == 0:
             optimizer.step()
             model.zero_grad()
     """,
    # several loss terms added, `.mean()` of a per-sample loss
    """
     per_sample = nn.CrossEntropyLoss(reduction="none")
     for i, (x, y) in enumerate(loader):
         out = model(x)
         loss = per_sample(out, y).mean()
         loss = loss + criterion(out, y)
         loss.backward()
         if not (i + 1) % ACCUM:
             optimizer.step()
             optimizer.zero_grad()
     """,
])
def test_flags_an_undivided_accumulated_loss(tmp_path, body):
    [hit] = _hits(tmp_path, _loop(body))
    assert hit.severity is Severity.WARNING
    assert hit.source_line.strip().endswith(".backward()")
    assert hit.fix is None
    assert len(hit.message) <= 120 and "not divided by" in hit.message
    assert "loss = loss /" in hit.explanation


def test_the_message_names_n_and_the_explanation_the_guard(tmp_path):
    [hit] = _hits(tmp_path, _loop("""
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % args.gradient_accumulation_steps == 0 or (i + 1) == len(loader):
                optimizer.step()
                optimizer.zero_grad()
        """))
    assert hit.message == ("the loss is not divided by `args.gradient_accumulation_steps`, the number of "
                           "micro-steps whose gradients accumulate")
    assert "`if (i + 1) % args.gradient_accumulation_steps == 0 or (i + 1) == len(loader)`" in hit.explanation
    assert "loss = loss / args.gradient_accumulation_steps" in hit.explanation


def test_a_loss_helper_of_this_file_is_followed(tmp_path):
    code = _loop("""
        def compute_loss(model, x, y):
            out = model(x)
            return criterion(out, y)

        for i, (x, y) in enumerate(loader):
            loss = compute_loss(model, x, y)
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        """)
    assert len(_hits(tmp_path, code)) == 1
    divided = code.replace("return criterion(out, y)", "return criterion(out, y) / accum")
    assert _hits(tmp_path, divided) == []


def test_no_fix_is_offered_and_fix_changes_nothing(tmp_path):
    code = _loop("""
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        """).lstrip("\n")
    path = tmp_path / "train.py"
    path.write_text(code, encoding="utf-8")
    result = fix_file(path, Settings(select=("TC214",)))
    assert result.error is None and not result.changed


# -- the info case: the last, shorter cycle --------------------------------------------------------------


@pytest.mark.parametrize("division, guard", [
    ("loss = loss / accum", "(i + 1) % accum == 0 or (i + 1) == len(loader)"),
    ("loss /= accum", "(i + 1) % accum == 0 or i == len(loader) - 1"),
    ("loss = criterion(model(x), y) / accum", "(i + 1) % accum == 0 or i + 1 == num_batches"),
])
def test_info_when_the_partial_cycle_is_divided_by_the_constant_n(tmp_path, division, guard):
    code = _loop(f"""
        num_batches = len(loader)
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            {division}
            loss.backward()
            if {guard}:
                optimizer.step()
                optimizer.zero_grad()
        """)
    [hit] = _hits(tmp_path, code)
    assert hit.severity is Severity.INFO
    assert hit.source_line.strip() == division  # the division
    assert hit.message == "the last, shorter accumulation cycle of an epoch is also divided by `accum`"


@pytest.mark.parametrize("body", [
    # no step on the partial cycle
    """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
    # divided by the cycle's own length
    """
    for i, (x, y) in enumerate(loader):
        n = min(accum, len(loader) - (i // accum) * accum)
        loss = criterion(model(x), y) / n
        loss.backward()
        if (i + 1) % accum == 0 or (i + 1) == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """,
    # N itself follows the cycle
    """
    for i, (x, y) in enumerate(loader):
        if i >= len(loader) - len(loader) % ACC:
            accum = len(loader) % ACC
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0 or (i + 1) == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """,
])
def test_no_info_without_a_constant_n_on_a_stepped_partial_cycle(tmp_path, body):
    assert _hits(tmp_path, _loop(body)) == []


# -- near misses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    # divided, in each of its spellings
    "loss = criterion(model(x), y) / args.accum\nloss.backward()",
    "loss = criterion(model(x), y)\nloss /= args.accum\nloss.backward()",
    "loss = criterion(model(x), y)\n(loss / args.accum).backward()",
    "loss = criterion(model(x), y) * (1.0 / args.accum)\nloss.backward()",
    "loss = criterion(model(x), y) * inv_accum\nloss.backward()",
    "loss = 0.25 * criterion(model(x), y)\nloss.backward()",
    # any division counts as deliberate, so does reduction="sum"
    "loss = criterion(model(x), y) / num_tokens\nloss.backward()",
    "loss = nn.functional.cross_entropy(model(x), y, reduction='sum')\nloss.backward()",
    # a loss this file does not show, or one that is handed N
    "loss = compute_loss(model, x, y)\nloss.backward()",
    "loss = loss_fn(model(x), y)\nloss.backward()",
    "loss = criterion(model(x), y, args.accum)\nloss.backward()",
    "loss = self_made(model(x), y)\nloss.backward()",
    # the tensor passed to backward carries the scale
    "loss = criterion(model(x), y)\nloss.backward(torch.tensor(0.25))",
])
def test_deliberate_or_unseen_scaling_is_silent(tmp_path, body):
    code = _loop("""
        from mylib import compute_loss
        self_made = lambda out, y: criterion(out, y) / args.accum
        inv_accum = 1 / args.accum
        for i, (x, y) in enumerate(loader):
        {body}
            if (i + 1) % args.accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        """).replace("{body}", textwrap.indent(body, "    "))
    assert _hits(tmp_path, code) == []


@pytest.mark.parametrize("body", [
    # the modulo guard only logs
    """
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if i % log_interval == 0:
            print(loss.item())
    """,
    # zero_grad every iteration: nothing accumulates
    """
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        if i % 2 == 0:
            optimizer.step()
    """,
    # gradients cleared by hand every iteration
    """
    for i, (x, y) in enumerate(loader):
        for p in model.parameters():
            p.grad = None
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
    # a GAN: the critic steps every iteration, the generator every n_critic
    """
    for i, (x, _) in enumerate(loader):
        d_loss = criterion(netD(x), real)
        d_loss.backward()
        optD.step()
        if i % n_critic == 0:
            g_loss = criterion(netD(netG(z)), real)
            g_loss.backward()
            optG.step()
            optG.zero_grad()
    """,
    # N is 1: no accumulation
    """
    ACCUM = 1
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
    """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % 1 == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
    # the modulo is of the epoch, not of the loop's counter
    """
    for epoch in range(epochs):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            if epoch % 2 == 0:
                optimizer.step()
                optimizer.zero_grad()
    """,
    # the step in a helper called from the loop: not the same loop on evidence
    """
    def update():
        optimizer.step()
        optimizer.zero_grad()

    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            update()
    """,
    # the guard or-ed with something that is not the end of the epoch
    """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0 or args.no_accumulation:
            optimizer.step()
            optimizer.zero_grad()
    """,
    # the learning rate carries the scale instead
    """
    for g in optimizer.param_groups:
        g["lr"] = args.lr / args.accum
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
    # the gradients are divided instead, by hand or by a helper handed N
    """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            for p in model.parameters():
                p.grad /= accum
            optimizer.step()
            optimizer.zero_grad()
    """,
    """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            average_gradients(model, accum)
            optimizer.step()
            optimizer.zero_grad()
    """,
    # a micro-step loop: another shape, not this rule's
    """
    for it in range(max_iters):
        for micro_step in range(accum):
            loss = criterion(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    """,
    # the loss is a loop target
    """
    for i, loss in enumerate(losses):
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """,
])
def test_near_misses_stay_silent(tmp_path, body):
    assert _hits(tmp_path, _loop(body)) == []


def test_frameworks_that_divide_for_you_stay_silent(tmp_path):
    code = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _hits(tmp_path, code) == []


def test_unit_tests_stay_silent(tmp_path):
    code = _loop("""
        def test_accumulation():
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if (i + 1) % 2 == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """)
    assert _hits(tmp_path, code) == []


# -- what the finding describes, measured on CPU ---------------------------------------------------------


def test_the_undivided_accumulated_gradient_is_n_times_the_mean():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    criterion = torch.nn.CrossEntropyLoss()
    batches = [(torch.randn(3, 4), torch.randint(0, 2, (3,))) for _ in range(4)]
    accum = len(batches)

    def accumulated(divide: bool) -> torch.Tensor:
        model.zero_grad()
        for x, y in batches:
            loss = criterion(model(x), y)
            (loss / accum if divide else loss).backward()
        return model.weight.grad.clone()

    model.zero_grad()
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    criterion(model(x), y).backward()
    big_batch = model.weight.grad.clone()
    assert torch.allclose(accumulated(divide=True), big_batch, atol=1e-6)
    assert torch.allclose(accumulated(divide=False), accum * big_batch, atol=1e-5)


# -- a whole script ----------------------------------------------------------------------------------------


def test_the_fixture_script_fires_on_its_expect_lines_only():
    result = scan_paths([str(SCRIPT)], select=("TC214",))
    actual = {(f.rule, f.location.line) for f in result.findings}
    assert actual == expected_findings(SCRIPT, ("TC214",)), "\n".join(
        f"{f.rule}:{f.location.line} {f.message}" for f in result.findings
    )
    assert sorted(str(f.severity) for f in result.findings) == ["info", "warning"]


def test_the_fixture_script_runs_on_cpu(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
