"""TC104 at script level: the vocabulary literal, its declines, one finding per vocabulary with the
model audit, and the CPU oracle for what padding changes in the loss."""

from __future__ import annotations

import math
import os
import re
import runpy
import sys
from pathlib import Path

import pytest

from helpers import run_training, scan_code, scan_paths

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "fix" / "tc104_nanogpt.in.py"
PADDED = FIXTURE.with_name("tc104_nanogpt.out.py")

TRAIN = '''
import torch
import torch.nn as nn
{head}
VOCAB_SIZE = 50257
model = nn.Sequential(nn.Embedding(VOCAB_SIZE, 64), nn.Linear(64, VOCAB_SIZE))
optimizer = torch.optim.AdamW(model.parameters())
for x, y in batches:
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.view(-1, VOCAB_SIZE), y.view(-1))
    loss.backward()
    optimizer.step()
{tail}
'''


def _tc104(tmp_path, head="", tail=""):
    result = scan_code(tmp_path, TRAIN.format(head=head, tail=tail), select=("TC104",))
    return [f for f in result.findings if f.rule == "TC104"]


def test_module_constant_is_fixable(tmp_path):
    [finding] = _tc104(tmp_path)
    assert finding.location.line == 4
    assert finding.fix.available and finding.fix.plan.padded == 50304


@pytest.mark.parametrize(
    "tail,reason",
    [
        ("model.load_state_dict(torch.load('ckpt.pt'))", "loads weights"),
        ("VOCAB_SIZE = len(tokenizer)", "set at run time"),
        ("noise = torch.randint(0, VOCAB_SIZE, (8,))", "also feeds `torch.randint"),
    ],
)
def test_declines_with_the_reason(tmp_path, tail, reason):
    [finding] = _tc104(tmp_path, tail=tail)
    assert not finding.fix.available
    assert reason in finding.fix.reason


def test_argparse_default_and_aligned_sizes(tmp_path):
    code = '''
    import argparse
    import torch
    import torch.nn as nn
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab-size", type=int, default=32001)
    parser.add_argument("--classes", type=int, default=1000)
    args = parser.parse_args()
    model = nn.Sequential(nn.Embedding(args.vocab_size, 64), nn.Linear(64, args.vocab_size), nn.Linear(64, 1000))
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in batches:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
    '''
    result = scan_code(tmp_path, code, select=("TC104",))
    [finding] = result.findings
    assert finding.details == {"vocab_size": 32001, "suggested": 32064}
    assert finding.fix.available


def test_one_finding_per_vocabulary_with_the_model_audit(tmp_path):
    pytest.importorskip("torch")
    target = tmp_path / "train.py"
    target.write_bytes(FIXTURE.read_bytes())
    result = scan_paths([str(target)], select=("TC104",), model_audit=True)
    findings = [f for f in result.findings if f.rule == "TC104"]
    assert len(findings) == 1, [f.message for f in findings]
    assert findings[0].fix is not None and findings[0].fix.available


def _load(path: Path):
    return runpy.run_path(str(path), run_name="tc104_fixture")


def test_padding_changes_only_the_never_targeted_logits():
    """The oracle: the padded model with the original's weights (padding rows zero) gives the original's
    logits on every real id; masking the padded logits gives exactly the original loss, and without the
    mask the loss differs only by the 47 extra softmax terms."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    original, patched = _load(FIXTURE), _load(PADDED)
    torch.manual_seed(0)
    small = original["GPT"](original["GPTConfig"]()).eval()
    large = patched["GPT"](patched["GPTConfig"]()).eval()
    vocab, padded = small.config.vocab_size, large.config.vocab_size
    assert (vocab, padded) == (50257, 50304)
    with torch.no_grad():
        state = large.state_dict()
        for key, value in small.state_dict().items():
            if value.shape == state[key].shape:
                state[key].copy_(value)
            else:
                state[key].zero_()
                state[key][:vocab].copy_(value)
        large.load_state_dict(state)
        corpus = torch.randint(0, vocab, (512,), generator=torch.Generator().manual_seed(0))
        x, y = original["get_batch"](corpus, small.config, 4, torch.Generator().manual_seed(1))
        logits_small, loss_small = small(x, y)
        logits_large, loss_large = large(x, y)
    assert int(y.max()) < vocab  # no target is a padded id
    torch.testing.assert_close(logits_large[..., :vocab], logits_small, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(logits_large[..., vocab:]) == 0
    masked = logits_large.clone()
    masked[..., vocab:] = float("-inf")
    masked_loss = F.cross_entropy(masked.view(-1, padded), y.view(-1))
    torch.testing.assert_close(masked_loss, loss_small, rtol=1e-6, atol=1e-6)
    extra = F.cross_entropy(torch.cat([logits_small, torch.zeros(*logits_small.shape[:-1], padded - vocab)], -1).view(-1, padded), y.view(-1))
    torch.testing.assert_close(loss_large, extra, rtol=1e-5, atol=1e-5)
    assert 0 < float(loss_large - loss_small) < math.log(padded / vocab) * 1.5


def _losses(path: Path, tmp_path: Path) -> list[float]:
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    proc = run_training([sys.executable, str(copy), "--max-iters", "3"], tmp_path, {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", proc.stdout)]


@pytest.mark.slow
def test_same_seed_runs_agree_within_a_percent(tmp_path):
    """Original and patched with one seed: not bit-equal (the larger embedding draws more random numbers
    at initialisation, and the softmax has 47 more terms), but the same training to within 1%."""
    before, after = _losses(FIXTURE, tmp_path), _losses(PADDED, tmp_path)
    assert len(before) == len(after) == 3
    for a, b in zip(before, after):
        assert abs(a - b) / a < 0.01, (before, after)


def test_a_declined_literal_leaves_the_model_audits_finding_with_the_reason(tmp_path):
    """gpt_vocab.py draws its tokens with ``torch.randint(0, cfg.vocab_size, ...)``: no fix; the model
    audit's finding (at the head, with its cost) is the one reported, and says why there is no fix."""
    pytest.importorskip("torch")
    source = FIXTURE.parent.parent / "models" / "gpt_vocab.py"
    target = tmp_path / "gpt_vocab.py"
    target.write_bytes(source.read_bytes())
    result = scan_paths([str(target)], select=("TC104",), model_audit=True)
    [finding] = [f for f in result.findings if f.rule == "TC104"]
    assert finding.details["heads"] == ["lm_head"]  # the model audit's
    assert not finding.fix.available and "torch.randint" in finding.fix.reason


def test_only_a_vocabulary_a_softmax_ranges_over():
    """tc104_embedding_tables.py: an LM with its own head and one with F.linear over the embedding's weight
    are reported; a text classifier's token table, a recommender's users, a GAN's class conditioning and
    positions are not."""
    from expectations import expected_findings

    path = FIXTURE.parent.parent / "scripts" / "tc104_embedding_tables.py"
    result = scan_paths([str(path)], select=("TC104",))
    assert {(f.rule, f.location.line) for f in result.findings} == expected_findings(path, ("TC104",))
    assert sorted(f.details["vocab_size"] for f in result.findings) == [32001, 50257]


def test_a_named_vocabulary_with_no_head_is_not_reported(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        import torch.nn as nn
        vocab_size = 30522
        model = nn.Sequential(nn.Embedding(vocab_size, 128), nn.Flatten(), nn.Linear(128 * 64, 4))
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    """, select=("TC104",))
    assert result.findings == []


def test_a_config_passed_to_a_model_built_elsewhere_is_reported(tmp_path):
    result = scan_code(tmp_path, """
        import torch
        from model import GPT, GPTConfig
        model = GPT(GPTConfig(vocab_size=50257, n_embd=768))
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            _, loss = model(x, y)
            loss.backward()
            optimizer.step()
    """, select=("TC104",))
    assert [f.details["vocab_size"] for f in result.findings] == [50257]

KEYWORD_TRAIN = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class LM(nn.Module):
    def __init__(self, vocab_size, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, x):
        return self.head(self.embed(x))


vocab = 50257
model = LM(vocab_size=vocab)
optimizer = torch.optim.AdamW(model.parameters())
for step in range(3):
    x = torch.randint(0, vocab, (8, 16))
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())
    loss.backward()
    optimizer.step()
{tail}
'''


def test_a_size_that_feeds_the_data_is_padded_where_the_model_is_built(tmp_path):
    """``torch.randint(0, vocab, ...)`` keeps the real size; the model gets the padded one."""
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file
    from tcaudit.rules.graph.tc104_vocab_unaligned import PadAtConstruction

    result = scan_code(tmp_path, KEYWORD_TRAIN.format(tail=""), select=("TC104",))
    [finding] = result.findings
    assert finding.fix.available and isinstance(finding.fix.plan, PadAtConstruction)
    fixed = fix_file(tmp_path / "train.py", Settings(select=("TC104",), root=tmp_path))
    assert fixed.applied == ["TC104"]
    assert "model = LM(vocab_size=(vocab + 63) // 64 * 64)" in fixed.fixed
    assert "vocab = 50257" in fixed.fixed and "torch.randint(0, vocab, (8, 16))" in fixed.fixed
    assert not fixed.remaining  # the padded construction is not reported again


@pytest.mark.parametrize(
    "tail,reason",
    [
        ("flat = x.view(-1, vocab)", "outside the model"),  # the data, not the model's output
        ("hot = F.one_hot(x, vocab)", "outside the model"),
        ("model.load_state_dict(torch.load('ckpt.pt'))", "loads weights"),
    ],
)
def test_padding_at_construction_declines_with_the_reason(tmp_path, tail, reason):
    result = scan_code(tmp_path, KEYWORD_TRAIN.format(tail=tail), select=("TC104",))
    [finding] = result.findings
    assert not finding.fix.available
    assert reason in finding.fix.reason


def _fixed(tmp_path, code):
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    (tmp_path / "train.py").write_text(code, encoding="utf-8")
    return fix_file(tmp_path / "train.py", Settings(select=("TC104",), root=tmp_path))


def test_the_models_output_flattened_by_the_size_is_flattened_by_the_padded_size(tmp_path):
    """``logits.view(-1, vocab)`` of the padded model's output: the loss sees the padded logits, targets
    below the real vocabulary (the padded size is written out: the receiver may be the model call)."""
    fixed = _fixed(tmp_path, KEYWORD_TRAIN.format(tail="").replace(
        "    loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())",
        "    loss = F.cross_entropy(logits.view(-1, vocab), x.flatten())\n"
        "    loss = loss + F.cross_entropy(model(x).reshape(-1, vocab), x.flatten())",
    ))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "model = LM(vocab_size=(vocab + 63) // 64 * 64)" in fixed.fixed
    assert "F.cross_entropy(logits.view(-1, (vocab + 63) // 64 * 64), x.flatten())" in fixed.fixed
    assert "F.cross_entropy(model(x).reshape(-1, (vocab + 63) // 64 * 64), x.flatten())" in fixed.fixed


def test_a_size_passed_positionally_pads_the_known_parameter(tmp_path):
    """``LM(vocab)``: the parameter of this file's ``LM.__init__`` at that position takes the padded size."""
    fixed = _fixed(tmp_path, KEYWORD_TRAIN.format(tail="").replace("model = LM(vocab_size=vocab)", "model = LM(vocab, 64)"))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "model = LM((vocab + 63) // 64 * 64, 64)" in fixed.fixed
    assert "torch.randint(0, vocab, (8, 16))" in fixed.fixed


@pytest.mark.parametrize("construction", [
    pytest.param("model = LM(*[vocab])", id="star-args"),
    pytest.param("model = LM(vocab, 64, vocab)", id="beyond-the-parameters"),
])
def test_a_size_passed_where_the_parameter_is_unknown_is_declined(tmp_path, construction):
    result = scan_code(tmp_path, KEYWORD_TRAIN.format(tail="").replace("model = LM(vocab_size=vocab)", construction),
                       select=("TC104",))
    findings = [f for f in result.findings if f.rule == "TC104"]
    assert all(not f.fix.available for f in findings)


def test_realworld_word_lm_is_padded_at_its_constructions():
    """benchmarks/realworld/word_lm.py: ``--ntokens`` sizes the corpus and reaches both models
    positionally; the Transformer branch's ``model(data).view(-1, ntokens)`` follows the padding."""
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    script = FIXTURE.parent.parent.parent / "benchmarks" / "realworld" / "word_lm.py"
    fixed = fix_file(script, Settings(select=("TC104",), root=script.parent))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "RNNModel(args.model, (ntokens + 63) // 64 * 64, args.emsize" in fixed.fixed
    assert "TransformerModel((ntokens + 63) // 64 * 64, args.emsize" in fixed.fixed
    assert "output = model(data).view(-1, (ntokens + 63) // 64 * 64)" in fixed.fixed
    assert "torch.randint(0, args.ntokens, (args.corpus_tokens,)" in fixed.fixed


def test_realworld_gpt_is_padded_at_its_construction():
    """benchmarks/realworld/gpt_manual_attention.py: ``GPTConfig.vocab_size`` also sizes the random
    tokens, so ``GPT(config)`` gets a padded copy of the config."""
    from tcaudit.config import Settings
    from tcaudit.fix.engine import fix_file

    script = FIXTURE.parent.parent.parent / "benchmarks" / "realworld" / "gpt_manual_attention.py"
    fixed = fix_file(script, Settings(select=("TC104",), root=script.parent))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "model = GPT(dataclasses.replace(config, vocab_size=(config.vocab_size + 63) // 64 * 64)).to(device)" in fixed.fixed
    assert "torch.randint(0, config.vocab_size, (1_000_000,)" in fixed.fixed


# -- sampling from the padded logits ------------------------------------------------------------------------

SAMPLED = FIXTURE.with_name("tc104_sampling_nanogpt.in.py")


@pytest.mark.parametrize(
    "tail,sliced",
    [
        pytest.param("sample = torch.multinomial(torch.softmax(logits[-1], -1), 1)",
                     "sample = torch.multinomial(torch.softmax(logits[-1][..., :50257], -1), 1)", id="multinomial"),
        pytest.param("best = logits.argmax(-1)", "best = logits[..., :50257].argmax(-1)", id="argmax-method"),
        pytest.param("best = torch.argmax(model(x), dim=-1)", "best = torch.argmax(model(x)[..., :50257], dim=-1)",
                     id="argmax-of-the-call"),
        pytest.param("top = torch.topk(logits / 0.8, 5)", "top = torch.topk(logits[..., :50257] / 0.8, 5)", id="topk"),
        pytest.param("probs = F.softmax(logits[:, -1, :], dim=-1)\ntok = probs.multinomial(1)",
                     "probs = F.softmax(logits[:, -1, :][..., :50257], dim=-1)\ntok = probs.multinomial(1)",
                     id="through-a-name"),
        pytest.param("out = model(x)\ntok = out[0].argmax(-1)", "out = model(x)\ntok = out[0][..., :50257].argmax(-1)",
                     id="indexed-name"),
        pytest.param("def last(x):\n    return model(x)[:, -1]\ntok = last(x).argmax(-1)",
                     "def last(x):\n    return model(x)[:, -1]\ntok = last(x)[..., :50257].argmax(-1)", id="a-helper-returns-it"),
    ],
)
def test_each_sampler_reads_the_logits_bounded_to_the_real_vocabulary(tmp_path, tail, sliced):
    """The literal is padded; every sampler's first read of the model's output gets ``[..., :50257]``
    (no name holds the real size after the fix), once, and a second fix changes nothing."""
    head = "import torch.nn.functional as F"
    fixed = _fixed(tmp_path, TRAIN.format(head=head, tail=tail))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "VOCAB_SIZE = 50304" in fixed.fixed
    assert fixed.fixed.endswith(sliced + "\n")
    assert fixed.fixed.count("[..., :50257]") == 1
    again = _fixed(tmp_path, fixed.fixed)
    assert again.fixed == fixed.fixed and not again.applied


def test_outside_the_model_the_scripts_own_name_bounds_the_read(tmp_path):
    """Built padded at the construction (the size feeds the data): ``vocab`` keeps the real size beside
    the model, so the read is bounded by it."""
    fixed = _fixed(tmp_path, KEYWORD_TRAIN.format(tail="tok = torch.multinomial(F.softmax(logits[-1], -1), 1)"))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "model = LM(vocab_size=(vocab + 63) // 64 * 64)" in fixed.fixed
    assert "tok = torch.multinomial(F.softmax(logits[-1][..., :vocab], -1), 1)" in fixed.fixed
    assert _fixed(tmp_path, fixed.fixed).fixed == fixed.fixed


@pytest.mark.parametrize(
    "tail,kept",
    [
        pytest.param("best = logits[..., :50257].argmax(-1)", "best = logits[..., :50257].argmax(-1)", id="literal"),
        # ``VOCAB_SIZE`` is 50304 after the fix: its bound becomes the real size, no second slice
        pytest.param("best = logits[..., :VOCAB_SIZE].argmax(-1)", "best = logits[..., :50257].argmax(-1)", id="padded-name"),
    ],
)
def test_a_read_the_script_slices_already_is_not_sliced_again(tmp_path, tail, kept):
    fixed = _fixed(tmp_path, TRAIN.format(head="", tail=tail))
    assert fixed.applied == ["TC104"], fixed.declined
    assert fixed.fixed.endswith(kept + "\n")


def test_a_read_sliced_by_the_real_name_is_left_alone(tmp_path):
    fixed = _fixed(tmp_path, KEYWORD_TRAIN.format(tail="tok = logits[:, -1, :vocab].argmax(-1)"))
    assert fixed.applied == ["TC104"], fixed.declined
    assert fixed.fixed.endswith("tok = logits[:, -1, :vocab].argmax(-1)\n")


@pytest.mark.parametrize(
    "tail,reason",
    [
        pytest.param("out = model.generate(x, max_new_tokens=5)", "`model.generate(...)` (line 12) samples from the logits in code "
                     "outside this file", id="library-generate"),
        pytest.param("def pick(scores):\n    return scores.argmax(-1)", "at line 13, but `scores` (line 13) is not assigned before it in the same function",
                     id="a-parameter"),
        pytest.param("beams = torch.topk((logits + 1.0).view(8, -1), 4)", "but `(logits + 1.0).view(8, -1)` (line 12) cannot be followed to the model's output",
                     id="beam-search-view"),
        pytest.param("tok = torch.multinomial(torch.ones(logits.size(-1)), 1)", "(line 12) takes the padded logits' last dimension",
                     id="last-dim-as-a-size"),
        pytest.param("noise = torch.randint(0, logits.size(-1), (8,))", "(line 12) takes the padded logits' last dimension",
                     id="token-draw-by-the-width"),
    ],
)
def test_sampling_the_fix_cannot_cover_is_declined_with_the_line(tmp_path, tail, reason):
    [finding] = _tc104(tmp_path, tail=tail)
    assert not finding.fix.available
    assert reason in finding.fix.reason, finding.fix.reason


def test_no_name_holds_the_real_size_where_the_literal_is_an_option(tmp_path):
    """An argparse default that the literal padding changes: ``args.vocab_size`` is the padded size after
    the fix and 50257 may not be the size run; declined."""
    result = scan_code(tmp_path, """
        import argparse
        import torch
        import torch.nn as nn
        parser = argparse.ArgumentParser()
        parser.add_argument("--vocab-size", type=int, default=50257)
        args = parser.parse_args()
        model = nn.Sequential(nn.Embedding(args.vocab_size, 64), nn.Linear(64, args.vocab_size))
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in batches:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
        print(logits.argmax(-1))
    """, select=("TC104",))
    [finding] = result.findings
    assert not finding.fix.available
    assert "samples from the logits at line 14, where no name holds the real vocabulary" in finding.fix.reason


def test_generate_samples_exactly_what_the_unpadded_model_samples():
    """The oracle for sampling: the padded model (the original's weights copied in, its padded logits
    forced far above every real one) generates, with one seed, exactly the original's tokens; the
    original ``generate`` on the padded model emits padded ids, so the bound is what keeps them out."""
    torch = pytest.importorskip("torch")
    original, patched = _load(SAMPLED), _load(SAMPLED.with_name("tc104_sampling_nanogpt.out.py"))
    torch.manual_seed(0)
    config = original["GPTConfig"]()
    small = original["GPT"](config).eval()
    large = patched["GPT"](patched["dataclasses"].replace(config, vocab_size=50304)).eval()
    with torch.no_grad():
        state = large.state_dict()
        for key, value in small.state_dict().items():
            if value.shape == state[key].shape:
                state[key].copy_(value)
            else:
                state[key].zero_()
                state[key][:config.vocab_size].copy_(value)
        large.load_state_dict(state)

    def dominate(module, inputs, output):
        output[..., config.vocab_size:] = 1e4  # what training could leave there, at its worst
        return output

    large.lm_head.register_forward_hook(dominate)
    prompt = torch.zeros((2, 1), dtype=torch.long)
    for top_k in (None, 50):
        torch.manual_seed(1)
        expected = small.generate(prompt, max_new_tokens=12, top_k=top_k)
        torch.manual_seed(1)
        got = large.generate(prompt, max_new_tokens=12, top_k=top_k)
        assert torch.equal(got, expected)
        torch.manual_seed(1)
        unbounded = original["GPT"].generate(large, prompt, max_new_tokens=12, top_k=top_k)
        assert int(unbounded.max()) >= config.vocab_size  # without the bound: padded ids


def test_a_decoded_output_the_loss_also_reads_is_bounded_at_the_decoder(tmp_path):
    """``output = model(data).view(-1, ntokens)`` feeds the loss and an accuracy argmax: the view takes the
    padded size, the loss keeps the padded logits, and only the argmax's reference is bounded."""
    fixed = _fixed(tmp_path, KEYWORD_TRAIN.format(tail="").replace(
        "    loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())",
        "    output = model(x).view(-1, vocab)\n"
        "    loss = F.cross_entropy(output, x.flatten())\n"
        "    accuracy = (output.argmax(-1) == x.flatten()).float().mean()",
    ))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "    output = model(x).view(-1, (vocab + 63) // 64 * 64)\n" in fixed.fixed
    assert "    loss = F.cross_entropy(output, x.flatten())\n" in fixed.fixed
    assert "    accuracy = (output[..., :vocab].argmax(-1) == x.flatten()).float().mean()\n" in fixed.fixed


def test_numpy_samplers_are_bounded_or_declined(tmp_path):
    """``np.argmax`` over the probabilities moved to numpy reads the bounded logits; ``np.random.choice``
    sizes its population apart from ``p``, so it is declined."""
    head = "import numpy as np"
    probs = "probs = torch.softmax(logits[0, -1], -1).detach().cpu().numpy()\n"
    fixed = _fixed(tmp_path, TRAIN.format(head=head, tail=probs + "tok = np.argmax(probs)"))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "probs = torch.softmax(logits[0, -1][..., :50257], -1).detach().cpu().numpy()" in fixed.fixed
    [finding] = _tc104(tmp_path, head=head, tail=probs + "tok = np.random.choice(len(probs), p=probs)")
    assert not finding.fix.available
    assert "`np.random.choice(...)` (line 13) may sample from the padded logits" in finding.fix.reason


def test_the_last_position_picked_by_indexing_is_bounded_where_it_is_picked(tmp_path):
    """``logits = logits[:, -1, :]`` then top-k by ``logits.size(-1)`` and multinomial: one bound, at the
    indexing, so the width top-k reads is the real one."""
    tail = (
        "last = logits[:, -1, :]\n"
        "v, _ = torch.topk(last, min(10, last.size(-1)))\n"
        "last[last < v[:, [-1]]] = -float('inf')\n"
        "tok = torch.multinomial(torch.softmax(last, -1), 1)"
    )
    fixed = _fixed(tmp_path, TRAIN.format(head="", tail=tail))
    assert fixed.applied == ["TC104"], fixed.declined
    assert "last = logits[:, -1, :][..., :50257]\n" in fixed.fixed
    assert fixed.fixed.count("[..., :50257]") == 1
