"""``# tcaudit: ignore[...]`` comments, ``ignore-file``, and baselines whose fingerprints survive
unrelated edits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli

SELECT = ("--select", "TC000,TC202")


def findings(cwd: Path, *args: str) -> tuple[int, list[tuple[str, int]]]:
    code, out, err = run_cli("scan", ".", "--format", "json", *SELECT, *args, cwd=cwd)
    assert code in (0, 1), err
    return code, [(f["rule"], f["line"]) for f in json.loads(out)["findings"]]


def write(path: Path, code: str) -> None:
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")


# -- suppression comments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line,suppressed",
    [
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC202]", True),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC201, TC202]", True),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC2]", True),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[tc202]", True),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore", True),
        ("scaler = torch.cuda.amp.GradScaler()  #tcaudit:ignore", True),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC201]", False),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC3]", False),
        ("scaler = torch.cuda.amp.GradScaler()  # tcaudit: ignored on purpose", False),
        ("scaler = torch.cuda.amp.GradScaler()  # noqa", False),
    ],
)
def test_line_suppression(tmp_path, line, suppressed):
    write(tmp_path / "train.py", f"import torch\n{line}\n")
    code, found = findings(tmp_path)
    assert found == ([] if suppressed else [("TC202", 2)])
    assert code == (0 if suppressed else 1)


def test_line_suppression_applies_to_its_line_only(tmp_path):
    write(
        tmp_path / "train.py",
        """
        import torch
        # tcaudit: ignore[TC202]
        scaler = torch.cuda.amp.GradScaler()
        other = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC202]
        """,
    )
    assert findings(tmp_path)[1] == [("TC202", 3)]


def test_suppression_on_the_last_line_of_a_multiline_finding(tmp_path):
    write(
        tmp_path / "train.py",
        """
        import torch
        scaler = torch.cuda.amp.GradScaler(
            init_scale=2.0**16,
        )
        """,
    )
    assert findings(tmp_path)[1] == [("TC202", 2)]
    write(tmp_path / "train.py", "import torch\nscaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore\n")
    assert findings(tmp_path)[1] == []


@pytest.mark.parametrize(
    "comment,suppressed",
    [
        ("# tcaudit: ignore-file[TC2]", True),
        ("# tcaudit: ignore-file[TC202]", True),
        ("# tcaudit: ignore-file", True),
        ("# tcaudit: ignore-file[TC3]", False),
        ("# tcaudit: ignore-file[TC000]", False),
    ],
)
def test_file_suppression(tmp_path, comment, suppressed):
    write(
        tmp_path / "train.py",
        f"""
        import torch
        scaler = torch.cuda.amp.GradScaler()


        def step():
            {comment}
            with torch.cuda.amp.autocast():
                pass
        """,
    )
    (tmp_path / "other.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n", encoding="utf-8")
    code, found = findings(tmp_path)
    assert code == 1
    expected = [("TC202", 2)] if suppressed else [("TC202", 2), ("TC202", 2), ("TC202", 7)]
    assert found == expected


def test_file_suppression_does_not_hide_parse_errors_of_other_rules(tmp_path):
    write(tmp_path / "broken.py", "# tcaudit: ignore-file[TC2]\ndef f(:\n")
    assert findings(tmp_path)[1] == [("TC000", 2)]


def test_json_summary_counts_suppressed_findings(tmp_path):
    write(tmp_path / "train.py", "import torch\nscaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore\n")
    _, out, _ = run_cli("scan", ".", "--format", "json", *SELECT, cwd=tmp_path)
    assert json.loads(out)["summary"]["suppressed"] == 1


# -- baselines --------------------------------------------------------------------------------------------

TRAIN = """
import torch


def build():
    return torch.cuda.amp.GradScaler()


def train(model, loader):
    with torch.cuda.amp.autocast():
        model(loader)
"""


def test_baseline_round_trip(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    assert findings(tmp_path)[1] == [("TC202", 5), ("TC202", 9)]

    code, out, err = run_cli("scan", ".", *SELECT, "--write-baseline", "baseline.json", cwd=tmp_path)
    assert code == 0 and out == ""
    assert "recorded 2 findings in baseline.json" in err
    data = json.loads((tmp_path / "baseline.json").read_text(encoding="utf-8"))
    assert data["tcaudit_baseline"] == 1 and len(data["findings"]) == 2

    assert findings(tmp_path, "--baseline", "baseline.json") == (0, [])

    # Unrelated lines above the findings move them down; they stay baselined.
    text = (tmp_path / "train.py").read_text(encoding="utf-8")
    shifted = '"""Training entry point."""\nimport os\nimport sys\n\nSEED = 0\n' + text.replace(
        "def train(model, loader):\n", "def train(model, loader):\n    os.environ.setdefault('X', '1')\n"
    )
    (tmp_path / "train.py").write_text(shifted, encoding="utf-8")
    assert findings(tmp_path)[1] == [("TC202", 10), ("TC202", 15)]
    assert findings(tmp_path, "--baseline", "baseline.json") == (0, [])

    # A new finding shows up, including a copy of a baselined line in another function.
    with open(tmp_path / "train.py", "a", encoding="utf-8") as out_file:
        out_file.write("\n\ndef evaluate():\n    return torch.cuda.amp.GradScaler()\n")
    assert findings(tmp_path, "--baseline", "baseline.json") == (1, [("TC202", 20)])


def test_baseline_keeps_a_second_identical_finding_new(tmp_path):
    write(tmp_path / "train.py", "import torch\na = torch.cuda.amp.GradScaler()\n")
    run_cli("scan", ".", *SELECT, "--write-baseline", "baseline.json", cwd=tmp_path)
    write(tmp_path / "train.py", "import torch\na = torch.cuda.amp.GradScaler()\na = torch.cuda.amp.GradScaler()\n")
    assert findings(tmp_path, "--baseline", "baseline.json") == (1, [("TC202", 3)])


def test_baseline_in_other_formats(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    run_cli("scan", ".", *SELECT, "--write-baseline", "baseline.json", cwd=tmp_path)

    def scan(fmt: str) -> str:
        code, out, err = run_cli("scan", ".", *SELECT, "--baseline", "baseline.json", "--format", fmt, cwd=tmp_path)
        assert code == 0, (fmt, err)
        return out

    assert scan("concise") == ""
    assert scan("github") == ""
    # (issue 51) the summary says what the baseline holds back
    assert scan("text").strip() == "All clear: no new findings in 1 file; 2 findings are in the baseline."
    assert json.loads(scan("sarif"))["runs"][0]["results"] == []
    assert 'tests="0"' in scan("junit")


def test_baseline_works_from_another_working_directory(tmp_path):
    """Fingerprints use the path relative to the project root, not to the current directory."""
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC202"]\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.py").write_text("import torch\ns = torch.cuda.amp.GradScaler()\n")
    code, _, _ = run_cli("scan", "sub/t.py", "--write-baseline", "base.json", cwd=tmp_path)
    assert code == 0
    code, out, _ = run_cli("scan", "t.py", "--baseline", "../base.json", "--format", "concise", cwd=tmp_path / "sub")
    assert code == 0 and out.strip() == ""
