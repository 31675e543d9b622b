"""TC401 fix: worker processes for the training DataLoader (``num_workers=min(16, os.cpu_count() or 1)``).

The rule declines where this is unsafe (no main guard: spawned workers would re-run the script; the
key in a ``**kwargs`` dict: a second keyword is a TypeError), so only a keyword on the call itself is
added here, or an explicit ``num_workers=0`` on it replaced. Adds ``import os``.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.fix.codemod import Codemod, DeclineFix, FixContext
from tcaudit.fix.edits import add_stdlib_import, loader_keyword_fix


class DataLoaderNoWorkersFix(Codemod):
    rule = "TC401"

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        facts = context.facts
        os_name = _os_name(facts)
        new = loader_keyword_fix(module, facts, findings, rename={"os": os_name})
        if os_name == "os" and not _imports_os(facts):
            new = add_stdlib_import(new, "os")
        return new


def _os_name(facts) -> str:
    for site in facts.imports:
        if site.qualname == "os" and site.ctx is facts.module_frame:
            return site.local
    if facts.bindings_of("os"):
        raise DeclineFix("the name `os` is bound to something else in this file")
    return "os"


def _imports_os(facts) -> bool:
    return any(site.qualname == "os" and site.local == "os" and site.ctx is facts.module_frame for site in facts.imports)
