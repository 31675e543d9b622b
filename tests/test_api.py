"""tcaudit.api: the documented Python API gives what the command line gives."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tcaudit import api
from conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "resnet50" / "train.py"


@pytest.fixture
def project(tmp_path):
    shutil.copy(FIXTURE, tmp_path / "train.py")
    return tmp_path


def _cli_findings(*args: str) -> list[dict]:
    code, out, err = run_cli("scan", "--no-exec", "--no-cache", "--format", "json", *args)
    assert code in (0, 1), err
    return json.loads(out)["findings"]


def test_scan_of_a_path_is_the_command_line_scan(project):
    found = api.scan(project / "train.py", exec_models=False, isolated=True)
    cli = _cli_findings("--isolated", str(project / "train.py"))
    assert [f.to_dict() for f in found] == cli
    assert isinstance(found, list) and found.errors == [] and found.result.files_scanned == 1


def test_scan_of_a_text_is_the_scan_of_the_file(project):
    text = (project / "train.py").read_text()
    from_text = api.scan(text, filename=str(project / "train.py"), exec_models=False, isolated=True)
    from_file = api.scan(project / "train.py", exec_models=False, isolated=True)
    assert [f.to_dict() for f in from_text] == [f.to_dict() for f in from_file]
    as_bytes = api.scan(text.encode(), filename=str(project / "train.py"), exec_models=False, isolated=True)
    assert [f.to_dict() for f in as_bytes] == [f.to_dict() for f in from_file]


def test_settings_keywords_layer_over_the_config_as_flags_do(project):
    (project / "pyproject.toml").write_text('[tool.tcaudit]\nignore = ["TC201"]\nexec-models = false\n')
    path = project / "train.py"
    assert "TC201" not in {f.rule for f in api.scan(path)}
    assert {f.rule for f in api.scan(path, select=["TC201"])} == {"TC201"}  # --select wins over the config's ignore
    assert "TC201" in {f.rule for f in api.scan(path, isolated=True, exec_models=False)}
    assert {f.rule for f in api.scan(path, select="TC4", extend_ignore=["TC403"])} == {"TC401", "TC402", "TC404", "TC405", "TC411"}


def test_per_file_ignores_and_suppressions_apply_to_texts(project):
    (project / "pyproject.toml").write_text('[tool.tcaudit]\nexec-models = false\n[tool.tcaudit.per-file-ignores]\n"nb_*.py" = ["TC4"]\n')
    text = (project / "train.py").read_text()
    assert not any(f.rule.startswith("TC4") for f in api.scan(text, filename=str(project / "nb_1.py")))
    line = next(f.location.line for f in api.scan(text, filename=str(project / "x.py")) if f.rule == "TC201")
    lines = text.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].rstrip("\n") + "  # noqa: TC201, TC999\n"
    found = api.scan("".join(lines), filename=str(project / "x.py"))
    assert "TC201" not in {f.rule for f in found}
    assert [f.rule for f in found if f.rule == "TC001"] == ["TC001"]  # TC999 names no rule


def test_edits_are_there_by_default_and_match_the_json_output(project):
    path = project / "train.py"
    found = api.scan(path, exec_models=False, isolated=True)
    assert any(f.fix is not None and f.fix.edits for f in found)
    cli = {(d["rule"], d["line"]): d["fix"].get("edits") for d in _cli_findings("--isolated", str(path)) if d["fix"]}
    for f in found:
        if f.fix is not None and f.fix.edits:
            assert [e.to_dict() for e in f.fix.edits] == cli[(f.rule, f.location.line)]
    plain = api.scan(path, exec_models=False, isolated=True, edits=False)
    assert all(f.fix is None or f.fix.edits is None for f in plain)


def test_a_text_that_does_not_parse_is_one_tc000():
    found = api.scan("def f(:\n    pass\n", isolated=True)
    assert [f.rule for f in found] == ["TC000"]
    assert found[0].location.path == api.TEXT_NAME


def test_bad_requests_raise_tcaudit_error(project):
    with pytest.raises(api.TcauditError, match="no such file or directory: .*missing.py"):
        api.scan(project / "missing.py")
    with pytest.raises(api.TcauditError, match="no such file"):
        api.scan("trian.py")  # a one-line str is a path: a typo is an error, not a clean "script"
    with pytest.raises(api.TcauditError, match="unknown setting 'selct'"):
        api.scan(project / "train.py", selct=["TC2"])
    with pytest.raises(api.TcauditError, match="unknown rule or prefix"):
        api.scan(project / "train.py", select=["TC9"])
    with pytest.raises(api.TcauditError, match="either settings="):
        api.scan(project / "train.py", settings=api.load(), select=["TC2"])
    with pytest.raises(api.TcauditError, match="safe, numerics"):
        api.fix("x = 1\n", classes="fast")
    (project / "pyproject.toml").write_text("[tool.tcaudit\n")
    with pytest.raises(api.TcauditError, match="invalid TOML"):
        api.scan(project / "train.py")


def test_fix_of_a_text_is_tcaudit_fix(project):
    path = project / "train.py"
    text = path.read_text()
    result = api.fix(text, filename=str(path), isolated=True)
    code, diff, _ = run_cli("fix", "--no-exec", "--no-cache", "--isolated", str(path))
    assert code == 1 and result.changed
    assert result.diff() == diff
    assert "TC201" in result.applied and result.data == result.text.encode()
    assert path.read_text() == text  # fix() never writes
    assert all(isinstance(d.reason, str) and d.reason and d.where.isdigit() for d in result.declined)
    compile(result.text, str(path), "exec")
    safe = api.fix(text, filename=str(path), isolated=True, classes=["safe"])
    assert "TC201" not in safe.applied and safe.text != result.text


def test_fix_keeps_the_encoding_and_reports_what_it_cannot_fix():
    latin = "# -*- coding: latin-1 -*-\n# café\n" + FIXTURE.read_text()
    result = api.fix(latin.encode("latin-1"), filename="t.py", isolated=True)
    assert result.changed and result.data.decode("latin-1") == result.text
    text = FIXTURE.read_text() + "\ndef f(:\n"
    broken = api.fix(text, filename="t.py", isolated=True)
    assert broken.error and broken.error.startswith("not fixed: cannot parse") and broken.text == text
    assert not broken.changed and broken.diff() == ""
    clean = api.fix("x = 1\n", isolated=True)
    assert clean.error is None and not clean.changed and clean.applied == []


def test_opt_in_fixes_come_from_settings(tmp_path):
    code = textwrap.dedent('''\
        import torch
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(1024, 1024)

            def forward(self, x):
                return torch.relu(self.fc(x))


        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(64, 1024, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''')
    plain = api.fix(code, isolated=True)
    compiled = api.fix(code, isolated=True, structural_fixes=["compile"])
    assert "TC305" not in plain.applied and "compile(" not in plain.text
    assert "TC305" in compiled.applied and "compile(" in compiled.text


def test_the_cli_and_the_server_go_through_the_api():
    """The command line's stdin paths and the server call tcaudit.api (one road for embedders)."""
    for module in ("tcaudit/cli/main.py", "tcaudit/cli/fix.py", "tcaudit/lsp/server.py"):
        source = (REPO / module).read_text()
        assert "api.scan(" in source or "api.fix(" in source, module


def test_the_readme_documents_every_public_name():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    for name in ("api.scan", "api.fix", "api.load", "Findings", "FixResult", "TcauditError", "stab"):
        assert name.lower() in section.lower(), name
