"""TC301 fix: enable TF32 for fp32 matmuls once, right after the imports.

The statement is the rule's (``torch.set_float32_matmul_precision("high")``); the rule already stays
silent where the file sets TF32 either way (an explicit ``allow_tf32 = False`` is respected).
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext
from tcaudit.fix.edits import insert_setting


class Tf32DisabledFix(Codemod):
    rule = "TC301"
    # Runs before TC201 in a round: autocast silences this rule, yet the finding was reported and the
    # setting still speeds up the fp32 matmuls left outside autocast.
    order = -1

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        codes = {finding.fix.anchor.get("code") for finding in findings}
        codes.discard(None)
        if len(codes) != 1:
            raise DeclineFix("the finding does not say which setting to insert")
        return insert_setting(module, context.facts, codes.pop())
