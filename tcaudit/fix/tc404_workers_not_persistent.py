"""TC404 fix: ``persistent_workers=True`` on a DataLoader iterated once per epoch.

``persistent_workers=True`` with ``num_workers=0`` is a ValueError, so the rule writes
``persistent_workers=<workers> > 0`` when the worker count is a variable, and declines when it may be
0 on some path it cannot follow.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, FixContext
from tcaudit.fix.edits import loader_keyword_fix


class WorkersNotPersistentFix(Codemod):
    rule = "TC404"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return loader_keyword_fix(module, context.facts, findings)
