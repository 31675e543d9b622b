"""Usage errors are usage errors: a ``--model`` that cannot be imported or an ``--input`` that does
not parse ends the scan with exit 2 and one line, before anything is scanned or built."""

from __future__ import annotations

import pytest

from conftest import run_cli


@pytest.mark.parametrize(
    "args,says",
    [
        (("--model", "nope.mod:f"), "cannot find module 'nope.mod'"),
        (("--model", "json.nope_sub:f"), "cannot find module 'json.nope_sub'"),
        (("--model", "factories"), "pkg.mod:"),
        (("--model", "factories:"), "pkg.mod:"),
        (("--model", "factories:build", "--input", "8x3xabc"), "8x3x224x224"),
        (("--model", "factories:build", "--input", "8x0"), "8x3x224x224"),
    ],
)
def test_bad_model_or_input_is_a_usage_error(tmp_path, args, says):
    (tmp_path / "factories.py").write_text("def build():\n    raise SystemExit('never built')\n", encoding="utf-8")
    (tmp_path / "train.py").write_text("print('no model here')\n", encoding="utf-8")
    code, out, err = run_cli("scan", "train.py", "--isolated", "--no-cache", "--select", "TC1", *args, cwd=tmp_path)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tcaudit: error: ")
    assert says in (err.lower() if says == "pkg.mod:" else err)


def test_the_module_check_runs_no_user_code(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    (tmp_path / "train.py").write_text("print('no model here')\n", encoding="utf-8")
    code, _, err = run_cli("scan", "train.py", "--isolated", "--no-exec", "--model", "pkg.missing:f", cwd=tmp_path)
    assert code == 2 and "cannot find module 'pkg.missing'" in err
    assert not marker.exists()
