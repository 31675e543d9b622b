"""TC505 fix (``--ddp``): make a single-process CUDA training script torchrun-ready.

The conversion itself lives in :mod:`tcaudit.fix.ddp`, shared with TC501 (DataParallel); the sampler,
``set_epoch`` and ``no_sync`` follow in the next round from TC503, TC504 and TC507.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, FixContext
from tcaudit.fix.ddp import DdpConversion


class SingleProcessTrainingFix(Codemod):
    rule = "TC505"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return DdpConversion(module, context.facts).convert()
