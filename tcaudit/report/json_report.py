"""``{"findings": [...], "summary": {...}}`` — stable keys for machines."""

from __future__ import annotations

import json
from typing import TextIO

from tcaudit import __version__


def summary(result) -> dict:
    return {
        "files": result.files_scanned,
        "findings": len(result.findings),
        "error": sum(1 for f in result.findings if str(f.severity) == "error"),
        "warning": sum(1 for f in result.findings if str(f.severity) == "warning"),
        "info": sum(1 for f in result.findings if str(f.severity) == "info"),
        "suppressed": result.suppressed,
        "fixable": sum(1 for f in result.findings if f.fix is not None and f.fix.applies_by_default),
    }


def render(result, out: TextIO, *, rules, color: bool) -> None:
    data = {
        "version": __version__,
        "findings": [f.to_dict() for f in result.findings],
        "summary": summary(result),
        "notes": list(result.notes),
    }
    if getattr(result, "gpu", None):
        data["gpu"] = result.gpu
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")
