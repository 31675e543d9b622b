"""Suppression directives come only from real comments (tokenize), never from strings or docstrings."""

from __future__ import annotations

import json
import textwrap

from conftest import run_cli

SELECT = ("--select", "TC000,TC202")


def found(tmp_path, code: str) -> list[tuple[str, int]]:
    (tmp_path / "train.py").write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    exit_code, out, err = run_cli("scan", ".", "--format", "json", "--no-cache", *SELECT, cwd=tmp_path)
    assert exit_code in (0, 1), err
    return [(f["rule"], f["line"]) for f in json.loads(out)["findings"]]


def test_a_file_directive_inside_a_docstring_suppresses_nothing(tmp_path):
    code = '''
    """Example usage:

        # tcaudit: ignore-file
    """
    import torch
    scaler = torch.cuda.amp.GradScaler()
    '''
    assert found(tmp_path, code) == [("TC202", 6)]


def test_a_line_directive_inside_a_string_suppresses_nothing(tmp_path):
    code = '''
    import torch
    scaler, note = torch.cuda.amp.GradScaler(), "# tcaudit: ignore"
    '''
    assert found(tmp_path, code) == [("TC202", 2)]


def test_a_real_comment_after_a_string_still_suppresses(tmp_path):
    code = '''
    import torch
    scaler, note = torch.cuda.amp.GradScaler(), "#"  # tcaudit: ignore[TC202]
    '''
    assert found(tmp_path, code) == []


def test_comments_before_a_tokenize_error_still_count():
    from tcaudit.source.suppressions import directives

    text = "# tcaudit: ignore-file[TC2]\nx = 1  # tcaudit: ignore[TC301]\ns = \"\"\"never closed\n# tcaudit: ignore\n"
    found_directives = directives(text)
    assert found_directives.file_codes == [("TC2",)]
    assert found_directives.line_codes == {2: [("TC301",)]}


def test_the_public_module_is_what_fix_uses():
    import tcaudit.fix.engine as fix_engine
    from tcaudit.source import suppressions

    source = fix_engine.__loader__.get_source(fix_engine.__name__)
    assert "engine import _suppressed" not in source
    assert hasattr(suppressions, "directives")
