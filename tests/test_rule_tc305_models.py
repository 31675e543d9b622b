"""TC305 with several trained models: one finding and one compile per model an optimizer trains, each
declined on its own; models no optimizer trains are left eager. The exact before/after pairs are
fixtures/fix/compile_gan, compile_trainer_two_models and compile_one_declined (run by the oracle too);
these tests pin what scan says about them and what fix reports."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import scan_code, scan_paths
from tcaudit.config import Settings
from tcaudit.engine import audited_models_for, instantiate_rules, scan_file
from tcaudit.fix.engine import fix_file
from tcaudit.model_profile import AuditedModels, ModelProfile

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"
COMPILE = Settings(select=("TC305",), structural_fixes=("compile",))


def _tc305(path: Path):
    result = scan_paths([str(path)], select=("TC305",), structural_fixes=("compile",))
    return {f.message.split("`")[1]: f for f in result.findings}


def test_a_gan_reports_and_compiles_both_nets():
    findings = _tc305(FIXTURES / "compile_gan.in.py")
    assert sorted(findings) == ["netD", "netG"]
    assert all(f.fix.available for f in findings.values())
    assert "one of 2 models trained here" in findings["netG"].explanation


def test_a_model_no_optimizer_trains_is_not_compiled():
    """The frozen teacher is built next to the encoder and decoder but only evaluated."""
    findings = _tc305(FIXTURES / "compile_trainer_two_models.in.py")
    assert sorted(findings) == ["self.decoder", "self.encoder"]
    fixed = fix_file(FIXTURES / "compile_trainer_two_models.in.py", COMPILE).fixed
    assert "self.teacher.compile()" not in fixed


def test_one_model_declined_the_other_compiled_and_fix_says_why():
    path = FIXTURES / "compile_one_declined.in.py"
    findings = _tc305(path)
    assert findings["policy"].fix.available
    assert not findings["critic"].fix.available
    assert "`critic` is a `torch.nn.Sequential`, whose forward is torch's own" in findings["critic"].fix.reason
    result = fix_file(path, COMPILE)
    assert result.applied == ["TC305"]
    [(finding, reason)] = result.declined
    assert "`critic`" in finding.message and reason == findings["critic"].fix.reason


def test_a_model_compiled_by_hand_is_not_reported_the_other_is(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        netG = Generator().cuda()
        netD = Discriminator().cuda()
        netD.compile()
        optG = torch.optim.Adam(netG.parameters())
        optD = torch.optim.Adam(netD.parameters())
        for x in loader:
            loss = netD(netG(x.cuda())).mean()
            loss.backward()
            optD.step()
            optG.step()
    """, select=("TC305",), structural_fixes=("compile",))
    [finding] = result.findings
    assert "`netG`" in finding.message and finding.fix.available


def test_two_names_of_one_model_get_one_compile(tmp_path):
    """Two optimizers over the model and its DDP wrapper: the model inside is compiled once."""
    result = scan_code(tmp_path, """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = Net().cuda()
        ddp_model = DDP(model)
        opt1 = torch.optim.SGD(model.parameters(), lr=0.1)
        opt2 = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
        for x in loader:
            loss = ddp_model(x.cuda()).mean()
            loss.backward()
            opt1.step()
            opt2.step()
    """, select=("TC305",), structural_fixes=("compile",))
    [finding] = result.findings
    assert finding.fix.available and finding.fix.plan.statement.count(".compile()") == 1


def test_a_parameter_list_built_before_the_optimizer_names_its_models(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        encoder = Encoder().cuda()
        decoder = Decoder().cuda()
        params = list(encoder.parameters()) + list(decoder.parameters())
        optimizer = torch.optim.Adam(params)
        for x in loader:
            loss = decoder(encoder(x.cuda())).mean()
            loss.backward()
            optimizer.step()
    """, select=("TC305",), structural_fixes=("compile",))
    assert sorted(f.message.split("`")[1] for f in result.findings) == ["decoder", "encoder"]


def test_a_recurrent_model_is_not_compiled_and_says_why():
    """cuDNN's LSTM: `fix --compile` made the word LM slower on an H200; one built on some paths only
    (a `--model` flag) is compiled where it holds no recurrent layer, tested at run time."""
    (finding,) = _tc305(FIXTURES / "compile_recurrent_only.in.py").values()
    assert not finding.fix.available
    assert finding.fix.reason.startswith("`model` computes in `nn.LSTM`: cuDNN's recurrent kernels")
    (finding,) = _tc305(FIXTURES / "compile_recurrent_flag.in.py").values()
    assert finding.fix.available


def test_a_sync_batchnorm_conversion_is_preparation_not_a_torch_nn_model(tmp_path):
    """The torchvision reference's ``model = nn.SyncBatchNorm.convert_sync_batchnorm(model)`` under
    --sync-bn hands back the same model: it was declined as "a torch.nn model whose forward is
    torch's own"; the compile goes after the build, before the conversion."""
    path = tmp_path / "train.py"
    path.write_text(
        "import torch\n"
        "import torchvision\n"
        "model = torchvision.models.resnet18()\n"
        "model.to('cuda')\n"
        "if args.sync_bn:\n"
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        encoding="utf-8",
    )
    result = fix_file(path, COMPILE)
    assert result.applied == ["TC305"], result.declined
    assert "model.to('cuda')\nif torch.cuda.is_available():\n    model.compile()\nif args.sync_bn:\n" in result.fixed


def test_a_gradient_penalty_declines_the_compile():
    """WGAN-GP: the critic's gradients are differentiated again (autograd.grad with create_graph=True);
    a compiled module raises on that double backward, so neither net is compiled."""
    path = FIXTURES / "all_rw_wgan_gp.in.py"
    findings = _tc305(path)
    assert sorted(findings) == ["discriminator", "generator"]
    assert all("create_graph=True, line 124" in f.fix.reason for f in findings.values())
    result = fix_file(path, COMPILE)
    assert not result.changed and {f.rule for f, _ in result.declined} == {"TC305"}


def test_a_recurrent_part_passed_to_the_constructor_declines_the_compile():
    """``Seq2Seq(Encoder(...), Decoder(...))``: the LSTMs live in the parts passed in, not in Seq2Seq's body."""
    (finding,) = _tc305(FIXTURES / "all_rw_seq2seq_packed.in.py").values()
    assert not finding.fix.available
    assert finding.fix.reason.startswith("`model` computes in `nn.LSTM`")


# -- CUDA graphs for a small step (issue 32, item 4) ------------------------------------------------------
# The model audit's verdict is given by hand here (a ModelProfile per model, as the audit makes them);
# test_fix fixes the compile_small_* fixtures with the real audit's, and the last test audits DCGAN.



def _scan_with(path: Path, models: AuditedModels) -> list:
    """TC305's findings with the model audit's facts given by hand."""
    settings = Settings(select=("TC305",), structural_fixes=("compile",), root=path.parent)
    return scan_file(path, instantiate_rules(settings), settings, models=models).findings


def _small(*models: tuple[str, str], forward_ms: float = 0.05, launch_bound: bool = False) -> AuditedModels:
    return AuditedModels(tuple(
        ModelProfile(construction=construction, assigned=name, model_class=construction.split("(")[0],
                     conv_share=0.0, gemm_share=1.0, attention_share=0.0, conv3d=False, image_input=False,
                     launch_bound=launch_bound, forward_ms=forward_ms)
        for name, construction in models
    ))


MLP_SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(x)


model = MLP().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{before}for step in range(100):
    x = torch.randn(64, 32, device="cuda")
{body}    loss = F.cross_entropy(logits, torch.zeros(64, dtype=torch.long, device="cuda"))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{after}"""


def _mlp(tmp_path, body="    logits = model(x)\n", before="", after="", models=None, name="train.py"):
    path = tmp_path / name
    path.write_text(MLP_SCRIPT.format(body=body, before=before, after=after).lstrip("\n"), encoding="utf-8")
    models = _small(("model", "MLP()")) if models is None else models
    [finding] = _scan_with(path, models)
    return finding, fix_file(path, COMPILE, models=models)


def test_a_small_step_compiles_with_cuda_graphs_and_marks_each_iteration(tmp_path):
    finding, result = _mlp(tmp_path)
    assert finding.message == 'trained model `model` is never compiled: `model.compile(mode="reduce-overhead")` (a small step)'
    assert "CUDA graphs" in finding.explanation and "cudagraph_mark_step_begin" in finding.explanation
    assert 'model.compile(mode="reduce-overhead")' in result.fixed
    assert "for step in range(100):\n    torch.compiler.cudagraph_mark_step_begin()\n    x = " in result.fixed


def test_a_step_the_audit_did_not_find_small_keeps_the_default_mode(tmp_path):
    finding, result = _mlp(tmp_path, models=_small(("model", "MLP()"), forward_ms=3.4))
    assert finding.message == "trained model `model` is never compiled: `model.compile()`"
    assert "model.compile()" in result.fixed and "cudagraph" not in result.fixed
    finding, result = _mlp(tmp_path, models=AuditedModels(), name="unaudited.py")
    assert "CUDA graphs" not in finding.explanation and "cudagraph" not in result.fixed


def test_a_launch_bound_model_counts_as_small_whatever_its_modelled_time(tmp_path):
    _, result = _mlp(tmp_path, models=_small(("model", "MLP()"), forward_ms=50.0, launch_bound=True))
    assert 'mode="reduce-overhead"' in result.fixed


@pytest.mark.parametrize("body, before, after, reason", [
    ("    logits = model(x)\n    last = logits\n", "last = None\n", "print(last)\n", None),  # read once no call came between
    ("    if step:\n        print(prev.sum())\n    logits = model(x)\n    prev = logits\n", "", "",
     "a compiled model's output `prev` is read in a later iteration"),
    ("    logits = model(x)\n    history.append(logits[0])\n", "history = []\n", "", "kept in a container"),
    ("    logits = model(x)\n    state.last = logits.view(-1)\n", "", "", "kept in `state.last`"),
    ("    if step % 10 == 0:\n        logits = model(x)\n    else:\n        logits = model(x * 2)\n", "", "",
     "`model` is called outside a loop body's top level"),
    ("    logits = run(model, x)\n", "", "", "`model` is passed to `run`"),
    ("    logits = model(x)\n", "", "for x in range(3):\n    y = model(torch.randn(64, 32, device='cuda'))\nprint(logits)\n",
     "`logits` is read after other calls of it"),
])
def test_outputs_that_outlive_their_iteration_keep_the_default_mode(tmp_path, body, before, after, reason):
    finding, result = _mlp(tmp_path, body=body, before=before, after=after)
    if reason is None:
        assert 'mode="reduce-overhead"' in result.fixed
        return
    assert "cudagraph" not in result.fixed and "model.compile()" in result.fixed
    assert finding.message.endswith("(a small step; no CUDA graphs)")
    assert reason in finding.explanation, finding.explanation


def test_an_output_returned_after_its_loop_keeps_the_default_mode(tmp_path):
    """``train_epoch`` hands its last loss (the model's own output) to a caller that may run the model
    again (an evaluation) before reading it."""
    path = tmp_path / "returns.py"
    path.write_text(
        "import torch\n"
        "import torch.nn as nn\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(8, 1)\n\n"
        "    def forward(self, x):\n"
        "        return self.fc(x).mean()\n\n\n"
        "model = Net().cuda()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\n"
        "def train_epoch():\n"
        "    for step in range(10):\n"
        "        loss = model(torch.randn(4, 8, device='cuda'))\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    return loss\n\n\n"
        "for epoch in range(2):\n"
        "    print(train_epoch())\n",
        encoding="utf-8",
    )
    [finding] = _scan_with(path, _small(("model", "Net()")))
    assert "a compiled model's output is returned after its loop (line 24)" in finding.explanation


def test_gradient_accumulation_and_kept_gradients_keep_the_default_mode(tmp_path):
    accumulation = "    logits = model(x)\n    if (step + 1) % 4 == 0:\n        pass\n"
    finding, _ = _mlp(tmp_path, body="    logits = model(x)\n", name="plain.py")
    assert "no CUDA graphs" not in finding.message
    code = MLP_SCRIPT.format(body=accumulation, before="", after="").replace(
        "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n",
        "    loss.backward()\n    if (step + 1) % 4 == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n")
    path = tmp_path / "accumulate.py"
    path.write_text(code.lstrip("\n"), encoding="utf-8")
    models = _small(("model", "MLP()"))
    [finding] = _scan_with(path, models)
    assert "gradients accumulate over iterations" in finding.explanation
    path.write_text(MLP_SCRIPT.format(body="    logits = model(x)\n", before="", after="").replace(
        "optimizer.zero_grad()", "optimizer.zero_grad(set_to_none=False)").lstrip("\n"), encoding="utf-8")
    [finding] = _scan_with(path, models)
    assert "zero_grad(set_to_none=...)" in finding.explanation


def test_varying_shapes_a_cpu_tensor_in_forward_and_ddp_keep_the_default_mode(tmp_path):
    cases = {
        "collate.py": ("model = MLP().cuda()\n", "model = MLP().cuda()\nloader = torch.utils.data.DataLoader("
                       "data, batch_size=64, collate_fn=pad)\nfor batch in loader:\n    logits = model(batch)\n",
                       "the loader's `collate_fn` may make batches of varying shape"),
        "cpu_tensor.py": ("        return self.fc(x)\n", "        return self.fc(x) + torch.zeros(10)\n",
                          "`torch.zeros(...)` in `MLP.forward` makes a CPU tensor"),
        "ddp.py": ("model = MLP().cuda()\n", "model = MLP().cuda()\nmodel = torch.nn.parallel.DistributedDataParallel(model)\n",
                   "a data-parallel wrapper runs the model"),
    }
    for name, (old, new, reason) in cases.items():
        path = tmp_path / name
        path.write_text(MLP_SCRIPT.format(body="    logits = model(x)\n", before="", after="").lstrip("\n")
                        .replace(old, new, 1), encoding="utf-8")
        findings = _scan_with(path, _small(("model", "MLP()")))
        assert findings and reason in findings[0].explanation, (name, findings and findings[0].explanation)


def test_the_small_dcgan_fixture_marks_one_loop_for_both_nets():
    """Three discriminator calls an iteration with backwards between them: one generation an iteration
    (the mark at the loop's top) keeps every output and `.grad` valid until the next iteration."""
    fixed = (FIXTURES / "compile_small_dcgan.out.py").read_text(encoding="utf-8")
    assert fixed.count("\n    torch.compiler.cudagraph_mark_step_begin()\n") == 1
    assert fixed.count('.compile(mode="reduce-overhead")') == 2


@pytest.mark.slow
def test_the_realworld_dcgan_is_audited_small_and_gets_cuda_graphs(tmp_path):
    """benchmarks/realworld/dcgan.py as run.sh patches it (`tcaudit fix --compile`, every rule, the model
    audit on): both nets compile with CUDA graphs, and the batch loop starts with the marker."""
    pytest.importorskip("torch")
    path = tmp_path / "dcgan.py"
    shutil.copy(Path(__file__).resolve().parent.parent / "benchmarks" / "realworld" / "dcgan.py", path)
    settings = Settings(select=("ALL",), root=tmp_path, structural_fixes=("compile",))
    models = audited_models_for([path], settings).get(os.path.realpath(path))
    assert models is not None and sum(p.forward_ms for p in models.profiles) <= 1.0
    fixed = fix_file(path, settings, models=models).fixed
    assert fixed.count('.compile(mode="reduce-overhead")') == 2
    assert "    for i, data in enumerate(dataloader, 0):\n        torch.compiler.cudagraph_mark_step_begin()\n" in fixed
