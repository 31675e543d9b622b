"""The differential oracle: every runnable fix fixture, the ResNet50 fixture and a generated corpus
of real-code shapes (tests/oracle/corpus.py) run before and after ``tcaudit fix`` on this CPU, with
the same seed, and the losses they compute (recorded by tests/oracle/shim/sitecustomize.py at each
``backward()``, no edit to the scripts) must agree.

Two modes: plain CPU (autocast and GradScaler are off there: a safe or numerics fix must reproduce the
original's fp32 losses), and CUDA semantics (the shim makes BCE under autocast raise, makes every
GradScaler real and gives on-device random factories their own generator; the original runs with
its scalers off as the reference, the patched one with real scalers, and must compute the same).

A fix that changes what a script computes is marked xfail(strict=True) with the finding, so it
turns into a failure to remove the mark the moment the rule is fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from oracle.cases import DDP_CONVERSIONS, all_cases, amp_case, patch, run_cases, variant_cases
from oracle.harness import max_relative_difference

pytestmark = pytest.mark.slow
CASES = all_cases()
IDS = [case.id for case in CASES]
# Every real-world-shaped fixture converted with --ddp, run only as two ranks (the GPU suite runs them
# on the H200 too): a converted script must train to its end on each rank, on its own data.
RANK_VARIANTS = [case for case in variant_cases() if case.id.endswith("+ddp")]
RTOL = 1e-5  # fp32 on the CPU, same thread count: a value-keeping fix is exact or within rounding


@dataclass(frozen=True)
class Expect:
    """How closely a case's patched losses must follow the original's, and why not exactly."""

    rtol: float = RTOL
    compare: int | None = None  # only the first N losses are compared; the rest: same count, finite
    why: str = ""
    original_fails: bool = False  # the original crashes here; the patched script must run
    dropped: int = 0  # steps the patched run leaves out on purpose (drop_last=True: a partial batch per epoch)


# channels_last makes CPU convolutions sum in another order (oneDNN kernels): ~1e-6 per conv. Each
# SGD step amplifies it, so the first loss (no update yet) is what is bounded.
CHANNELS_LAST = Expect(rtol=1e-4, compare=1, why="channels_last: other summation order")
# As above, plus TC301's set_float32_matmul_precision("high"): on CPU it is not a no-op, oneDNN
# convolutions use it (~1e-6 per conv measured, torch 2.14). 50 layers: 1.5e-5 in the first loss.
RESNET = Expect(rtol=1e-4, compare=1, why="channels_last and matmul precision 'high' (oneDNN on CPU)")
# DistributedSampler orders the data by seed + epoch, RandomSampler by the global RNG: same steps
# and batch sizes, other batches from the first step. Only the count and finiteness are checked.
DDP_ORDER = Expect(compare=0, why="DistributedSampler shuffles with its own seed")
# persistent_workers keeps one iterator: the global RNG is not drawn for a new worker seed after the
# first epoch, so later shuffles differ. The first epoch is exact.
PERSISTENT = "persistent_workers: later epochs shuffle from another RNG state"
# set_epoch is the point of TC504: epochs after the first are shuffled differently, as intended.
SET_EPOCH = "set_epoch reshuffles epochs after the first (the fix's purpose)"
HALF_MODEL = Expect(original_fails=True, why="the original fails on CPU (mixed dtypes); the fix repairs it")

EXPECT = {
    "tc303_cuda_branch": CHANNELS_LAST,
    "all_eval_reload": CHANNELS_LAST,
    "all_resnet50": RESNET,
    "resnet50": RESNET,
    "all_rw_imagenet_examples": RESNET,
    "all_rw_tv_references": CHANNELS_LAST,
    # Dropout after a channels_last conv draws its mask in memory order: other elements are dropped
    # from the first step (same rate), so only the count and finiteness of the losses are checked.
    "all_rw_mnist_examples": Expect(compare=0, why="channels_last: dropout masks drawn in memory order"),
    "all_rw_cifar_tutorial": Expect(rtol=1e-4, compare=16, why=PERSISTENT + "; channels_last: other summation order"),
    "tc404_persistent": Expect(compare=6, why=PERSISTENT),
    # TC401/TC404 give the training loader persistent workers: the first epoch (4 batches) is exact.
    "all_rw_seq2seq_packed": Expect(compare=4, why=PERSISTENT),
    "all_rw_hf_style_loop": Expect(compare=8, why=PERSISTENT),
    # 48 samples in batches of 8: the first epoch is six steps.
    "all_rw_keras_style_fit": Expect(rtol=1e-4, compare=6, why=PERSISTENT + "; matmul precision 'high' (oneDNN on CPU)"),
    "tc4_loader": Expect(compare=3, why=PERSISTENT),
    "tc504_module_helper": Expect(compare=5, why=SET_EPOCH),
    "tc504_trainer": Expect(compare=6, why=SET_EPOCH),
    "ddp_dataparallel": DDP_ORDER,
    "ddp_module_level": DDP_ORDER,
    "ddp_trainer": DDP_ORDER,
    "ddp_hf_random_sampler": DDP_ORDER,  # RandomSampler draws from the global RNG, DistributedSampler from its seed
    "ddp_datamodule_class": DDP_ORDER,  # the DataModule's shuffled loader: the same
    "ddp_docstring_mentions_torchrun": DDP_ORDER,
    "tc503_mp_spawn_kwargs": DDP_ORDER,
    "tc503_torchrun": DDP_ORDER,
    "tc503_trainer": DDP_ORDER,
    "gen01_cuda0_helpers_flag_clip_both+ddp": DDP_ORDER,
    "gen05_object_flat_flag_clip_both+ddp": DDP_ORDER,
    "gen09_index0_trainer_flag_clip_both+ddp": DDP_ORDER,
    # TC401 gives the helper-built loader persistent workers; TC301's "high" matmul precision reaches
    # oneDNN's CPU convolution.
    "all_try_return": Expect(rtol=1e-4, compare=4, why=PERSISTENT + "; matmul precision 'high' (oneDNN on CPU)"),
    "tc206_half_model": HALF_MODEL,
    "tc2_half_model": HALF_MODEL,
    # Padding the vocabulary 96 -> 128 draws more rows at initialisation and adds never-targeted
    # logits to the softmax (tests/test_rule_tc104_script.py checks the exact relation).
    "tc104_nanogpt": Expect(rtol=1e-2, why="TC104 pads the vocabulary: more init draws, 32 more logits"),
    # 600 -> 640: the embedding's extra rows shift every later layer's init draws, 40 more logits.
    "tc104_word_lm": Expect(rtol=5e-2, why="TC104 pads the vocabulary: other init draws, 40 more logits"),
    "tc104_flag_branches": Expect(rtol=5e-2, why="TC104 pads the vocabulary: other init draws, 23 more logits"),
    # Padded at the construction, the samplers' reads bounded to the real vocabulary: the losses move as
    # for any padding (tests/test_rule_tc104_script.py checks that generate samples exactly the same tokens).
    "tc104_sampling_nanogpt": Expect(rtol=1e-2, why="TC104 pads the vocabulary: more init draws, 47 more logits"),
    "tc104_sampling_argmax": Expect(rtol=5e-2, why="TC104 pads the vocabulary: other init draws, 61 more logits"),
    # fix --pad-dims: 500 -> 512 hidden units, 30 -> 32 channels; the extra units draw their own initial
    # weights, which shifts every later draw (tests/test_fix_pad_dims.py checks the shapes and the run).
    "pad_mlp_hidden": Expect(rtol=5e-2, why="TC101 pads the hidden width: other init draws, 12 more units"),
    "pad_convnet_channels": Expect(rtol=5e-2, why="TC102 pads the channels: other init draws, 2 more channels"),
    # Run with --amp: on the CPU autocast computes in bf16, where channels_last's kernels differ at
    # bf16 precision from the first forward on.
    "tc303_imagenet_dataparallel": Expect(rtol=3e-2, compare=1, why="bf16 CPU autocast under channels_last"),
    # The original imports apex, which is not installed here; the migrated script runs without it.
    "tc209_apex_trainer": Expect(original_fails=True, why="the original needs apex"),
    "tc209_apex_amp_flag": Expect(original_fails=True, why="the original needs apex"),
    # The DDP conversion now shards these loaders (built by a lambda or in a helper): a
    # DistributedSampler orders the data by its own seed.
    "gen00_object_trainer_flag_clip_after_step+ddp": DDP_ORDER,
    "gen03_cpu_only_trainer_none+ddp": DDP_ORDER,
    "gen04_index0_helpers_flag_clip_after_step+ddp": DDP_ORDER,
    "gen07_auto_helpers_none+ddp": DDP_ORDER,
    # fix --dali: DALI's CPU pipeline decodes, crops and flips with its own generator (tests/test_fix_dali.py
    # checks the same batches per epoch, and the original's exact output with the DataLoader forced).
    "dali_flag_arms": Expect(compare=0, why="DALI draws its own random crops"),
    "dali_trainer": Expect(compare=0, why="DALI draws its own random crops"),
    # TC316 spells requires_grad right: the backbone the script meant to freeze stops training, so the
    # losses after the first step (no update yet) differ, as intended.
    "tc316_freeze_backbone": Expect(compare=1, why="TC316 freezes the backbone the script meant to freeze"),
    # TC318's drop_last=True leaves out the partial batch of 4 in each of the 2 epochs: the first
    # epoch's 3 full batches are exact, later ones follow another model state.
    "tc318_compiled_flag": Expect(compare=3, dropped=2, why="TC318 drops the last partial batch (numerics class)"),
    # TC410's worker_init_fn reseeds each worker's generator: the augmentations differ from the
    # first batch on, as intended (they repeated across workers before).
    "tc410_numpy_aug": Expect(compare=0, why="TC410 reseeds each worker's generator (the fix's purpose)"),
}
# The BCE fixture's original computes BCE under autocast: CUDA raises there (so does the shim).
CUDA_EXPECT = {**EXPECT, "tc208_bce": Expect(original_fails=True, why="BCE under autocast raises on CUDA")}

# Findings: fixes that change what the script computes (REALWORLD.md class in brackets).
F1_CLIP_AFTER_STEP = (
    "[F1] TC205 inserts scaler.unscale_ before a clip that follows the step, in neither AMP branch: "
    "without --amp the scaler is None (AttributeError)"
)
F1_UNSCALE_TWICE = (
    "[F1] TC205 puts self.scaler.unscale_ before a clip after the step: with --amp the next step's "
    "gradients are used still scaled (loss 1.4 -> 1.8e7 -> 1.8e17)"
)
F2_BCE = (
    "[F2, F8] TC201 adds CUDA autocast around a BCE helper that TC208 declined to fix: the patched "
    "script raises on the GPU (and the script is CPU-only: TC201/TC301/TC302/TC303/TC402/TC403 apply)"
)
CPU_FINDINGS: dict[str, str] = {}  # F1 (clip after the step) is fixed: TC205 leaves it to TC213
CUDA_FINDINGS = {
    **CPU_FINDINGS,
    "tc406_factories": (
        "[F7] TC406 turns torch.randn(...).to(device) into torch.randn(..., device=device): on CUDA the "
        "values come from the CUDA generator, so a seeded script computes other numbers"
    ),
}


def _params(findings: dict[str, str]):
    return [
        pytest.param(case.id, marks=pytest.mark.xfail(strict=True, reason=findings[case.id])) if case.id in findings else case.id
        for case in CASES
    ]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """Every case patched once and run in both modes from one fork server (one torch import)."""
    workdir = tmp_path_factory.mktemp("oracle")
    patched = {case.id: patch(case, workdir) for case in CASES + RANK_VARIANTS}
    ranks_only = frozenset(case.id for case in RANK_VARIANTS)
    return patched, run_cases(list(patched.values()), workdir / "runs", ranks_only=ranks_only)


def _check(oracle, case_id: str, mode: str, expect: Expect) -> None:
    patched, runs = oracle
    original, fixed = runs[(mode, case_id, "original")], runs[(mode, case_id, "patched")]
    applied = ", ".join(patched[case_id].applied) or "no fix"
    assert fixed.rc == 0, f"patched script failed ({applied}):\n{fixed.explain()}"
    if expect.original_fails:
        assert original.rc != 0, f"{case_id}: the original runs now; update the expectation"
        assert fixed.finite, fixed.explain()
        return
    assert original.rc == 0, original.explain()
    if not original.losses:  # a script that never calls backward: what it prints must not change
        assert fixed.stdout == original.stdout
        return
    assert len(fixed.losses) == len(original.losses) - expect.dropped, f"{applied}: {original.losses} vs {fixed.losses}"
    assert all(math.isfinite(x) for x in fixed.losses), f"{applied}: {fixed.losses}"
    n = len(original.losses) if expect.compare is None else expect.compare
    difference = max_relative_difference(original.losses[:n], fixed.losses[:n])
    assert difference <= expect.rtol, (
        f"{applied} changed the losses by {difference:.2e} (allowed {expect.rtol:g}{': ' + expect.why if expect.why else ''})\n"
        f"original {original.losses}\npatched  {fixed.losses}"
    )


@pytest.mark.parametrize("case_id", _params(CPU_FINDINGS))
def test_fix_keeps_the_losses_on_cpu(oracle, case_id):
    _check(oracle, case_id, "cpu", EXPECT.get(case_id, Expect()))


@pytest.mark.parametrize("case_id", _params(CUDA_FINDINGS))
def test_fix_keeps_the_losses_under_cuda_semantics(oracle, case_id):
    _check(oracle, case_id, "cuda", CUDA_EXPECT.get(case_id, Expect()))


# Real CPU autocast in fp16/bf16 against the fp32 reference: the patched script must run and stay
# finite, its first loss (no update yet) must match the reference's within low-precision rounding, and
# no later loss may run away from the reference's (a clip of scaled gradients, gradients unscaled
# twice: 3.6 -> 3e16 in six steps). Later losses are not compared one by one: fp16 rounding, skipped
# GradScaler steps and BatchNorm at batch 4 send small runs on other trajectories from the first update.
AMP_RTOL = 0.1
AMP_GROWTH = 10.0
AMP_FINDINGS: dict[str, str] = {}
AMP_CASES = [case.id for case in CASES if case.path is not None]
# What PyTorch's CPU backend says where this CPU has no oneDNN kernel for an op in the dtype asked.
NO_CPU_KERNEL = "could not create a primitive descriptor"


@pytest.mark.parametrize(
    "case_id",
    [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=AMP_FINDINGS[c])) if c in AMP_FINDINGS else c for c in AMP_CASES],
)
def test_fix_trains_under_real_autocast(oracle, case_id):
    """The patched script under a real CPU autocast in the dtype the GPU would use: a fill beyond
    fp16's range, a half tensor fed to a region taken out of autocast or a clip of scaled gradients
    fails or diverges here as it would on the GPU."""
    patched, runs = oracle
    if not amp_case(patched[case_id]):
        pytest.skip("the patched script does not autocast")
    expect = CUDA_EXPECT.get(case_id, Expect())
    reference, fixed = runs[("cuda", case_id, "original")], runs[("amp", case_id, "patched")]
    applied = ", ".join(patched[case_id].applied) or "no fix"
    if fixed.rc != 0 and NO_CPU_KERNEL in fixed.stderr:
        # The CPU stands in for the GPU here: a CPU whose oneDNN has no kernel for an op in the autocast
        # dtype (an LSTM in fp16 without AVX-512 FP16/AMX) cannot run the check; the GPU has the kernel.
        pytest.skip(f"this CPU's oneDNN cannot run an op of the patched script in the autocast dtype ({NO_CPU_KERNEL})")
    assert fixed.rc == 0, f"patched script failed under real autocast ({applied}):\n{fixed.explain()}"
    assert all(math.isfinite(x) for x in fixed.losses), f"{applied}: {fixed.losses}"
    if expect.original_fails or reference.rc != 0 or not reference.losses:
        return
    assert len(fixed.losses) == len(reference.losses), f"{applied}: {reference.losses} vs {fixed.losses}"
    if expect.compare != 0:
        difference = max_relative_difference(reference.losses[:1], fixed.losses[:1])
        assert difference <= AMP_RTOL, (
            f"{applied}: under real autocast the first loss moved by {difference:.2e} (allowed {AMP_RTOL:g})\n"
            f"reference {reference.losses}\npatched   {fixed.losses}"
        )
    bound = AMP_GROWTH * max(abs(x) for x in reference.losses)
    assert max(abs(x) for x in fixed.losses) <= bound, (
        f"{applied}: under real autocast the losses ran away\nreference {reference.losses}\npatched   {fixed.losses}"
    )


# Findings of the two-rank runs, as strict xfails (none left: the loaders built by a lambda or in a helper
# are sharded now, and the rank-0 checkpoint is awaited with a barrier).
RANK_FINDINGS: dict[str, str] = {}
# The ResNet50 script's --synthetic mode (the oracle's argv) replays random batches each process makes
# once from the same seed (`SyntheticBatches`, no DataLoader): there is no data to shard, so both ranks
# compute the same losses; its ImageFolder branch gets the DistributedSampler (tests/test_fix_ddp.py).
SAME_DATA_BY_DESIGN = {"resnet50+ddp", "all_resnet50+ddp"}
DDP_CASES = [case.id for case in CASES + RANK_VARIANTS if case.id.startswith("ddp_") or case.id.endswith("+ddp")]


@pytest.mark.parametrize(
    "case_id",
    [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=RANK_FINDINGS[c])) if c in RANK_FINDINGS else c for c in DDP_CASES],
)
def test_ddp_conversion_gives_each_rank_its_own_data(oracle, case_id):
    """The converted script, started as two ranks: each must train on its own shard. Ranks that
    compute identical losses read identical batches: the conversion did not shard the data."""
    patched, runs = oracle
    if not any(rule in patched[case_id].applied for rule in DDP_CONVERSIONS):
        pytest.skip(f"not converted to DDP ({'; '.join(patched[case_id].declined) or 'nothing to convert'})")
    run = runs[("ranks2", case_id, "patched")]
    assert run.rc == 0, run.explain()
    assert sorted(run.by_rank) == [0, 1], run.explain()
    assert run.by_rank[0] and run.by_rank[1]
    if case_id in SAME_DATA_BY_DESIGN:
        return
    assert run.by_rank[0] != run.by_rank[1], f"both ranks computed {run.by_rank[0]}"


def test_corpus_covers_every_realworld_shape():
    from oracle.corpus import build_corpus

    features = {feature for script in build_corpus() for feature in script.features}
    assert {"index0", "cuda0", "object", "cpu_only", "trainer", "helpers", "flag_clip_after_step", "flag_clip_both",
            "build_loader", "lambda", "partial", "windows", "eval_reload", "randperm_split", "bce"} <= features
    assert [s.text for s in build_corpus()] == [s.text for s in build_corpus()]  # seeded: the same every time
