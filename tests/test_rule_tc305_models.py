"""TC305 with several trained models: one finding and one compile per model an optimizer trains, each
declined on its own; models no optimizer trains are left eager. The exact before/after pairs are
fixtures/fix/compile_gan, compile_trainer_two_models and compile_one_declined (run by the oracle too);
these tests pin what scan says about them and what fix reports."""

from __future__ import annotations

from pathlib import Path

from helpers import scan_code, scan_paths
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file

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
