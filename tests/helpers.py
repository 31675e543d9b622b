"""Shared test helpers: scan a snippet or a file with a chosen rule set."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tcaudit.config import Settings
from tcaudit.engine import scan


def scan_code(tmp_path: Path, code: str, select: tuple[str, ...] = ("ALL",), name: str = "train.py", **settings):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    return scan_paths([str(path)], select=select, root=tmp_path, **settings)


def scan_paths(paths: list[str], select: tuple[str, ...] = ("ALL",), model_audit: bool = False, **settings):
    settings.setdefault("root", Path(paths[0]).parent)
    result = scan(paths, Settings(select=select, **settings), model_audit=model_audit)
    assert not result.errors, result.errors
    return result


def rules_of(result) -> list[str]:
    return [f.rule for f in result.findings]


def lines_of(result, rule: str) -> list[int]:
    return [f.location.line for f in result.findings if f.rule == rule]
