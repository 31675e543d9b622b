"""Fuzzing: training scripts from the fixtures, mutated (lines dropped, repeated, swapped, cut
short, brackets and odd text inserted, two scripts joined), then scanned and fixed.

Whatever the input: no traceback and no internal error, exit 0 or 1; the fix either leaves a file
it cannot handle exactly as it was or produces code that parses and compiles, a second fix changes
nothing, and every comment line of the original survives in order (a rewrite touches code, never
what lies between). A fixed, derandomized budget keeps it quick in CI.
"""

from __future__ import annotations

import ast
import json

import libcst as cst
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, run_cli
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file


def _parseable_fixtures() -> list[str]:
    texts = []
    for path in sorted((FIXTURES / "scripts").glob("*.py")):
        text = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        if len(text.splitlines()) <= 160:  # keep each example quick
            texts.append(text)
    return texts


SCRIPTS = _parseable_fixtures()
JUNK = ["(", ")", "[[", "]]", "{", ":", "\\", "'", '"""', "    ", "\t", "# tcaudit: ignore", "é", "\u2028",
        "lambda:", "with torch.autocast('cuda'):", "loss.backward()", "x = [" * 40 + "]" * 40,
        "x = " + "[" * 300 + "]" * 300]


@st.composite
def mutated_scripts(draw) -> str:
    lines = draw(st.sampled_from(SCRIPTS)).splitlines(keepends=True)
    if draw(st.booleans()):
        lines += draw(st.sampled_from(SCRIPTS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 4))):
        if not lines:
            break
        index = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "repeat", "swap", "junk", "cut", "indent"]))
        if action == "drop":
            del lines[index]
        elif action == "repeat":
            lines.insert(index, lines[index])
        elif action == "swap" and index + 1 < len(lines):
            lines[index], lines[index + 1] = lines[index + 1], lines[index]
        elif action == "junk":
            line = lines[index]
            at = draw(st.integers(0, len(line)))
            lines[index] = line[:at] + draw(st.sampled_from(JUNK)) + line[at:]
        elif action == "cut":
            lines = lines[: index + 1]
        elif action == "indent":
            lines[index] = "    " + lines[index]
    return "".join(lines)


def _comment_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def _is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    remaining = iter(haystack)
    return all(any(needle == item for item in remaining) for needle in needles)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=mutated_scripts())
@example(text="import torch\nscaler = torch.cuda.amp.GradScaler()\nx = " + "[" * 300 + "]" * 300 + "\n")
@example(text='"""Usage:\n\n    # tcaudit: ignore-file\n"""\n' + SCRIPTS[0])  # a directive in a docstring
def test_mutated_scripts_never_break_scan_or_fix(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    raw = path.read_bytes()
    code, out, err = run_cli("scan", "train.py", "--no-exec", "--no-cache", "--isolated", "--jobs", "1",
                             "--format", "json", cwd=tmp_path)
    assert code in (0, 1), err
    assert "Traceback" not in err and "internal error" not in err, err
    json.loads(out)

    every_rule = Settings(select=("ALL",), root=tmp_path)
    first = fix_file(path, every_rule)
    assert path.read_bytes() == raw  # fix without --apply writes nothing
    if first.error or not first.changed:
        return
    cst.parse_module(first.fixed)
    compile(first.fixed, "train.py", "exec", dont_inherit=True)
    assert _is_subsequence(_comment_lines(text), _comment_lines(first.fixed))
    path.write_text(first.fixed, encoding="utf-8")
    second = fix_file(path, every_rule)
    assert second.error is None and second.fixed == first.fixed


def test_a_file_fix_cannot_parse_is_left_byte_for_byte(tmp_path):
    path = tmp_path / "train.py"
    raw = b"import torch\r\nscaler = torch.cuda.amp.GradScaler(\r\n"
    path.write_bytes(raw)
    result = fix_file(path, Settings(select=("ALL",), root=tmp_path))
    assert result.error and not result.changed and path.read_bytes() == raw
