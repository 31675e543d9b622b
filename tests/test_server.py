"""`tcaudit server`: the language server, driven over JSON-RPC by a small Python client (always runs)
and by a real Neovim started headless (skipped where nvim is absent)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tcaudit import api
from tcaudit.lsp import convert
from tcaudit.rewrite.textedits import apply_edits

sys.path.insert(0, str(Path(__file__).parent))
from lsp_client import LspClient, apply_text_edits  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "resnet50" / "train.py"
ENV = {"PYTHONPATH": str(REPO)}  # the server runs this checkout's tcaudit


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("lsp")
    (root / "pyproject.toml").write_text('[tool.tcaudit]\nexec-models = false\n')
    shutil.copy(FIXTURE, root / "train.py")
    return root


@pytest.fixture(scope="module")
def client(project):
    client = LspClient(project, env=ENV)
    client.initialize(project)
    yield client
    assert client.close() == 0


def _open(client: LspClient, path: Path, text: str, version: int = 1) -> dict:
    client.notify("textDocument/didOpen", {"textDocument": {
        "uri": path.as_uri(), "languageId": "python", "version": version, "text": text}})
    return client.wait_for("textDocument/publishDiagnostics",
                           lambda p: p["uri"] == path.as_uri() and p.get("version") == version)


def _change(client: LspClient, path: Path, text: str, version: int, wait: bool = True) -> dict | None:
    client.notify("textDocument/didChange", {"textDocument": {"uri": path.as_uri(), "version": version},
                                             "contentChanges": [{"text": text}]})
    if not wait:
        return None
    return client.wait_for("textDocument/publishDiagnostics",
                           lambda p: p["uri"] == path.as_uri() and p.get("version") == version)


def _actions(client: LspClient, path: Path, diagnostic: dict, only: list[str] | None = None) -> list[dict]:
    context: dict = {"diagnostics": [diagnostic]}
    if only:
        context["only"] = only
    return client.request("textDocument/codeAction", {
        "textDocument": {"uri": path.as_uri()}, "range": diagnostic["range"], "context": context})


def _edits(action: dict) -> list[dict]:
    return action["edit"]["documentChanges"][0]["edits"]


def test_publishes_the_fixture_findings_as_scan_reports_them(client, project):
    path = project / "train.py"
    text = path.read_text()
    published = _open(client, path, text)
    expected = api.scan(text=text, filename="train.py", settings=api.load([path]), edits=False)
    assert [(d["code"], d["range"]["start"]["line"] + 1, d["message"]) for d in published["diagnostics"]] == [
        (f.rule, f.location.line, f.message) for f in expected]
    tc201 = next(d for d in published["diagnostics"] if d["code"] == "TC201")
    assert tc201["source"] == "tcaudit"
    assert tc201["severity"] == 2  # warning
    assert tc201["codeDescription"]["href"].endswith("/TC201.md")
    assert text.splitlines()[tc201["range"]["start"]["line"]][tc201["range"]["start"]["character"]:].startswith("output = model(")
    # A finding that presumes another rule's fix points at that rule's finding.
    followers = [d for d in published["diagnostics"] if d.get("relatedInformation")]
    for d in followers:
        assert all(r["location"]["uri"] == path.as_uri() for r in d["relatedInformation"])


def test_quick_fix_turns_the_fp32_forward_into_autocast(client, project):
    path = project / "train.py"
    text = path.read_text()
    published = _open(client, path, text, version=10)
    tc201 = next(d for d in published["diagnostics"] if d["code"] == "TC201")
    actions = _actions(client, path, tc201, only=["quickfix"])
    titles = [a["title"] for a in actions]
    assert titles[0].startswith("Apply numerics fix: ") and titles[0].endswith("(TC201)")
    assert "Suppress TC201 on this line" in titles
    assert all(a["kind"] == "quickfix" for a in actions)
    fixed = apply_text_edits(text, _edits(actions[0]))
    # Exactly the finding's own edits, as the API (and JSON output) gives them.
    finding = next(f for f in api.scan(text=text, filename="train.py", settings=api.load([path])) if f.rule == "TC201")
    assert fixed == apply_edits(text, list(finding.fix.edits))
    assert "with torch.autocast(device_type=device, dtype=torch.float16" in fixed
    assert "scaler.scale(loss).backward()" in fixed
    compile(fixed, "train.py", "exec")
    after = _change(client, path, fixed, version=11)
    assert "TC201" not in {d["code"] for d in after["diagnostics"]}


def test_suppress_on_this_line_silences_the_finding(client, project):
    path = project / "train.py"
    text = path.read_text()
    published = _open(client, path, text, version=20)
    tc201 = next(d for d in published["diagnostics"] if d["code"] == "TC201")
    action = next(a for a in _actions(client, path, tc201) if a["title"] == "Suppress TC201 on this line")
    suppressed = apply_text_edits(text, _edits(action))
    line = suppressed.splitlines()[tc201["range"]["start"]["line"]]
    assert line.endswith("  # noqa: TC201")
    after = _change(client, path, suppressed, version=21)
    codes = {d["code"] for d in after["diagnostics"]}
    assert "TC201" not in codes and "TC001" not in codes


def test_fix_all_safe_is_tcaudit_fix_with_the_safe_class(client, project):
    path = project / "train.py"
    text = path.read_text()
    published = _open(client, path, text, version=30)
    first = published["diagnostics"][0]
    actions = _actions(client, path, first, only=["source.fixAll"])
    assert [a["kind"] for a in actions] == [convert.FIX_ALL_KIND]
    fixed = apply_text_edits(text, _edits(actions[0]))
    assert fixed == api.fix(text, filename="train.py", settings=api.load([path]), classes="safe").text
    assert fixed != text


def test_positions_count_utf16_units(client, project):
    """The client counts UTF-16 code units; tcaudit counts code points: an emoji before the end of
    a line moves the suppression comment one unit further for the client."""
    path = project / "emoji.py"
    text = FIXTURE.read_text().replace("output = model(images)", 'output = model(images); tag = "🙂日本"')
    published = _open(client, path, text, version=40)
    tc201 = next(d for d in published["diagnostics"] if d["code"] == "TC201")
    actions = _actions(client, path, tc201)
    suppress = next(a for a in actions if a["title"].startswith("Suppress"))
    edit = _edits(suppress)[0]
    line = text.splitlines()[edit["range"]["start"]["line"]]
    assert edit["range"]["start"]["character"] == len(line.encode("utf-16-le")) // 2 != len(line)
    assert apply_text_edits(text, [edit]).splitlines()[edit["range"]["start"]["line"]] == line + "  # noqa: TC201"


def test_the_newest_text_wins_and_a_broken_one_is_tc000(client, project):
    path = project / "typing.py"
    base = FIXTURE.read_text()
    _open(client, path, base, version=1)
    for version in range(2, 7):  # keystrokes faster than scans: only the newest is published for sure
        _change(client, path, base + f"\nx{version} = 1\n", version=version, wait=False)
    broken = base + "\ndef broken(:\n"
    published = _change(client, path, broken, version=7)
    assert published["diagnostics"][0]["code"] == "TC000"
    assert published["diagnostics"][0]["severity"] == 1
    healed = _change(client, path, base, version=8)
    assert "TC201" in {d["code"] for d in healed["diagnostics"]}
    assert not any(d["code"] == "TC000" or d.get("data", {}).get("stale") for d in healed["diagnostics"])


def test_a_broken_line_keeps_the_last_good_diagnostics_of_the_others_where_they_are_now(client, project):
    """Issue 50: while a line does not parse, the TC000 says which line and what there, and the other
    places keep the diagnostics of the last text that parsed (``data.stale``), moved with their lines."""
    path = project / "broken_middle.py"
    base = FIXTURE.read_text()
    good = _open(client, path, base, version=1)["diagnostics"]
    lines = base.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("def "))  # before the first def
    broken = "".join(lines[:at] + ["def broken(:\n"] + lines[at:])
    published = _change(client, path, broken, version=2)["diagnostics"]
    error, rest = published[0], published[1:]
    assert error["code"] == "TC000" and error["range"]["start"]["line"] == at
    assert f"line {at + 1}" in error["message"] and "`def broken(:`" in error["message"]
    assert "last text that parsed" in error["message"]
    assert all(d["data"]["stale"] for d in rest)

    def moved(d: dict) -> tuple:
        shift = 1 if d["range"]["start"]["line"] >= at else 0
        return (d["code"], d["range"]["start"]["line"] + shift, d["range"]["start"]["character"],
                d["range"]["end"]["line"] + shift, d["message"])

    assert sorted(moved(d) for d in good) == sorted(
        (d["code"], d["range"]["start"]["line"], d["range"]["start"]["character"], d["range"]["end"]["line"],
         d["message"]) for d in rest)
    healed = _change(client, path, base, version=3)["diagnostics"]
    assert sorted(d["code"] for d in healed) == sorted(d["code"] for d in good)


def test_closing_clears_the_diagnostics(client, project):
    path = project / "closing.py"
    _open(client, path, FIXTURE.read_text(), version=1)
    client.notify("textDocument/didClose", {"textDocument": {"uri": path.as_uri()}})
    cleared = client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == path.as_uri())
    assert cleared["diagnostics"] == []


def test_settings_come_from_the_config_and_the_client(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nexec-models = false\nignore = ["TC201"]\n')
    path = tmp_path / "train.py"
    text = FIXTURE.read_text()
    client = LspClient(tmp_path, env=ENV)
    try:
        client.initialize(tmp_path, {"settings": {"extend_ignore": ["TC3"]}})
        codes = {d["code"] for d in _open(client, path, text)["diagnostics"]}
        assert "TC201" not in codes and not any(code.startswith("TC3") for code in codes)
        assert "TC403" in codes
        # A saved config file is read again.
        (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nexec-models = false\n')
        client.notify("textDocument/didSave", {"textDocument": {"uri": (tmp_path / "pyproject.toml").as_uri()}})
        again = client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == path.as_uri())
        assert "TC201" in {d["code"] for d in again["diagnostics"]}
    finally:
        assert client.close() == 0


TINY_MODEL = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(1024, 1001)  # a hidden width off the alignment (the head's 10 is the task's)
            self.fc2 = nn.Linear(1001, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))


    def main():
        device = "cuda"
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(64, 1024, device=device)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = model(x).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
''')


@pytest.mark.slow
def test_the_model_audit_runs_on_save_and_its_findings_stay_while_typing(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "train.py"
    path.write_text(TINY_MODEL)
    client = LspClient(tmp_path, env=ENV)
    try:
        client.initialize(tmp_path, {"settings": {"gpu": "sm_90"}})
        opened = _open(client, path, TINY_MODEL)
        assert not any(d["code"].startswith("TC1") for d in opened["diagnostics"])  # no audit before a save
        client.notify("textDocument/didSave", {"textDocument": {"uri": path.as_uri()}})
        audited = client.wait_for("textDocument/publishDiagnostics",
                                  lambda p: any(d["code"] == "TC101" for d in p["diagnostics"]), timeout=300)
        tc101 = [d for d in audited["diagnostics"] if d["code"] == "TC101"]
        assert tc101 and "1001" in tc101[0]["message"]
        typed = _change(client, path, TINY_MODEL + "\n# a comment typed after the save\n", version=2)
        assert "TC101" in {d["code"] for d in typed["diagnostics"]}
    finally:
        assert client.close() == 0


# -- the conversions, without a server ----------------------------------------------------------------
@pytest.mark.parametrize("line, text, expected", [
    ("x = 1", "x = 1\n", "x = 1  # noqa: TC201"),
    ("x = 1  # noqa: E501", "x = 1  # noqa: E501\n", "x = 1  # noqa: E501, TC201"),
    ("x = 1  # why", "x = 1  # why\n", "x = 1  # why  # noqa: TC201"),
    ("x = f(  # noqa: TC303", "x = f(  # noqa: TC303\n  1)\n", "x = f(  # noqa: TC303, TC201"),
])
def test_suppression_edit(line, text, expected):
    edit = convert.suppression_edit(text, 1, "TC201")
    assert apply_edits(text, [edit]).splitlines()[0] == expected


def test_suppression_edit_declines_inside_a_string_and_a_broken_text():
    assert convert.suppression_edit('x = """a\nb"""\n', 1, "TC201") is None
    assert convert.suppression_edit("x = (\n", 1, "TC201") is None


def test_a_suppression_comment_after_another_comment_suppresses(tmp_path):
    code = FIXTURE.read_text()
    line = next(f.location.line for f in api.scan(text=code, filename="t.py", isolated=True, exec_models=False)
                if f.rule == "TC201")
    lines = code.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].rstrip("\n") + "  # forward  # noqa: TC201\n"
    after = api.scan(text="".join(lines), filename="t.py", isolated=True, exec_models=False)
    assert "TC201" not in {f.rule for f in after} and "TC001" not in {f.rule for f in after}


# -- a real client: Neovim ---------------------------------------------------------------------------
NVIM_DRIVER = textwrap.dedent('''\
    local out = {}
    local function finish(status)
      out.status = status
      local f = io.open(vim.env.TCAUDIT_NVIM_RESULT, "w")
      f:write(vim.fn.json_encode(out))
      f:close()
      vim.cmd("qa!")
    end
    vim.bo.filetype = "python"
    local bufnr = vim.api.nvim_get_current_buf()
    local client_id = vim.lsp.start_client({
      name = "tcaudit",
      cmd = {vim.env.TCAUDIT_PYTHON, "-m", "tcaudit", "server"},
      root_dir = vim.fn.getcwd(),
      cmd_env = {PYTHONPATH = vim.env.TCAUDIT_REPO},
    })
    vim.lsp.buf_attach_client(bufnr, client_id)
    local function code_of(d)
      return d.code or (d.user_data and d.user_data.lsp and d.user_data.lsp.code)
    end
    local found = vim.wait(120000, function()
      for _, d in ipairs(vim.diagnostic.get(bufnr)) do
        if code_of(d) == "TC201" then return true end
      end
      return false
    end, 100)
    if not found then return finish("no TC201 diagnostic") end
    out.codes = {}
    local target
    for _, d in ipairs(vim.diagnostic.get(bufnr)) do
      table.insert(out.codes, code_of(d))
      if code_of(d) == "TC201" then target = d end
    end
    local range = {start = {line = target.lnum, character = target.col},
                   ["end"] = {line = target.end_lnum, character = target.end_col}}
    -- The diagnostic as the protocol has it (Neovim 0.7 keeps only some of its fields in user_data).
    local lsp_diag = {range = range, message = target.message, code = "TC201", source = "tcaudit",
                      severity = target.severity}
    local params = {
      textDocument = vim.lsp.util.make_text_document_params(bufnr),
      range = range,
      context = {diagnostics = {lsp_diag}, only = {"quickfix"}},
    }
    local responses = vim.lsp.buf_request_sync(bufnr, "textDocument/codeAction", params, 120000)
    local action
    out.errors = {}
    for _, response in pairs(responses or {}) do
      if response.err or response.error then table.insert(out.errors, vim.inspect(response.err or response.error)) end
      for _, a in ipairs(response.result or {}) do
        if not action and a.title:find("^Apply numerics fix") then action = a end
      end
    end
    if not action then return finish("no quick fix") end
    out.title = action.title
    local client = vim.lsp.get_client_by_id(client_id)
    vim.lsp.util.apply_workspace_edit(action.edit, client.offset_encoding)
    vim.cmd("write")
    finish("ok")
''')


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvim") is None, reason="nvim is not installed (Debian's neovim package; .ci/run installs it)")
def test_neovim_applies_the_quick_fix_in_a_real_buffer(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nexec-models = false\n')
    path = tmp_path / "train.py"
    shutil.copy(FIXTURE, path)
    original = path.read_text()
    driver = tmp_path / "drive.lua"
    driver.write_text(NVIM_DRIVER)
    result = tmp_path / "result.json"
    env = {**os.environ, "TCAUDIT_NVIM_RESULT": str(result), "TCAUDIT_PYTHON": sys.executable,
           "TCAUDIT_REPO": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_DATA_HOME": str(tmp_path / "data")}
    run = subprocess.run(["nvim", "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {driver}", "train.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.exists(), f"nvim wrote no result (exit {run.returncode}): {run.stderr[-2000:]}"
    out = json.loads(result.read_text())
    assert out["status"] == "ok", out
    assert "TC201" in out["codes"]
    assert out["title"].startswith("Apply numerics fix: ")
    written = path.read_text()
    finding = next(f for f in api.scan(text=original, filename="train.py", settings=api.load([path])) if f.rule == "TC201")
    assert written == apply_edits(original, list(finding.fix.edits))
    assert "with torch.autocast(" in written


def test_a_huge_document_does_not_hold_up_the_answers_about_another(tmp_path):
    """Issue 50: each document has its own scans, so while a huge buffer is analysed, a small one still
    gets its diagnostics and its quick fixes (before: one scan thread served all, in order)."""
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n")
    small, huge = tmp_path / "small.py", tmp_path / "huge.py"
    step = textwrap.dedent('''
        def train_step_{i}(model, batch, optimizer, scaler):
            images, labels = batch
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = F.cross_entropy(model(images.cuda()), labels.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss.item()
        ''')
    huge_text = "import torch\nimport torch.nn.functional as F\n" + "".join(step.format(i=i) for i in range(1500))
    client = LspClient(tmp_path, env=ENV)
    try:
        client.initialize(tmp_path)
        text = FIXTURE.read_text()
        _open(client, small, text, version=1)  # the rules are imported
        client.notify("textDocument/didOpen", {"textDocument": {
            "uri": huge.as_uri(), "languageId": "python", "version": 1, "text": huge_text}})
        published = _change(client, small, text + "# typed\n", version=2)
        tc201 = next(d for d in published["diagnostics"] if d["code"] == "TC201")
        actions = _actions(client, small, tc201, only=["quickfix"])
        assert any(a["title"].startswith("Apply") for a in actions)
        early = [m for m in client.notifications if m.get("method") == "textDocument/publishDiagnostics"
                 and m["params"]["uri"] == huge.as_uri()]
        assert early == [], "the huge document's scan ended first: the small one's answers waited for it"
        late = client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == huge.as_uri(), timeout=300)
        assert len([d for d in late["diagnostics"] if d["code"] == "TC202"]) == 1500
    finally:
        client.close()


def _cell_uri(notebook: Path, index: int) -> str:
    """A cell document URI as VS Code makes them (``vscode-notebook-cell:`` + the notebook path + a fragment)."""
    return f"vscode-notebook-cell:{notebook.as_posix()}#W{index}sZmlsZQ%3D%3D"


def test_a_notebook_gets_diagnostics_per_cell_and_its_quick_fixes_edit_the_cells(tmp_path):
    """Issue 50: notebook document sync. The client opens a notebook of three code cells and a markdown
    cell (``notebookDocument/didOpen`` with the cells' text documents); each code cell gets the findings
    ``tcaudit scan`` reports for the same .ipynb file, in the cell's own lines; the TC201 quick fix is
    an edit of the cell it lies in, the one the JSON report of that file carries; the fixed cell, sent
    back with ``notebookDocument/didChange``, has no TC201 left."""
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n")
    lines = FIXTURE.read_text().splitlines(keepends=True)
    cut = [0, next(i for i, line in enumerate(lines) if line.startswith("def ")),
           next(i for i, line in enumerate(lines) if line.startswith("def main")), len(lines)]
    code = ["".join(lines[a:b]) for a, b in zip(cut, cut[1:])]
    cells = [(False, "# ResNet50\nTraining in a notebook."), (True, code[0]), (True, code[1]), (True, code[2])]
    path = tmp_path / "train.ipynb"
    path.write_text(convert.notebook_json(cells))
    expected = api.scan(path, settings=api.load([path]), edits=True)
    uris = [_cell_uri(path, i) for i in range(len(cells))]
    client = LspClient(tmp_path, env=ENV)
    try:
        client.initialize(tmp_path)
        client.notify("notebookDocument/didOpen", {
            "notebookDocument": {"uri": path.as_uri(), "notebookType": "jupyter-notebook", "version": 1,
                                 "cells": [{"kind": 2 if is_code else 1, "document": uri}
                                           for (is_code, _), uri in zip(cells, uris)]},
            "cellTextDocuments": [{"uri": uri, "languageId": "python" if is_code else "markdown", "version": 1,
                                   "text": text} for (is_code, text), uri in zip(cells, uris)]})
        wanted = sorted({f.location.cell for f in expected})
        assert wanted and 1 not in wanted
        published = {}
        for _ in wanted:
            got = client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] in uris)
            published[uris.index(got["uri"]) + 1] = got["diagnostics"]
        assert sorted(published) == wanted
        assert sorted((cell, d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1,
                       d["message"]) for cell, ds in published.items() for d in ds) == sorted(
            (f.location.cell, f.rule, f.location.line, f.location.column, f.message) for f in expected)

        tc201 = next(f for f in expected if f.rule == "TC201")
        diagnostic = next(d for d in published[tc201.location.cell] if d["code"] == "TC201")
        actions = client.request("textDocument/codeAction", {
            "textDocument": {"uri": uris[tc201.location.cell - 1]}, "range": diagnostic["range"],
            "context": {"diagnostics": [diagnostic], "only": ["quickfix"]}})
        assert actions[0]["title"].endswith("(TC201)")
        assert "Suppress TC201 on this line" in [a["title"] for a in actions]
        changes = actions[0]["edit"]["documentChanges"]
        texts = {uri: text for (_, text), uri in zip(cells, uris)}
        fixed = dict(texts)
        for change in changes:
            uri = change["textDocument"]["uri"]
            fixed[uri] = apply_text_edits(texts[uri], change["edits"])
        # The same cells as the JSON report's edits of that finding (each edit names its cell) make.
        by_cell: dict[int, list] = {}
        for edit in tc201.fix.edits:
            by_cell.setdefault(edit.cell, []).append(edit)
        assert {uris.index(c["textDocument"]["uri"]) + 1 for c in changes} == set(by_cell)
        for cell, edits in by_cell.items():
            assert fixed[uris[cell - 1]] == apply_edits(texts[uris[cell - 1]], edits)
        assert "torch.autocast(" in fixed[uris[tc201.location.cell - 1]]
        compile("".join(fixed[uri] for (is_code, _), uri in zip(cells, uris) if is_code), "nb", "exec")

        client.notify("notebookDocument/didChange", {
            "notebookDocument": {"uri": path.as_uri(), "version": 2},
            "change": {"cells": {"textContent": [
                {"document": {"uri": uri, "version": 2}, "changes": [{"text": fixed[uri]}]}
                for uri in sorted({c["textDocument"]["uri"] for c in changes})]}}})
        after = client.wait_for("textDocument/publishDiagnostics",
                                lambda p: p["uri"] == uris[tc201.location.cell - 1] and p.get("version") == 2)
        assert "TC201" not in {d["code"] for d in after["diagnostics"]}
    finally:
        client.close()


def test_replayed_random_edits_publish_what_a_full_scan_reports_after_every_edit(client, project):
    """Random edits of a real-world-shaped script (lines inserted, deleted, duplicated, broken), each
    sent as the whole new text and waited for: every published version equals ``api.scan`` of that
    text; while a text does not parse, its TC000 leads and every other diagnostic is a stale one of
    the last text that parsed, on a line of the new text that reads as it did there."""
    import random

    rng = random.Random(50)
    path = project / "replay.py"
    text = FIXTURE.read_text()
    settings = api.load([path])
    _open(client, path, text, version=1)
    good_lines = text.splitlines()
    for version in range(2, 26):
        lines = text.splitlines(keepends=True)
        at = rng.randrange(len(lines))
        kind = rng.choice(["insert", "delete", "duplicate", "break", "heal"])
        if kind == "insert":
            lines.insert(at, lines[at][: len(lines[at]) - len(lines[at].lstrip())] + f"step_{version} = {version}\n")
        elif kind == "delete" and lines[at].strip().startswith(("print", "#", "x", "step_")):
            del lines[at]
        elif kind == "duplicate" and lines[at].strip().startswith(("print(", "loss.backward", "optimizer.")):
            lines.insert(at, lines[at])
        elif kind == "break":
            lines.insert(at, "def broken(:\n")
        else:
            lines = [line for line in lines if line != "def broken(:\n"]
        text = "".join(lines)
        published = _change(client, path, text, version=version)["diagnostics"]
        expected = api.scan(text=text, filename="replay.py", settings=settings, edits=False)
        if not any(f.rule == "TC000" for f in expected):
            assert [(d["code"], d["range"]["start"]["line"] + 1, d["message"]) for d in published] == [
                (f.rule, f.location.line, f.message) for f in expected], (version, kind)
            good_lines = text.splitlines()
            continue
        assert published[0]["code"] == "TC000" and not published[0].get("data", {}).get("stale")
        now = text.splitlines()
        for d in published[1:]:
            assert d["data"]["stale"]
            assert now[d["range"]["start"]["line"]] in good_lines


def test_fix_all_safe_is_listed_at_once_and_made_when_the_client_resolves_it(tmp_path):
    """Issue 50: a client that resolves edits (Neovim, VS Code) gets "Fix all safe" in the list without
    its edit (listing the actions makes no ``tcaudit fix`` of the whole text), and the edit on
    ``codeAction/resolve``: exactly ``tcaudit fix --classes safe``."""
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n")
    path = tmp_path / "train.py"
    text = FIXTURE.read_text()
    client = LspClient(tmp_path, env=ENV)
    try:
        client.initialize(tmp_path, resolves_edits=True)
        first = _open(client, path, text)["diagnostics"][0]
        actions = _actions(client, path, first)
        listed = [a for a in actions if a["kind"] == convert.FIX_ALL_KIND]
        assert len(listed) == 1 and "edit" not in listed[0]
        resolved = client.request("codeAction/resolve", listed[0])
        fixed = apply_text_edits(text, _edits(resolved))
        assert fixed == api.fix(text, filename="train.py", settings=api.load([path]), classes="safe").text != text
    finally:
        client.close()


def test_the_cycle_collector_waits_for_a_pause_in_the_typing():
    """IdleCollector: no collection while a document is analysed, none from a timer that a later analysis
    overtook, a full one once the typing pauses, and one of the young generations after ``most`` analyses
    with no pause."""
    import asyncio
    import gc

    from tcaudit.lsp.server import IdleCollector

    collections: list[int] = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    async def typing() -> None:
        collector = IdleCollector(idle_s=0.05, most=5)
        with collector.paused():
            assert not gc.isenabled()
        with collector.paused():  # a second keystroke before the first's timer: that timer does nothing
            pass
        assert not gc.isenabled() and not collections
        await asyncio.sleep(0.2)  # the pause in the typing
        assert 2 in collections
        mark = len(collections)
        for _ in range(5):  # five analyses back to back: the fifth collects the young generations
            with collector.paused():
                assert not gc.isenabled()
        assert 1 in collections[mark:]

    was = gc.isenabled()
    gc.callbacks.append(count)
    try:
        asyncio.run(typing())
    finally:
        gc.callbacks.remove(count)
        if was:
            gc.enable()
        else:
            gc.disable()
