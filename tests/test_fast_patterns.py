"""Patterns searched over a whole file are written so that Python's ``re`` can skip ahead by their first
letters (issue 50: a pattern that starts with ``\\b`` or a look-behind tries every position, ten times
slower on a 2,000-line file). Each is checked here against the plain form it stands for, on random
texts made of the words it is about: the same matches, at the same places."""

from __future__ import annotations

import random
import re

import pytest

from tcaudit.project.frameworks import OWNER_NAMED
from tcaudit.rules.compile.tc307_unfused_optimizer import _SPARSE
from tcaudit.rules.distributed.tc510_collective_in_rank_branch import COLLECTIVE_CALL
from tcaudit.rules.loop.tc604_batch_size_unaligned import _SEQUENCE_MODEL
from tcaudit.script.distributed import _MULTI_PROCESS_TEXT, DEVICE_SWITCH

_DEVICE_PLAIN = (
    r"""["']--?(?:no[-_]?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
    r"""|\bargs\.(?:no_?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
    r"""|\b(?:opt|cfg|config|hparams|flags|FLAGS)\.(?:no_?)?(?:cuda|gpus?|cpu|device|accel(?:erator)?)\b"""
)
CASES = [
    (_MULTI_PROCESS_TEXT.pattern,
     r"\bLOCAL_RANK\b|\bWORLD_SIZE\b|\blocal_rank\b|\bworld_size\b|torchrun|torch\.distributed\.(run|launch)"
     r"|\bhorovod\b|\bhvd\b|\bdeepspeed\b|\btorch_xla\b|\bxla\b|\bray\b|\bFabric\b|\baccelerate\b|\blightning\b"
     r"|\bcolossalai\b|\bmpi4py\b",
     ["LOCAL_RANK", "xla", "ray", "array", "torch_xla", "hvd", "Fabric", "lightning", "torchrun",
      "torch.distributed.run", "world_size", "mpi4py"], True),
    (DEVICE_SWITCH.pattern, _DEVICE_PLAIN,
     ["args", "cfg", "mycfg", "FLAGS", "opt", "config", ".cuda", ".no_gpu", ".device", '"--no-cuda"', "'--gpus'"], True),
    (_SEQUENCE_MODEL.pattern,
     r"block_size|seq_len|seq_length|sequence_length|max_len|max_length|context_length|ctx_len|\bbptt\b|n_ctx|"
     r"max_seq|num_tokens|tokeniz|Embedding|Transformer|\bLSTM\b|\bGRU\b|\bRNN\b",
     ["bptt", "LSTM", "nn.LSTM", "GRU", "RNN", "seq_len", "Transformer", "ctx_len"], True),
    (_SPARSE.pattern, r"\bsparse\s*=\s*True|sparse_grad|to_sparse", ["sparse", "=", "True", " ", "to_", "_grad"], True),
    (OWNER_NAMED, r"\bTrainer\b|TrainingArguments|SFTConfig|HfArgumentParser|\bAccelerator\b|LightningCLI",
     ["Trainer", "Accelerator", "SFTConfig", "LightningCLI", "Trainers"], True),
    (r"compile(?<!\wcompile)(?<!\bre\.compile)\b", r"(?<!\bre\.)\bcompile\b", ["compile", "re.", "are.", "torch."], True),
    (COLLECTIVE_CALL,
     r"\b(?:all_reduce|all_gather\w*|reduce|reduce_scatter\w*|broadcast\w*|barrier|monitored_barrier|gather\w*|"
     r"scatter\w*|all_to_all\w*)\(",
     ["all_reduce", "all_gather", "reduce", "reduce_scatter", "broadcast", "barrier", "monitored_barrier",
      "gather", "scatter", "all_to_all", "("], False),
    (r"DataParallel(?<!DistributedDataParallel)", r"(?<!Distributed)DataParallel",
     ["DataParallel", "Distributed", "DistributedDataParallel"], True),
]


@pytest.mark.parametrize("fast, plain, words, same_places", CASES, ids=lambda v: v[:24] if isinstance(v, str) else "")
def test_a_fast_pattern_matches_what_its_plain_form_matches(fast, plain, words, same_places):
    rng = random.Random(fast)
    pieces = [*words, " ", ".", "_", "x", "(", "\n", "1"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(7))
        if same_places:
            assert [m.span() for m in re.finditer(fast, text)] == [m.span() for m in re.finditer(plain, text)], text
        else:  # a trigger: whether it occurs
            assert bool(re.search(fast, text)) == bool(re.search(plain, text)), text
