"""Jupyter notebooks: scan and fix read the code cells as one script and report cell positions
(tcaudit/source/notebook.py); fix --apply writes back only the changed code cells' sources."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from tcaudit.source.notebook import SEPARATOR, Notebook, NotebookEditError, mask
from tcaudit.source.parsing import SourceError

RESNET = FIXTURES / "resnet50" / "train.py"
TINY = FIXTURES / "verify" / "tiny_train.py"
MAGICS = "%matplotlib inline\n!nvidia-smi\n"


def code_cell(source, cell_id: str, execution_count=None, outputs=(), as_list: bool = True) -> dict:
    text = source.rstrip("\n")  # as Jupyter stores it: the last line without its newline
    return {
        "cell_type": "code",
        "execution_count": execution_count,
        "id": cell_id,
        "metadata": {"tags": ["train"], "collapsed": False},
        "outputs": list(outputs),
        "source": text.splitlines(keepends=True) if as_list else text,
    }


def fixture_notebook() -> dict:
    """The ResNet50 fixture's code in five code cells, with markdown cells (one with an attachment), an
    output-bearing cell, line magics, a shell line and a %%time cell magic cell."""
    lines = RESNET.read_text(encoding="utf-8").splitlines(keepends=True)

    def at(prefix: str) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(prefix))

    cuts = [0, at("import argparse"), at("def get_args"), at("class SyntheticBatches"), at("def main"), len(lines)]
    chunks = ["".join(lines[a:b]) for a, b in zip(cuts, cuts[1:])]
    image = {"output_type": "display_data", "metadata": {"image/png": {"width": 10}},
             "data": {"image/png": "iVBORw0KGgoAAAANSUhEUgAAAAE=", "text/plain": ["<Figure size 10x10>"]}}
    stream = {"output_type": "stream", "name": "stdout", "text": ["Tue Dec  1 GPU 0: H200\n"]}
    cells = [
        {"cell_type": "markdown", "id": "md-0", "metadata": {},
         "source": ["# ResNet50 — naïve ![plot](attachment:plot.png)\n", "Training in a notebook."],
         "attachments": {"plot.png": {"image/png": "iVBORw0KGgo="}}},
        code_cell(chunks[0], "code-1"),
        code_cell(MAGICS + chunks[1], "code-2", execution_count=3, outputs=[image, stream]),
        code_cell("%%time\nimport os\nprint(os.getcwd())\n", "code-3", execution_count=4),
        code_cell(chunks[2], "code-4", as_list=False),
        {"cell_type": "markdown", "id": "md-1", "metadata": {"jp-MarkdownHeadingCollapsed": True}, "source": "The model:"},
        code_cell(chunks[3], "code-5"),
        {"cell_type": "raw", "id": "raw-0", "metadata": {}, "source": ["%notacell magic\n"]},
        code_cell(chunks[4], "code-6", execution_count=7),
    ]
    return {
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python", "version": "3.11.7"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def jupyter_bytes(data: dict, **style) -> bytes:
    style = style or {"indent": 1, "ensure_ascii": False}
    return (json.dumps(data, **style) + "\n").encode("utf-8")


@pytest.fixture
def notebook(tmp_path) -> Path:
    path = tmp_path / "train.ipynb"
    path.write_bytes(jupyter_bytes(fixture_notebook()))
    return path


def scan_json(*paths: str, cwd: Path | None = None, extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    code, stdout, stderr = run_cli("scan", "--no-exec", "--no-cache", "--isolated", "--format", "json", *extra,
                                   *paths, cwd=cwd)
    return code, json.loads(stdout)


# -- the Notebook model ------------------------------------------------------------------------------
STYLES = {
    "jupyter (indent 1)": {"indent": 1, "ensure_ascii": False},
    "indent 2": {"indent": 2, "ensure_ascii": False},
    "indent 4, ASCII escapes": {"indent": 4, "ensure_ascii": True},
    "compact": {"ensure_ascii": False},
    "compact, no spaces": {"separators": (",", ":"), "ensure_ascii": False},
}


@pytest.mark.parametrize("style", list(STYLES.values()), ids=list(STYLES))
def test_unchanged_text_renders_the_original_bytes_and_a_change_keeps_the_style(style):
    raw = jupyter_bytes(fixture_notebook(), **style)
    nb = Notebook.parse(raw)
    assert nb.render(nb.text) == raw
    new = nb.text.replace("    return parser.parse_args()", "    return parser.parse_args(None)")
    assert new != nb.text
    out = nb.render(new)
    data = json.loads(out)
    assert out == jupyter_bytes(data, **style)  # written in the file's own style
    original = fixture_notebook()
    changed = [i for i, (a, b) in enumerate(zip(original["cells"], data["cells"])) if a != b]
    assert [original["cells"][i]["id"] for i in changed] == ["code-4"]
    assert data["cells"][4]["source"].endswith("return parser.parse_args(None)")  # a string stays a string
    assert "naïve" in out.decode("utf-8") or "na\\u00efve" in out.decode("utf-8")


def test_windows_line_ends_and_a_byte_order_mark_are_kept():
    raw = b"\xef\xbb\xbf" + jupyter_bytes(fixture_notebook()).replace(b"\n", b"\r\n")
    nb = Notebook.parse(raw)
    assert nb.render(nb.text) == raw
    out = nb.render(nb.text.replace("    return parser.parse_args()", "    return parser.parse_args(None)"))
    assert out.startswith(b"\xef\xbb\xbf{\r\n \"cells\"") and b"parse_args(None)" in out
    assert out.count(b"\r\n") == raw.count(b"\r\n") and b"\n" not in out.replace(b"\r\n", b"")


def test_list_source_keeps_lines_and_the_last_line_without_newline():
    data = {"cells": [code_cell("x = 1\ny = 2\n", "a")], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    nb = Notebook.parse(jupyter_bytes(data))
    out = json.loads(nb.render(nb.text.replace("y = 2", "y = 3\nz = 4")))
    assert out["cells"][0]["source"] == ["x = 1\n", "y = 3\n", "z = 4"]


def test_a_cell_that_ends_with_a_newline_keeps_it():
    data = {"cells": [code_cell("x = 1", "a")], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    data["cells"][0]["source"] = "x = 1\n"
    nb = Notebook.parse(jupyter_bytes(data))
    assert json.loads(nb.render("x = 2\n"))["cells"][0]["source"] == "x = 2\n"


MASKING = {
    "line magic": ("%matplotlib inline\nx = 1", ["# tcaudit-magic: %matplotlib inline", "x = 1"]),
    "shell line, indented": ("for i in range(2):\n    !echo {i}", ["for i in range(2):", "    # tcaudit-magic: !echo {i}"]),
    "help syntax": ("torch.zeros?\nx??", ["# tcaudit-magic: torch.zeros?", "# tcaudit-magic: x??"]),
    "modulo continuing an expression": ("x = (1\n     % 2)", ["x = (1", "     % 2)"]),
    "a multi-line string's line": ("s = '''\n%d items\n'''", ["s = '''", "%d items", "'''"]),
    "a question in a comment or string": ("# why?\nq = 'why?'", ["# why?", "q = 'why?'"]),
    "a shell line continued": ("!pip install \\\n    torch\nx = 1",
                               ["# tcaudit-magic: !pip install \\", "    # tcaudit-magic: torch", "x = 1"]),
}


@pytest.mark.parametrize("source, expected", list(MASKING.values()), ids=list(MASKING))
def test_masking(source, expected):
    masked, pairs = mask(source)
    assert masked == expected
    assert [original for _, original in pairs] == [
        line for line, out in zip(source.split("\n"), expected) if line != out]


def test_cell_magic_cells_and_other_kernels_give_no_code():
    nb = Notebook.parse(jupyter_bytes(fixture_notebook()))
    assert "os.getcwd" not in nb.text and "%%time" not in nb.text
    assert [cell.number for cell in nb.cells if not cell.included] == [4]  # the notebook's fourth cell
    assert nb.text.count(SEPARATOR) == 4  # five code cells in the script
    assert compile(nb.text, "train.ipynb", "exec")
    r = fixture_notebook()
    r["metadata"] = {"kernelspec": {"language": "R", "name": "ir"}, "language_info": {"name": "R"}}
    assert Notebook.parse(jupyter_bytes(r)).text == ""


@pytest.mark.parametrize("raw, message", [
    (b'{"cells": [', "cannot parse notebook: invalid JSON (line 1 column 12"),
    (b"[]", "not a Jupyter notebook: no list of cells"),
    (b'{"cells": [], "nbformat": 3}', "not a Jupyter notebook in nbformat 4"),
    (b'{"cells": [{"cell_type": "code", "source": 5}], "nbformat": 4}', "code cell 1's source is not text"),
    (b'{"cells": [], "nbformat": 4, "x": "\xff"}', "not valid UTF-8"),
])
def test_not_a_notebook_is_a_source_error(raw, message):
    with pytest.raises(SourceError, match=None) as caught:
        Notebook.parse(raw)
    assert message in caught.value.message


@pytest.mark.parametrize("edit, reason", [
    (lambda text: text.replace(f"{SEPARATOR}3\n", ""), "spans notebook cells"),
    (lambda text: text.replace("# tcaudit-magic: %matplotlib inline", "    # tcaudit-magic: %matplotlib inline"),
     "change an IPython line"),
    (lambda text: text.replace("# tcaudit-magic: !nvidia-smi\n", ""), "remove an IPython line"),
    (lambda text: text.replace("    return parser.parse_args()", "    return parser.parse_args("), "would not compile on its own"),
])
def test_edits_that_cannot_go_back_into_the_cells(edit, reason):
    nb = Notebook.parse(jupyter_bytes(fixture_notebook()))
    with pytest.raises(NotebookEditError, match=reason):
        nb.render(edit(nb.text))
    assert nb.check(edit(nb.text)) is not None and nb.check(nb.text) is None


# -- scan ------------------------------------------------------------------------------------------------
def test_scan_finds_what_the_script_has_at_the_cells_lines(notebook):
    _, script = scan_json(str(RESNET))
    _, book = scan_json(str(notebook))
    script_findings, book_findings = script["findings"], book["findings"]
    assert Counter(f["rule"] for f in book_findings) == Counter(f["rule"] for f in script_findings)
    assert len(book_findings) >= 10
    nb = Notebook.parse(notebook.read_bytes())
    py_lines = RESNET.read_text(encoding="utf-8").splitlines()
    by_rule = lambda findings: sorted(findings, key=lambda f: (f["rule"], f.get("cell", 0), f["line"], f["column"]))
    for ours, theirs in zip(by_rule(book_findings), by_rule(script_findings)):
        assert ours["rule"] == theirs["rule"]
        cell = nb.cell(ours["cell"])
        assert cell is not None and cell.included
        assert cell.lines[ours["line"] - 1] == py_lines[theirs["line"] - 1], ours
        assert ours["column"] == theirs["column"]
        assert ours["end_line"] <= len(cell.lines)
    tc201 = next(f for f in book_findings if f["rule"] == "TC201")
    assert tc201["cell"] == 9 and "output = model(images)" in nb.cell(9).lines[tc201["line"] - 1]
    assert f"(cell 9 line {tc201['line']}-{tc201['line'] + 1})" in tc201["message"]  # lines in messages too


def test_text_and_concise_formats_show_cell_line_column(notebook):
    _, text, _ = run_cli("scan", "--no-exec", "--no-cache", "--isolated", str(notebook))
    _, concise, _ = run_cli("scan", "--no-exec", "--no-cache", "--isolated", "--format", "concise", str(notebook))
    assert f"{notebook.as_posix()}:cell 9:" in text and "Top: TC201" in text
    assert "output = model(images)" in text  # the code frame shows the cell's lines
    for line in concise.splitlines():
        assert line.startswith(f"{notebook.as_posix()}:cell "), line
    assert "%matplotlib" not in text


def test_suppression_comment_inside_a_cell(tmp_path):
    data = {"cells": [code_cell("import torch\nx = torch.randn(8, 8).cuda()  # noqa: TC406", "a")],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_bytes(jupyter_bytes(data))
    _, report = scan_json(str(path), extra=("--select", "TC406"))
    assert report["findings"] == [] and report["summary"]["suppressed"] == 1


def test_a_syntax_error_in_a_cell_is_tc000_at_the_cell(tmp_path):
    data = {"cells": [code_cell("x = 1", "a"), code_cell("y = (", "b")], "metadata": {}, "nbformat": 4,
            "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_bytes(jupyter_bytes(data))
    code, report = scan_json(str(path))
    assert code == 1
    assert [(f["rule"], f["cell"], f["line"]) for f in report["findings"]] == [("TC000", 2, 1)]


@pytest.mark.parametrize("content", [b'{"cells": [', b'{"cells": {}, "nbformat": 4}'])
def test_invalid_notebook_is_one_tc000_and_fix_leaves_it_alone(tmp_path, content):
    path, broken_py = tmp_path / "bad.ipynb", tmp_path / "bad.py"
    path.write_bytes(content)
    broken_py.write_text("x = (\n")
    code, report = scan_json(str(path))
    py_code, _ = scan_json(str(broken_py))
    assert code == py_code == 1
    assert [f["rule"] for f in report["findings"]] == ["TC000"]
    assert "notebook" in report["findings"][0]["message"] and "cell" not in report["findings"][0]
    fix_code, _, stderr = run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", str(path))
    assert fix_code == 1 and "not fixed" in stderr  # its TC000 remains (ruff's check --fix exits 1 too)
    assert path.read_bytes() == content


# -- fix -------------------------------------------------------------------------------------------------
def test_fix_apply_changes_only_code_cell_sources(notebook):
    before = notebook.read_bytes()
    code, _, diff_err = run_cli("fix", "--no-exec", "--no-cache", "--isolated", str(notebook))
    _, diff, _ = run_cli("fix", "--no-exec", "--no-cache", "--isolated", str(notebook))
    assert code == 1 and notebook.read_bytes() == before
    assert f"--- {notebook.as_posix()}:cell 9\n+++ {notebook.as_posix()}:cell 9\n" in diff  # (absolute: no a/)
    assert '"cells"' not in diff and SEPARATOR not in diff
    code, _, stderr = run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", str(notebook))
    # 1: the declined findings remain (TC601's logging, TC307), as ruff's check --fix says
    assert code == 1 and "fixed" in stderr and "TC201" in stderr, stderr
    assert f"{notebook.as_posix()}:cell 9:" in stderr  # declines name the cell (TC601: logging)
    after = notebook.read_bytes()
    old, new = json.loads(before), json.loads(after)
    assert after == jupyter_bytes(new)  # Jupyter's indent=1 and non-ASCII text kept
    assert {k: v for k, v in old.items() if k != "cells"} == {k: v for k, v in new.items() if k != "cells"}
    changed = []
    for a, b in zip(old["cells"], new["cells"], strict=True):
        if a["cell_type"] != "code":
            assert a == b
            continue
        assert {k: v for k, v in a.items() if k != "source"} == {k: v for k, v in b.items() if k != "source"}
        assert type(a["source"]) is type(b["source"])
        if a["source"] != b["source"]:
            changed.append(a["id"])
    assert "code-6" in changed and "code-3" not in changed and "code-4" not in changed and "code-5" not in changed
    assert "".join(new["cells"][2]["source"]).startswith(MAGICS)  # the magics are back, verbatim
    assert new["cells"][2]["outputs"] == old["cells"][2]["outputs"]
    nb = Notebook.parse(after)
    assert compile(nb.text, "train.ipynb", "exec")
    for cell in nb.cells:
        if cell.included:
            compile(cell.masked, f"cell {cell.number}", "exec")
    assert "torch.autocast" in nb.cell(9).source
    _, report = scan_json(str(notebook))
    assert "TC201" not in {f["rule"] for f in report["findings"]}


def test_a_fix_that_spans_cells_is_declined_and_the_file_kept(tmp_path):
    setup = ("import torch\nimport torch.nn as nn\nmodel = nn.Linear(64, 10).cuda()\n"
             "criterion = nn.CrossEntropyLoss()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "x = torch.randn(8, 64).cuda()\ny = torch.randint(0, 10, (8,)).cuda()")
    data = {"cells": [code_cell(setup, "a"), code_cell("output = model(x)", "b"),
                      code_cell("loss = criterion(output, y)\noptimizer.zero_grad()\nloss.backward()\noptimizer.step()", "c")],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "span.ipynb"
    path.write_bytes(jupyter_bytes(data))
    before = path.read_bytes()
    _, report = scan_json(str(path), extra=("--select", "TC201"))
    assert [(f["rule"], f["cell"]) for f in report["findings"]] == [("TC201", 2)]
    code, _, stderr = run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", "--select", "TC201", str(path))
    assert code == 1  # the declined TC201 remains
    assert f"{path.as_posix()}:cell 2:1: TC201 no fix: the fix spans notebook cells" in stderr
    assert path.read_bytes() == before


# -- discovery and config ---------------------------------------------------------------------------------
def test_folder_scan_includes_notebooks_honours_exclude_and_extend_include(tmp_path):
    raw = jupyter_bytes(fixture_notebook())
    (tmp_path / "a.ipynb").write_bytes(raw)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_bytes(raw)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "b.ipynb").write_bytes(raw)
    (tmp_path / "t.pyw").write_text(RESNET.read_text(encoding="utf-8"))
    args = ("--select", "TC201")
    _, report = scan_json(".", cwd=tmp_path, extra=args)
    assert sorted(f["path"] for f in report["findings"]) == ["a.ipynb", "old/b.ipynb"]
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nexclude = ["old"]\nextend-include = ["*.pyw"]\n')
    code, stdout, stderr = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", *args, ".", cwd=tmp_path)
    assert sorted(f["path"] for f in json.loads(stdout)["findings"]) == ["a.ipynb", "t.pyw"], stderr
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\ninclude = ["*.py"]\n')
    _, stdout, _ = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", *args, ".", cwd=tmp_path)
    assert json.loads(stdout)["findings"] == []
    _, stdout, _ = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", *args, "--extend-include", "*.pyw",
                           ".", cwd=tmp_path)
    assert [f["path"] for f in json.loads(stdout)["findings"]] == ["t.pyw"]
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nextend-include = 3\n')
    code, _, stderr = run_cli("scan", "--no-exec", "--no-cache", ".", cwd=tmp_path)
    assert code == 2 and "'extend-include' must be a list of glob patterns" in stderr and "Traceback" not in stderr


# -- stdin, reports, cache --------------------------------------------------------------------------------
def test_stdin_with_a_notebook_name(monkeypatch):
    text = jupyter_bytes(fixture_notebook()).decode("utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code, stdout, _ = run_cli("scan", "--no-exec", "--isolated", "--format", "concise", "--select", "TC201", "-",
                              "--stdin-filename", "nb.ipynb")
    assert code == 1 and stdout.startswith("nb.ipynb:cell 9:")
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code, stdout, stderr = run_cli("fix", "--isolated", "--select", "TC201", "-", "--stdin-filename", "nb.ipynb")
    assert code == 0 and "fixed nb.ipynb (TC201)" in stderr
    fixed = json.loads(stdout)
    assert "torch.autocast" in "".join(fixed["cells"][8]["source"])
    assert [c for c in fixed["cells"] if c["cell_type"] != "code"] == [
        c for c in fixture_notebook()["cells"] if c["cell_type"] != "code"]


def test_sarif_github_and_junit_carry_the_cell(notebook):
    from test_reports import assert_valid_sarif

    _, sarif, _ = run_cli("scan", "--no-exec", "--no-cache", "--isolated", "--format", "sarif", str(notebook))
    log = json.loads(sarif)
    results = log["runs"][0]["results"]
    assert results and all(isinstance(r["properties"]["cell"], int) for r in results)
    assert all("fixes" not in r for r in results)  # edits count cell lines, not the JSON file's
    tc201 = next(r for r in results if r["ruleId"] == "TC201")
    assert tc201["properties"]["cell"] == 9 and tc201["locations"][0]["physicalLocation"]["region"]["startLine"] < 60
    assert_valid_sarif(log)
    _, github, _ = run_cli("scan", "--no-exec", "--no-cache", "--isolated", "--format", "github", str(notebook))
    assert "title=cell 9%3A TC201 missing-autocast" in github
    _, junit, _ = run_cli("scan", "--no-exec", "--no-cache", "--isolated", "--format", "junit", str(notebook))
    assert "TC201 missing-autocast (cell 9:" in junit


def test_json_edits_are_cell_relative(notebook):
    _, report = scan_json(str(notebook), extra=("--select", "TC403"))
    nb = Notebook.parse(notebook.read_bytes())
    for finding in report["findings"]:
        for edit in finding["fix"]["edits"]:
            assert edit["cell"] == finding["cell"]
            line = nb.cell(edit["cell"]).lines[edit["location"]["row"] - 1]
            assert ".cuda(" in line


def test_a_cache_hit_is_moved_to_the_cells_once(notebook, tmp_path):
    args = ("scan", "--no-exec", "--isolated", "--format", "json", "--cache-dir", str(tmp_path / "cache"), str(notebook))
    _, first, _ = run_cli(*args)
    _, second, _ = run_cli(*args)
    assert json.loads(first)["findings"] == json.loads(second)["findings"]
    assert any(f["cell"] == 9 for f in json.loads(second)["findings"])


# -- the model audit and verify (they run the code) --------------------------------------------------------
def test_model_audit_runs_on_a_notebook(notebook):
    pytest.importorskip("torch")
    code, stdout, stderr = run_cli("scan", "--no-cache", "--isolated", "--format", "json", "--select", "TC103",
                                   str(notebook))
    findings = json.loads(stdout)["findings"]
    assert [(f["rule"], f["cell"]) for f in findings] == [("TC103", 9)], stderr


def test_verify_runs_the_code_cells_in_order_as_a_script(tmp_path):
    pytest.importorskip("torch")
    head, loop = TINY.read_text(encoding="utf-8").split("for step in range")
    data = {"cells": [code_cell("!pip install no-such-package-xyz\n%matplotlib inline\n" + head, "a"),
                      {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "The loop:"},
                      code_cell("for step in range" + loop, "b")],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "tiny.ipynb"
    path.write_bytes(jupyter_bytes(data))
    before = path.read_bytes()
    out = tmp_path / "out"
    # The tiny model is launch-bound: its autocast is applied where TC201 is named (issue 52).
    code, stdout, stderr = run_cli("verify", str(path), "--steps", "2", "--warmup", "1", "--rounds", "1",
                                   "--extend-select", "TC201", "--out", str(out), "--", "--steps", "10",
                                   "--batch-size", "8")
    assert code == 0, stderr + stdout
    result = json.loads((out / "verify.json").read_text())
    assert "TC201" in result["fixes_applied"] and result["loss_parity"] is True
    original = (out / "work" / "original" / "tiny.py").read_text()
    assert original.startswith("# tcaudit-magic: !pip install no-such-package-xyz\n")
    assert "torch.autocast" in (out / "work" / "patched" / "tiny.py").read_text()
    assert ":cell 3" in (out / "work" / "patch.diff").read_text()  # the loop: the notebook's third cell
    assert path.read_bytes() == before


# -- issue 49: a lone surrogate in a cell, CRLF inside cells ------------------------------------------
CRLF_CELL = ["import torch\r\n", "model = torch.nn.Linear(64, 64).cuda()\r\n",
             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\r\n", "for step in range(3):\r\n",
             "    loss = model(torch.randn(8, 64, device=\"cuda\")).sum()\r\n", "    loss.backward()\r\n",
             "    opt.step()\r\n", "    opt.zero_grad()"]


def test_a_lone_surrogate_in_a_cell_is_one_tc000_and_the_other_files_are_scanned(tmp_path):
    data = {"cells": [code_cell("import torch\nx = '\ud800'\n", "a")], "metadata": {}, "nbformat": 4,
            "nbformat_minor": 5}
    path = tmp_path / "surrogate.ipynb"
    raw = json.dumps(data, indent=1).encode("ascii")  # "\ud800": valid JSON
    path.write_bytes(raw)
    (tmp_path / "other.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    code, report = scan_json(".", cwd=tmp_path)
    assert code == 1
    assert sorted((Path(f["path"]).name, f["rule"]) for f in report["findings"]) == [
        ("other.py", "TC202"), ("surrogate.ipynb", "TC000")]
    [tc000] = [f for f in report["findings"] if f["rule"] == "TC000"]
    assert "code cell 1 line 2 holds a lone surrogate (\\ud800)" in tc000["message"]
    fix_code, _, stderr = run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", ".", cwd=tmp_path)
    # The notebook's TC000 remains, so fix --apply exits 1 as ruff's check --fix does with a finding left.
    assert fix_code == 1 and "not fixed" in stderr and "fixed other.py" in stderr.replace(str(tmp_path) + "/", "")
    assert path.read_bytes() == raw


def test_fix_keeps_crlf_inside_cells_byte_for_byte(tmp_path):
    data = {"cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
                       "source": CRLF_CELL}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "crlf.ipynb"
    path.write_bytes(jupyter_bytes(data))
    code, _, stderr = run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", "--select", "TC201",
                              str(path))
    assert code in (0, 1) and "fixed" in stderr, stderr
    source = json.loads(path.read_bytes())["cells"][0]["source"]
    autocast = 'with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):'
    expected = [*CRLF_CELL[:4], f"    {autocast}\r\n",
                "        loss = model(torch.randn(8, 64, device=\"cuda\")).sum()\r\n", *CRLF_CELL[5:]]
    assert source == expected
    again = path.read_bytes()
    run_cli("fix", "--apply", "--no-exec", "--no-cache", "--isolated", "--select", "TC201", str(path))
    assert path.read_bytes() == again  # a second fix changes nothing
    nb = Notebook.parse(again)
    namespace: dict = {}
    exec(compile(nb.text.replace('device="cuda"', 'device="cpu"').replace(".cuda()", ""), "crlf.ipynb", "exec"),
         namespace)  # the patched cell still runs (on the CPU)
    assert namespace["step"] == 2


def test_a_cell_with_mixed_line_ends_keeps_each_kept_line_end():
    data = {"cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
                       "source": ["x = 1\r\n", "y = 2\n", "z = 3\r\n", "w = 4"]}],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    nb = Notebook.parse(jupyter_bytes(data))
    out = json.loads(nb.render(nb.text.replace("y = 2\n", "y = 2\nv = 5\n")))
    assert out["cells"][0]["source"] == ["x = 1\r\n", "y = 2\n", "v = 5\r\n", "z = 3\r\n", "w = 4"]
