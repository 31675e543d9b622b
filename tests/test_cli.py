"""The command line: exit codes, --fail-on, and bad input that must end in a clear message, the
documented exit code and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from tcaudit import __version__

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
SELECT = ("--select", "TC000,TC202")


def scan(cwd: Path, *args: str) -> tuple[int, str, str]:
    code, out, err = run_cli("scan", *args, cwd=cwd)
    assert "Traceback" not in out + err
    assert "internal error" not in err
    return code, out, err


def concise(cwd: Path, *args: str) -> tuple[int, list[str], str]:
    code, out, err = scan(cwd, *args, "--format", "concise", *SELECT)
    return code, out.splitlines(), err


# -- exit codes ----------------------------------------------------------------------------------------


def test_clean_file_exits_0(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    assert concise(tmp_path, "ok.py") == (0, [], "")


def test_finding_exits_1(tmp_path):
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    code, lines, _ = concise(tmp_path, "bad.py")
    assert code == 1
    assert [line.split()[1] for line in lines] == ["TC202"]


@pytest.mark.parametrize("fail_on,expected", [("info", 1), ("warning", 1), ("error", 0)])
def test_fail_on_thresholds_a_warning(tmp_path, fail_on, expected):
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    code, lines, _ = concise(tmp_path, "bad.py", "--fail-on", fail_on)
    assert code == expected
    assert len(lines) == 1  # the finding is reported either way


def test_fail_on_error_still_fails_on_a_parse_error(tmp_path):
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    code, lines, _ = concise(tmp_path, "broken.py", "--fail-on", "error")
    assert code == 1
    assert lines[0].startswith("broken.py:1:") and " TC000 " in lines[0]


def test_bad_fail_on_value_is_a_usage_error(tmp_path):
    code, out, err = run_cli("scan", ".", "--fail-on", "fatal", cwd=tmp_path)
    assert code == 2
    assert "--fail-on" in err and "fatal" in err


def test_no_command_is_a_usage_error():
    code, _, err = run_cli()
    assert code == 2
    assert "usage: tcaudit" in err


# -- files that cannot be read as Python 3 ------------------------------------------------------------


@pytest.mark.parametrize(
    "content,expected",
    [
        pytest.param(b"x = (1,\n", "cannot parse: '(' was never closed", id="syntax-error"),
        pytest.param(
            b"import torch\nscaler = torch.cuda.amp.GradScaler(\n",
            "cannot parse: '(' was never closed",
            id="syntax-error-in-a-file-a-rule-parses",
        ),
        pytest.param(b'print "hello"\n', "Python 2", id="python2-print"),
        pytest.param(b"try:\n    pass\nexcept ValueError, e:\n    pass\n", "Python 2", id="python2-except"),
        pytest.param(b'# caf\xe9\nx = "\xe9"\n', "cannot decode", id="latin1-without-cookie"),
        pytest.param(b"x = 1\ny = '\xff'\n", "cannot decode", id="latin1-on-line-2"),
        pytest.param(b"# -*- coding: klingon -*-\nx = 1\n", "unknown encoding", id="unknown-coding-cookie"),
        pytest.param(b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", "binary file", id="binary"),
    ],
)
def test_unreadable_file_is_a_tc000_finding(tmp_path, content, expected):
    (tmp_path / "script.py").write_bytes(content)
    code, lines, err = concise(tmp_path, "script.py")
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("script.py:")
    assert " TC000 " in lines[0] and expected in lines[0], lines[0]
    assert err == ""


def test_decode_error_names_the_line(tmp_path):
    (tmp_path / "script.py").write_bytes(b"x = 1\ny = '\xff'\n")
    _, lines, _ = concise(tmp_path, "script.py")
    assert lines[0].startswith("script.py:2:1: TC000 cannot decode as UTF-8: byte 0xff on line 2")


def test_latin1_with_a_coding_cookie_is_fine(tmp_path):
    (tmp_path / "script.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    assert concise(tmp_path, "script.py")[:2] == (0, [])


@pytest.mark.parametrize("content", [b"", b"\n\n", b"# only a comment\n", b"\xef\xbb\xbf"])
def test_empty_files_are_clean(tmp_path, content):
    (tmp_path / "empty.py").write_bytes(content)
    assert concise(tmp_path, "empty.py") == (0, [], "")


def test_folder_with_good_bad_and_other_files(tmp_path):
    (tmp_path / "good.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    (tmp_path / "blob.py").write_bytes(b"\x00\x00\x00")
    (tmp_path / "notes.txt").write_text("scaler = torch.cuda.amp.GradScaler(\n", encoding="utf-8")
    (tmp_path / "model.pt").write_bytes(b"\x80\x02}q\x00.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "also_bad.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "sub" / "stub.pyi").write_text("def f(x: int) -> int: ...\n", encoding="utf-8")
    code, lines, _ = concise(tmp_path, ".")
    assert code == 1
    flagged = {(line.split(":")[0], line.split()[1]) for line in lines}
    assert flagged == {("bad.py", "TC202"), ("blob.py", "TC000"), ("broken.py", "TC000"), ("sub/also_bad.py", "TC202")}
    _, out, _ = scan(tmp_path, ".", "--format", "json", *SELECT)
    assert json.loads(out)["summary"]["files"] == 6  # five .py files and one .pyi


# -- usage and configuration errors: exit 2, a message on stderr, nothing on stdout ---------------------


def test_missing_path(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = scan(tmp_path, "ok.py", "no_such_dir/train.py", *SELECT)
    assert code == 2
    assert out == ""
    assert "no such file or directory: no_such_dir/train.py" in err


def test_unknown_config_key(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselct = ["TC2"]\n', encoding="utf-8")
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = scan(tmp_path, "ok.py")
    assert code == 2 and out == ""
    assert "pyproject.toml" in err and "'selct'" in err


def test_invalid_toml(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit\nselect = 1\n", encoding="utf-8")
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = scan(tmp_path, "ok.py")
    assert code == 2 and out == ""
    assert "pyproject.toml: invalid TOML" in err and "line 1" in err


def test_unknown_select_code(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    code, out, err = scan(tmp_path, "ok.py", "--select", "TC999")
    assert code == 2 and out == ""
    assert "--select names unknown rule or prefix 'TC999'" in err


def test_unwritable_output_file(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    code, _, err = scan(tmp_path, "ok.py", "-o", "missing_dir/report.json", "--format", "json", *SELECT)
    assert code == 2
    assert "cannot write missing_dir/report.json" in err


def test_input_without_model(tmp_path):
    code, _, err = scan(tmp_path, ".", "--input", "8x3x224x224")
    assert code == 2
    assert "--input needs --model" in err


def test_missing_config_file(tmp_path):
    code, _, err = scan(tmp_path, ".", "--config", "nope.toml")
    assert code == 2
    assert "config file not found: nope.toml" in err


@pytest.mark.parametrize("content", ["not json", '{"findings": []}', '{"tcaudit_baseline": 1, "findings": 3}'])
def test_bad_baseline_file(tmp_path, content):
    (tmp_path / "ok.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "baseline.json").write_text(content, encoding="utf-8")
    code, out, err = scan(tmp_path, "ok.py", "--baseline", "baseline.json")
    assert code == 2 and out == ""
    assert "baseline" in err


def test_missing_baseline_file(tmp_path):
    code, _, err = scan(tmp_path, ".", "--baseline", "nope.json")
    assert code == 2
    assert "baseline file not found: nope.json" in err


# -- rules, explain, version ------------------------------------------------------------------------------


@pytest.mark.parametrize("columns,summary", [("80", 34), ("140", 40)])
def test_rules_table_is_readable(monkeypatch, columns, summary):
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run_cli("rules")
    assert code == 0
    assert "TC202" in out and "deprecated-amp-api" in out
    # Summaries read as sentences, not one-word columns, on an 80-column terminal too.
    header = next(line for line in out.splitlines() if "Summary" in line)
    summary_cell = header.split("┃")[-2]
    assert len(summary_cell) >= summary, header
    assert "TC2 mixed precision" in out  # one section per family


def test_rules_json():
    code, out, _ = run_cli("rules", "--format", "json")
    assert code == 0
    rules = {rule["id"]: rule for rule in json.loads(out)}
    assert rules["TC202"]["name"] == "deprecated-amp-api"
    assert rules["TC202"]["severity"] == "warning"
    assert rules["TC202"]["fix_class"] == "safe"
    assert rules["TC000"]["fix_class"] is None
    assert set(rules["TC202"]) == {"id", "name", "family", "severity", "fix_class", "needs", "summary"}


@pytest.mark.parametrize("code_arg", ["TC202", "tc202"])
def test_explain(code_arg):
    code, out, _ = run_cli("explain", code_arg)
    assert code == 0
    assert out.startswith("# deprecated-amp-api (TC202)")
    headings = [line for line in out.splitlines() if line.startswith("## ")]
    assert headings == ["## What it does", "## Why is this bad?", "## Measured cost", "## Example", "## Fix safety"]
    assert "Source: no speed claim: a deprecation" in out  # TC202's [cost] table, as plain text when piped
    assert "scaler = torch.cuda.amp.GradScaler()" in out  # the bad example
    assert 'torch.amp.GradScaler("cuda")' in out  # the good one


def test_explain_unknown_rule():
    code, out, err = run_cli("explain", "TC999")
    assert code == 2 and out == ""
    assert "unknown rule 'TC999'" in err


def test_python_m_tcaudit_version():
    proc = subprocess.run(
        [sys.executable, "-m", "tcaudit", "--version"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"tcaudit {__version__}"


def test_python_m_tcaudit_scan_exit_code(tmp_path):
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "tcaudit", "scan", "bad.py", "--format", "concise", *SELECT],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("bad.py:2:10: TC202 ")
    assert proc.stderr == ""


def test_every_rich_console_prints_text_not_emoji_codes():
    """`file.py:100:` came out as `file.py💯` (rich reads `:100:` as an emoji code): every Console
    tcaudit makes turns emoji codes off."""
    import ast

    package = Path(__file__).resolve().parents[1] / "tcaudit"
    missing = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Console" and node.args == []:
                keywords = {k.arg: k.value for k in node.keywords}
                value = keywords.get("emoji")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing

