"""ruff's conventions (issue 29): the command line over the config, --exit-zero, --statistics,
--extend-ignore, --output-format, --show-settings, stdin, ``# noqa``, FORCE_COLOR, .gitignore,
tcaudit.toml discovery and the width of ``tcaudit rules``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from test_config import BAD, BROKEN, make


def scan(cwd: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        old = sys.stdin
        sys.stdin = io.StringIO(stdin)
    try:
        code, out, err = run_cli("scan", "--no-cache", *args, cwd=cwd)
    finally:
        if stdin is not None:
            sys.stdin = old
    assert "Traceback" not in out + err
    assert "internal error" not in err
    return code, out, err


def flagged(cwd: Path, *args: str, stdin: str | None = None) -> tuple[int, set[tuple[str, str]]]:
    code, out, _ = scan(cwd, "--format", "concise", *args, stdin=stdin)
    return code, {(line.split(":")[0], line.split()[1]) for line in out.splitlines() if line}


# -- 1. the command line over the config -----------------------------------------------------------


def test_cli_select_wins_over_the_configs_ignore(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nignore = ["TC202"]\n', "bad.py": BAD})
    assert flagged(tmp_path, "bad.py") == (0, set())
    assert flagged(tmp_path, "bad.py", "--select", "TC202") == (1, {("bad.py", "TC202")})
    # A prefix the config ignores does not hide the rule the command line adds by name.
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nignore = ["TC2"]\n'})
    assert flagged(tmp_path, "bad.py", "--extend-select", "TC202") == (1, {("bad.py", "TC202")})
    # The command line's ignore adds to the config's instead of replacing it.
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nselect = ["TC000", "TC202"]\nignore = ["TC202"]\n',
                    "broken.py": BROKEN})
    assert flagged(tmp_path, ".", "--ignore", "TC3") == (1, {("broken.py", "TC000")})
    assert flagged(tmp_path, ".", "--ignore", "TC000") == (0, set())


def test_per_file_ignores_still_apply_under_cli_select(tmp_path):
    make(tmp_path, {
        "pyproject.toml": '[tool.tcaudit]\nignore = ["TC202"]\n[tool.tcaudit.per-file-ignores]\n"gen_*.py" = ["TC202"]\n',
        "bad.py": BAD, "gen_x.py": BAD,
    })
    assert flagged(tmp_path, ".", "--select", "TC202") == (1, {("bad.py", "TC202")})


def test_extend_ignore_on_the_command_line_and_in_the_config(tmp_path):
    make(tmp_path, {"bad.py": BAD, "broken.py": BROKEN})
    both = {("bad.py", "TC202"), ("broken.py", "TC000")}
    assert flagged(tmp_path, ".", "--select", "TC000,TC202")[1] == both
    assert flagged(tmp_path, ".", "--select", "TC000,TC202", "--extend-ignore", "TC000")[1] == {("bad.py", "TC202")}
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nselect = ["TC000", "TC202"]\nextend-ignore = ["TC202"]\n'})
    assert flagged(tmp_path, ".")[1] == {("broken.py", "TC000")}
    code, _, err = scan(tmp_path, ".", "--extend-ignore", "TC9")
    assert code == 2 and "--extend-ignore names unknown rule or prefix 'TC9'" in err


# -- 2. --exit-zero, --statistics, --output-format, --show-settings ----------------------------------


def test_exit_zero_reports_but_exits_0(tmp_path):
    make(tmp_path, {"bad.py": BAD})
    assert flagged(tmp_path, "bad.py", "--select", "TC202", "--exit-zero") == (0, {("bad.py", "TC202")})
    # A usage error still exits 2.
    code, _, err = scan(tmp_path, "missing.py", "--exit-zero")
    assert code == 2 and "no such file" in err


def test_statistics_one_line_per_rule(tmp_path):
    make(tmp_path, {"a.py": BAD, "b.py": BAD + "s2 = torch.cuda.amp.GradScaler()\n", "broken.py": BROKEN})
    code, out, _ = scan(tmp_path, ".", "--select", "TC000,TC202", "--statistics")
    assert code == 1
    lines = [line.split() for line in out.splitlines()]
    assert lines == [["3", "TC202", "deprecated-amp-api", "3", "fixable"], ["1", "TC000", "parse-error", "0", "fixable"]]
    code, out, _ = scan(tmp_path, ".", "--select", "TC000,TC202", "--statistics", "--output-format", "json")
    assert json.loads(out) == [
        {"code": "TC202", "name": "deprecated-amp-api", "count": 3, "fixable": 3},
        {"code": "TC000", "name": "parse-error", "count": 1, "fixable": 0},
    ]


def test_output_format_is_an_alias_of_format(tmp_path):
    make(tmp_path, {"bad.py": BAD})
    code, out, _ = scan(tmp_path, "bad.py", "--select", "TC202", "--output-format", "json")
    assert code == 1 and [f["rule"] for f in json.loads(out)["findings"]] == ["TC202"]


def test_show_settings_names_the_config_file_and_exits_0(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nignore = ["TC202"]\nfail-on = "error"\n', "bad.py": BAD})
    code, out, _ = scan(tmp_path, "bad.py", "--show-settings", "--extend-ignore", "TC3")
    assert code == 0
    assert f"config file: {tmp_path / 'pyproject.toml'}" in out
    assert "ignore = ['TC202', 'TC3']" in out and "fail-on = error" in out
    assert "TC202" not in out.split("enabled rules")[1]


# -- 3. stdin ----------------------------------------------------------------------------------------


def test_scan_reads_stdin_under_the_stdin_filename(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\n[tool.tcaudit.per-file-ignores]\n"gen/*" = ["TC202"]\n'})
    assert flagged(tmp_path, "-", "--select", "TC202", stdin=BAD) == (1, {("-", "TC202")})
    assert flagged(tmp_path, "-", "--stdin-filename", "src/train.py", "--select", "TC202", stdin=BAD) == (
        1, {("src/train.py", "TC202")})
    assert flagged(tmp_path, "-", "--stdin-filename", "gen/x.py", "--select", "TC202", stdin=BAD) == (0, set())
    # The text report's code frame shows stdin's text, not a file of that name.
    code, out, _ = scan(tmp_path, "-", "--stdin-filename", "train.py", "--select", "TC202", stdin=BAD)
    assert "scaler = torch.cuda.amp.GradScaler()" in out


def test_stdin_filename_finds_the_config(tmp_path):
    make(tmp_path, {"proj/tcaudit.toml": 'ignore = ["TC202"]\n', "proj/src/.keep": ""})
    assert flagged(tmp_path, "-", "--stdin-filename", "proj/src/train.py", stdin=BAD) == (0, set())
    assert flagged(tmp_path, "-", "--stdin-filename", "other/train.py", "--select", "TC202", stdin=BAD)[0] == 1


def test_stdin_bad_input(tmp_path):
    assert flagged(tmp_path, "-", "--select", "TC000", stdin=BROKEN) == (1, {("-", "TC000")})
    code, _, err = scan(tmp_path, "-", "other.py", stdin=BAD)
    assert code == 2 and "must be the only path" in err
    code, _, err = scan(tmp_path, "x.py", "--stdin-filename", "a.py")
    assert code == 2 and "pass - as the path" in err


def test_fix_reads_stdin_and_writes_the_fixed_script(tmp_path):
    crlf = BAD.replace("\n", "\r\n").encode()
    proc = subprocess.run(
        [sys.executable, "-m", "tcaudit", "fix", "-", "--stdin-filename", "train.py", "--select", "TC202",
         "--no-cache"],
        input=crlf, capture_output=True, cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b'import torch\r\nscaler = torch.amp.GradScaler("cuda")\r\n'
    assert b"fixed train.py (TC202)" in proc.stderr
    assert not (tmp_path / "train.py").exists()
    # What cannot be parsed comes back byte for byte, with the reason on stderr.
    proc = subprocess.run(
        [sys.executable, "-m", "tcaudit", "fix", "-", "--no-cache"],
        input=b"def f(:\n\xff", capture_output=True, cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    assert proc.stdout == b"def f(:\n\xff"
    assert b"not fixed" in proc.stderr and b"Traceback" not in proc.stderr


# -- 4. # noqa -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "comment,suppressed",
    [
        ("# noqa: TC202", True),
        ("# NOQA:TC202", True),
        ("# noqa: E501, TC202", True),
        ("# noqa: TC201 TC2", True),
        ("# noqa: TC201", False),
        ("# noqa: TC2O2", False),  # misspelt: one unknown code, not the prefix TC2
        ("# noqa", False),  # bare: flake8's and ruff's, not tcaudit's
        ("# noqa: E501", False),
    ],
)
def test_noqa_suppresses_the_tcaudit_codes_it_names(tmp_path, comment, suppressed):
    make(tmp_path, {"bad.py": BAD.replace("GradScaler()", f"GradScaler()  {comment}")})
    assert flagged(tmp_path, "bad.py", "--select", "TC202")[1] == (set() if suppressed else {("bad.py", "TC202")})


def test_noqa_in_a_string_suppresses_nothing(tmp_path):
    make(tmp_path, {"bad.py": 'import torch\nscaler = torch.cuda.amp.GradScaler("# noqa: TC202")\n'})
    assert flagged(tmp_path, "bad.py", "--select", "TC202")[1] == {("bad.py", "TC202")}


# -- 6. colour -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env,flag,colour",
    [
        ({}, "auto", False),
        ({"FORCE_COLOR": "1"}, "auto", True),
        ({"FORCE_COLOR": ""}, "auto", False),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, "auto", False),
        ({"FORCE_COLOR": "1"}, "never", False),
        ({"NO_COLOR": "1"}, "always", True),
    ],
)
def test_force_color_and_no_color(tmp_path, monkeypatch, env, flag, colour):
    for name in ("FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    make(tmp_path, {"bad.py": BAD})
    _, out, _ = scan(tmp_path, "bad.py", "--select", "TC202", "--color", flag)
    assert ("\x1b[" in out) is colour


# -- 7. .gitignore and .ignore -----------------------------------------------------------------------


def git_project(root: Path) -> None:
    make(root, {
        ".git/HEAD": "ref: refs/heads/main\n",
        ".gitignore": "generated/\n*_gen.py\n",
        "src/.gitignore": "!keep_gen.py\n",
        ".ignore": "scratch/\n",
        "src/train.py": BAD, "src/x_gen.py": BAD, "src/keep_gen.py": BAD,
        "generated/a.py": BAD, "scratch/s.py": BAD,
    })


def test_gitignore_and_ignore_files_are_respected(tmp_path):
    git_project(tmp_path)
    select = ("--select", "TC202")
    assert {p for p, _ in flagged(tmp_path, ".", *select)[1]} == {"src/train.py", "src/keep_gen.py"}
    # A file named explicitly is scanned, and so is a folder named explicitly.
    assert {p for p, _ in flagged(tmp_path, "src/x_gen.py", "generated", *select)[1]} == {
        "src/x_gen.py", "generated/a.py"}
    everything = {"src/train.py", "src/keep_gen.py", "src/x_gen.py", "generated/a.py", "scratch/s.py"}
    assert {p for p, _ in flagged(tmp_path, ".", *select, "--no-respect-gitignore")[1]} == everything
    make(tmp_path, {"tcaudit.toml": "respect-gitignore = false\n"})
    assert {p for p, _ in flagged(tmp_path, ".", *select)[1]} == everything


def test_gitignore_outside_a_git_repository_is_not_read(tmp_path):
    make(tmp_path, {".gitignore": "*.py\n", ".ignore": "b.py\n", "a.py": BAD, "b.py": BAD})
    assert {p for p, _ in flagged(tmp_path, ".", "--select", "TC202")[1]} == {"a.py"}


def test_fix_respects_gitignore(tmp_path):
    git_project(tmp_path)
    code, out, _ = run_cli("fix", ".", "--select", "TC202", "--no-cache", cwd=tmp_path)
    assert code == 1
    assert {line[6:] for line in out.splitlines() if line.startswith("+++ b/")} == {"src/train.py", "src/keep_gen.py"}


# -- 8. tcaudit.toml and .tcaudit.toml --------------------------------------------------------------


def test_config_file_precedence_in_one_folder(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nselect = ["TC000"]\n', "sub/bad.py": BAD})
    assert flagged(tmp_path, "sub/bad.py") == (0, set())
    make(tmp_path, {"tcaudit.toml": 'select = ["TC202"]\n'})
    assert flagged(tmp_path, "sub/bad.py") == (1, {("sub/bad.py", "TC202")})
    make(tmp_path, {".tcaudit.toml": "# no settings: the defaults, and still the config file\nignore = [\"TC202\"]\n"})
    assert flagged(tmp_path, "sub/bad.py") == (0, set())
    code, out, _ = scan(tmp_path, "sub/bad.py", "--show-settings")
    assert f"config file: {tmp_path / '.tcaudit.toml'}" in out
    # The nearest folder wins, whichever file it has.
    make(tmp_path, {"sub/pyproject.toml": '[tool.tcaudit]\nselect = ["TC202"]\n'})
    assert flagged(tmp_path, "sub/bad.py") == (1, {("sub/bad.py", "TC202")})


def test_a_broken_tcaudit_toml_is_a_config_error(tmp_path):
    make(tmp_path, {"tcaudit.toml": "select = [\n", "bad.py": BAD})
    code, _, err = scan(tmp_path, "bad.py")
    assert code == 2 and "tcaudit.toml: invalid TOML" in err


# -- 9. tcaudit rules fits the terminal --------------------------------------------------------------


@pytest.mark.parametrize("columns,width", [("60", 80), ("80", 80), ("100", 100), ("200", 200)])
def test_rules_fits_the_terminal(monkeypatch, columns, width):
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run_cli("rules")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) == width
    # Every word of every summary is shown: the table wraps, it never cuts a cell off.
    from tcaudit.catalog import load_catalog

    shown = set(out.replace("│", " ").split())
    for spec in load_catalog().values():
        assert _folded(spec.summary, shown), spec.id


def _folded(summary: str, shown: set[str]) -> bool:
    """Every word of ``summary`` is shown whole, except a word too long for a narrow column (over
    16 characters: a code span), which is folded over lines."""
    return all(word in shown for word in summary.split() if len(word) <= 16)


# -- 5. TC001 unused-suppression --------------------------------------------------------------------

SUPPRESSED = """\
import torch  # tcaudit: ignore-file[TC6]
scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC202, TC2O1]
x = 1  # noqa: E501, TC202
y = 2  # tcaudit: ignore[TC303]
# tcaudit: ignore[TC999]
z = 3  # noqa: TC101
w = 4  # tcaudit: ignore
"""


def test_unused_and_unknown_suppression_codes_are_reported(tmp_path):
    make(tmp_path, {"t.py": SUPPRESSED})
    code, out, _ = scan(tmp_path, "t.py", "--format", "concise")
    assert code == 0  # TC001 is an info
    assert out.splitlines() == [
        "t.py:1:15: TC001 Unused suppression directive (unused: TC6)",
        "t.py:2:39: TC001 Unused suppression directive (unknown: TC2O1)",
        "t.py:3:8: TC001 Unused `noqa` directive (unused: TC202)",
        "t.py:4:8: TC001 Unused suppression directive (unused: TC303)",
        "t.py:5:1: TC001 Unused suppression directive (unknown: TC999)",
    ]
    # The fix is a list of text edits on the comment only.
    _, out, _ = scan(tmp_path, "t.py", "--format", "json")
    edits = [f["fix"]["edits"] for f in json.loads(out)["findings"]]
    assert edits[1] == [{"content": "TC202", "location": {"row": 2, "column": 57},
                         "end_location": {"row": 2, "column": 69}}]
    assert edits[4] == [{"content": "", "location": {"row": 5, "column": 1}, "end_location": {"row": 6, "column": 1}}]


def test_suppressions_of_rules_that_did_not_run_are_not_unused(tmp_path):
    make(tmp_path, {"t.py": SUPPRESSED, "broken.py": "x = (  # tcaudit: ignore[TC202]\n"})
    # Only TC001 and TC202 enabled: the TC6 and TC303 codes are for rules that did not run.
    assert flagged(tmp_path, "t.py", "--select", "TC001,TC202")[1] == {("t.py", "TC001")}
    _, out, _ = scan(tmp_path, "t.py", "--select", "TC001,TC202", "--format", "concise")
    assert [line.split("(")[1] for line in out.splitlines()] == ["unknown: TC2O1)", "unused: TC202)", "unknown: TC999)"]
    # per-file-ignores turning TC6 off: its code is not unused there.
    make(tmp_path, {"tcaudit.toml": '[per-file-ignores]\n"t.py" = ["TC6"]\n'})
    _, out, _ = scan(tmp_path, "t.py", "--format", "concise")
    assert "TC6" not in out and "TC303" in out
    # A file that does not parse: nothing is known to be unused.
    assert flagged(tmp_path, "broken.py")[1] == {("broken.py", "TC000")}
    # TC001 off: nothing reported.
    assert flagged(tmp_path, "t.py", "--ignore", "TC001") == (0, set())


def test_fix_removes_unused_suppression_codes(tmp_path):
    make(tmp_path, {"t.py": SUPPRESSED})
    code, _, err = run_cli("fix", "t.py", "--apply", "--no-cache", cwd=tmp_path)
    assert code == 0 and "fixed t.py (TC001)" in err
    assert (tmp_path / "t.py").read_text(encoding="utf-8") == """\
import torch
scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC202]
x = 1  # noqa: E501
y = 2
z = 3  # noqa: TC101
w = 4  # tcaudit: ignore
"""
    # Fixed twice, nothing changes; and scan finds no TC001 left.
    assert run_cli("fix", "t.py", "--no-cache", cwd=tmp_path)[0] == 0
    assert flagged(tmp_path, "t.py", "--select", "TC001") == (0, set())


@pytest.mark.parametrize(
    "line,fixed",
    [
        ("x = 1  # tcaudit: ignore[TC999]  # noqa: E501\n", "x = 1  # noqa: E501\n"),
        ("x = 1  # noqa: TC999 because it is slow\n", "x = 1  # because it is slow\n"),
        ("x = 1  # type: ignore  # noqa: TC999\n", "x = 1  # type: ignore\n"),
        ("x = 1  # noqa: TC999, E501\n", "x = 1  # noqa: E501\n"),
        ("x = 1\n    # tcaudit: ignore-file[TC9]\n", "x = 1\n"),
    ],
)
def test_the_fix_keeps_what_else_the_comment_says(tmp_path, line, fixed):
    make(tmp_path, {"t.py": line})
    assert run_cli("fix", "t.py", "--apply", "--no-cache", cwd=tmp_path)[0] == 0
    assert (tmp_path / "t.py").read_text(encoding="utf-8") == fixed


def test_unused_suppression_lines_count_as_the_tokenizer_does(tmp_path):
    make(tmp_path, {"t.py": "x = '\x0c'\n\x0cy = 2  # noqa: TC999\n"})
    _, out, _ = scan(tmp_path, "t.py", "--format", "concise")
    assert out.splitlines() == ["t.py:2:9: TC001 Unused `noqa` directive (unknown: TC999)"]
    assert run_cli("fix", "t.py", "--apply", "--no-cache", cwd=tmp_path)[0] == 0
    assert (tmp_path / "t.py").read_text(encoding="utf-8") == "x = '\x0c'\n\x0cy = 2\n"


def test_fix_leaves_a_noqa_suppressed_finding_alone(tmp_path):
    make(tmp_path, {"bad.py": BAD.replace("GradScaler()", "GradScaler()  # noqa: TC202"), "other.py": BAD})
    code, out, _ = run_cli("fix", ".", "--select", "TC202", "--no-cache", cwd=tmp_path)
    assert code == 1
    assert "+++ b/other.py" in out and "bad.py" not in out
