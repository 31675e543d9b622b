"""TC302 fix: ``torch.backends.cudnn.benchmark = True`` once, right after the imports.

The rule stays silent wherever the file writes ``cudnn.benchmark``/``cudnn.deterministic`` or asks for
deterministic algorithms, so a deliberate ``False`` (``--seed`` branches) is never overridden.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext
from tcaudit.fix.edits import insert_setting


class CudnnBenchmarkOffFix(Codemod):
    rule = "TC302"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        codes = {finding.fix.anchor.get("code") for finding in findings}
        codes.discard(None)
        if len(codes) != 1:
            raise DeclineFix("the finding does not say which setting to insert")
        return insert_setting(module, context.facts, codes.pop())
