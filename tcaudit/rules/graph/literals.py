"""Editing integer literals in place: the padding fix of TC101's and TC102's script halves."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from tcaudit.findings import Finding
from tcaudit.rewrite.codemod import FixContext
from tcaudit.rules.base import Codemod


def pad_literals(module: cst.Module, findings: Sequence[Finding]) -> cst.Module:
    """Each planned literal (a :class:`tcaudit.rules.graph.widths.PadWidth`) becomes its padded width;
    nothing else changes."""
    replace: dict[int, str] = {}
    for finding in findings:
        plan = finding.fix.plan
        for node in plan.literals:
            replace[id(node)] = str(plan.padded)

    class _T(cst.CSTTransformer):
        def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.Integer:
            value = replace.get(id(original_node))
            return updated_node.with_changes(value=value) if value is not None else updated_node

    return module.visit(_T())


class PadWidthLiterals(Codemod):
    """The fix of TC101's and TC102's script halves (each names its ``rule``): :func:`pad_literals`."""

    def apply(self, module: cst.Module, findings: Sequence[Finding], context: FixContext) -> cst.Module:
        return pad_literals(module, findings)
