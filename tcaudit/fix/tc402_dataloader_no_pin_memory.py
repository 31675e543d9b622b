"""TC402 fix: ``pin_memory=True`` on the training DataLoader of a CUDA script.

On a CPU-only machine the DataLoader only warns that nothing is pinned, so the patched script still
runs there. A value held by a ``**kwargs`` dict is declined by the rule (a second keyword would be a
TypeError).
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, FixContext
from tcaudit.fix.edits import loader_keyword_fix


class DataLoaderNoPinMemoryFix(Codemod):
    rule = "TC402"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return loader_keyword_fix(module, context.facts, findings)
