"""TC501 fix (``--ddp``): replace ``nn.DataParallel`` by DistributedDataParallel under torchrun.

The same conversion as TC505's (:mod:`tcaudit.fix.ddp`), with the ``DataParallel(...)`` call replaced by
the DDP wrap where it stands (``DataParallel(net).cuda()`` becomes ``DDP(net.cuda())``; an ``if
torch.cuda.device_count() > 1:`` around it goes, since every process wraps its model), and
``isinstance(m, nn.DataParallel)`` checks asking about DDP instead.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext
from tcaudit.fix.ddp import DdpConversion
from tcaudit.script.distributed import distributed_facts


class DataParallelFix(Codemod):
    rule = "TC501"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        wraps = distributed_facts(context.facts).wraps_of("dataparallel")
        if not wraps:
            raise DeclineFix("the DataParallel call could not be located")
        return DdpConversion(module, context.facts).convert(dataparallel=wraps)
