"""Reporters: each turns a scan result into one output format. They know findings, not rules."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from tcaudit.catalog import RuleSpec
    from tcaudit.engine import ScanResult

FORMATS = ("text", "concise", "json", "sarif", "github", "junit")


class Reporter(Protocol):
    def __call__(self, result: "ScanResult", out: TextIO, *, rules: "dict[str, RuleSpec]", color: bool) -> None: ...


def get_reporter(fmt: str) -> Reporter:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    module = importlib.import_module(f"tcaudit.report.{fmt}_report")
    return module.render
