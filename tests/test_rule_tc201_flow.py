"""TC201 on the loss's path: a forward under autocast in another helper (no false alarm), a forward
outside an autocast that covers only the loss, autocast on one model branch of several, and forward
and backward in separate helpers (F6). Exact before/after pairs live in fixtures/fix (tc201_partial_cover,
tc201_model_branches, tc201_backward_helper, tc2_fp16_forward_helper)."""

from __future__ import annotations

import pytest

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

QUIET = {
    "forward helper under autocast, backward in the step": '''
        import torch

        def forward_step(model, batch, device):
            x, y = batch
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x.to(device))
                loss = torch.nn.functional.cross_entropy(out, y.to(device))
            return loss

        def train_step(model, batch, optimizer, device):
            loss = forward_step(model, batch, device)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''',
    "trainer: _forward under autocast, _backward takes the loss": '''
        import torch

        class Trainer:
            def __init__(self, model, optimizer, args):
                self.model = model.cuda()
                self.optimizer = optimizer
                self.use_amp = args.amp

            def _forward(self, batch):
                x, y = batch
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.use_amp):
                    return torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())

            def _backward(self, loss):
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

            def train_epoch(self, loader):
                for batch in loader:
                    loss = self._forward(batch)
                    self._backward(loss)
    ''',
    "forward inside autocast, loss outside (the documented recipe)": '''
        import torch
        model = torch.nn.Linear(512, 512).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x.cuda())
            loss = torch.nn.functional.mse_loss(out.float(), y.cuda())
            loss.backward()
            opt.step()
    ''',
    "teacher forward under no_grad, student under autocast": '''
        import torch
        teacher_model = torch.nn.Linear(64, 10).cuda().eval()
        student_model = torch.nn.Linear(64, 10).cuda()
        opt = torch.optim.AdamW(student_model.parameters())
        for x, y in loader:
            x = x.cuda()
            with torch.no_grad():
                soft = teacher_model(x)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = student_model(x)
                loss = torch.nn.functional.kl_div(logits.log_softmax(-1), soft.softmax(-1))
            loss.backward()
            opt.step()
    ''',
    "an AMP flag chooses the precision (different code on each arm)": '''
        import torch
        model = torch.nn.Linear(64, 10).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            x = x.cuda()
            if args.use_fp16:
                with torch.autocast("cuda", dtype=torch.float16):
                    out = model(x)
            else:
                out = model(x.float())
            loss = torch.nn.functional.cross_entropy(out, y.cuda())
            loss.backward()
            opt.step()
    ''',
    "every model branch under autocast": '''
        import torch
        model_a = torch.nn.Linear(8, 4).cuda()
        model_b = torch.nn.Linear(8, 4).cuda()
        opt = torch.optim.AdamW([*model_a.parameters(), *model_b.parameters()])
        for x, y in loader:
            x = x.cuda()
            if args.model == "a":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = model_a(x)
            else:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = model_b(x)
            loss = torch.nn.functional.cross_entropy(out, y.cuda())
            loss.backward()
            opt.step()
    ''',
}


@pytest.mark.parametrize("code", QUIET.values(), ids=list(QUIET))
def test_forward_under_autocast_on_every_path_is_not_reported(tmp_path, code):
    assert scan_code(tmp_path, code, select=("TC201",)).findings == []


def _only(tmp_path, code, select=("TC201",)):
    (finding,) = scan_code(tmp_path, code, select=select).findings
    return finding


def test_partial_cover_in_a_trainer_method_is_reported_and_the_forward_moved(tmp_path):
    finding = _only(tmp_path, '''
        import torch

        class Trainer:
            def step(self, batch):
                x, y = batch
                feats = self.model(x.cuda())
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = self.criterion(feats, y.cuda())
                loss.backward()
                self.optimizer.step()

            def __init__(self, model):
                self.model = model.cuda()
                self.optimizer = torch.optim.AdamW(self.model.parameters())
    ''')
    assert "forward (line 6) runs in fp32 outside the autocast block" in finding.message
    assert finding.fix.available and finding.fix.plan.kind == "widen-autocast"


PARTIAL_DECLINES = {
    "a compound statement between the forward and the autocast": ('''
        import torch
        model = torch.nn.Linear(8, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            out = model(x.cuda())
            if args.log:
                print(out.shape)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(out, y.cuda())
            loss.backward()
            opt.step()
    ''', "a compound statement between the forward and the autocast block (line 6)"),
    "the forward in another block than the autocast": ('''
        import torch
        model = torch.nn.Linear(8, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            out = model(x.cuda())
            if args.amp_loss:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(out, y.cuda())
            else:
                loss = torch.nn.functional.cross_entropy(out, y.cuda())
            loss.backward()
            opt.step()
    ''', "not in the same block"),
    "the loss under autocast inside a helper": ('''
        import torch

        def criterion(out, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return torch.nn.functional.cross_entropy(out, y)

        model = torch.nn.Linear(8, 4).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            out = model(x.cuda())
            loss = criterion(out, y.cuda())
            loss.backward()
            opt.step()
    ''', "inside a helper"),
}


@pytest.mark.parametrize("code,reason", PARTIAL_DECLINES.values(), ids=list(PARTIAL_DECLINES))
def test_partial_cover_is_reported_and_declined_where_the_shape_is_not_simple(tmp_path, code, reason):
    finding = _only(tmp_path, code)
    assert "outside the autocast block" in finding.message
    assert not finding.fix.available and reason in finding.fix.reason
    assert not fix_file(tmp_path / "train.py", Settings(select=("TC201",), root=tmp_path)).changed


def test_a_branch_whose_autocast_reads_a_name_set_on_that_branch_only_is_declined(tmp_path):
    finding = _only(tmp_path, '''
        import torch
        model_a = torch.nn.Linear(8, 4).cuda()
        model_b = torch.nn.Linear(8, 4).cuda()
        opt = torch.optim.AdamW([*model_a.parameters(), *model_b.parameters()])
        for x, y in loader:
            x = x.cuda()
            if args.model == "a":
                dtype = torch.bfloat16
                with torch.autocast("cuda", dtype=dtype):
                    out = model_a(x)
            else:
                out = model_b(x)
            loss = torch.nn.functional.cross_entropy(out, y.cuda())
            loss.backward()
            opt.step()
    ''')
    assert "only some of the model branches: the forward on line 12" in finding.message
    assert not finding.fix.available and "`dtype`, which the autocast reads" in finding.fix.reason


def test_f6_module_level_backward_helper_gets_autocast_at_the_forward_in_the_caller(tmp_path):
    scan_code(tmp_path, '''
        import torch

        def compute_loss(model, batch):
            x, y = batch
            return torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())

        def backward(loss, optimizer):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        def train(model, optimizer, loader):
            for batch in loader:
                loss = compute_loss(model, batch)
                backward(loss, optimizer)
    ''', select=("TC201",))
    result = fix_file(tmp_path / "train.py", Settings(select=("TC201",), root=tmp_path, precision="bf16"))
    assert result.error is None
    assert (
        "        with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):\n"
        "            loss = compute_loss(model, batch)\n"
        "        backward(loss, optimizer)\n"
    ) in result.fixed
    assert "    loss.backward()\n" in result.fixed  # the backward itself is never wrapped


def test_f6_fp16_with_a_module_level_backward_helper_declines_the_scaler_with_its_reason(tmp_path):
    """A GradScaler needs a home beside the backward: a function without a loop or a class has none."""
    finding = _only(tmp_path, '''
        import torch

        def backward(loss, optimizer):
            loss.backward()
            optimizer.step()

        def train(model, optimizer, loader):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                backward(loss, optimizer)
    ''')
    assert "in `train`" in finding.message
    result = scan_code(tmp_path, (tmp_path / "train.py").read_text(), select=("TC201",), precision="fp16")
    (finding,) = result.findings
    assert not finding.fix.available and "GradScaler" in finding.fix.reason


def test_f6_an_inline_forward_passed_to_the_backward_helper_is_declined_never_wrapped(tmp_path):
    """``self._backward(self._forward(x, y))``: wrapping that statement would put the backward under
    autocast (the field's F6 patch)."""
    finding = _only(tmp_path, '''
        import torch

        class Trainer:
            def __init__(self, model, optimizer):
                self.model = model.cuda()
                self.optimizer = optimizer

            def _forward(self, x, y):
                return torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())

            def _backward(self, loss):
                loss.backward()
                self.optimizer.step()

            def fit(self, loader):
                for x, y in loader:
                    self._backward(self._forward(x, y))
    ''')
    assert not finding.fix.available and "not the backward" in finding.fix.reason
