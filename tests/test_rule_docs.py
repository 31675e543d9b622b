"""docs/rules/: the published rule pages match rules/ (each is ``tcaudit explain``'s text), and the
generator writes, refreshes and prunes them."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO
from tcaudit.catalog import load_catalog
from tcaudit.explain import render_explanation
from tcaudit.rule_docs import REGENERATE, out_of_date, write_pages


def test_docs_rules_is_up_to_date():
    problems = out_of_date(REPO / "docs" / "rules")
    assert not problems, f"docs/rules is out of date ({', '.join(problems)}); regenerate it with: {REGENERATE}"


def test_every_rule_has_its_explain_page():
    for rule_id, spec in load_catalog().items():
        assert (REPO / "docs" / "rules" / f"{rule_id}.md").read_text(encoding="utf-8") == render_explanation(spec)


def test_write_refreshes_and_prunes(tmp_path):
    folder = tmp_path / "rules"
    assert "TC202.md (missing)" in out_of_date(folder)
    write_pages(folder)
    assert out_of_date(folder) == []
    (folder / "TC202.md").write_text("stale\n", encoding="utf-8")
    (folder / "TC999.md").write_text("a rule that was removed\n", encoding="utf-8")
    assert out_of_date(folder) == ["TC202.md (differs from rules/)", "TC999.md (no such rule)"]
    assert write_pages(folder) == ["TC202.md", "TC999.md"]
    assert out_of_date(folder) == [] and not (folder / "TC999.md").exists()
    assert write_pages(folder) == []  # re-running changes nothing


def test_check_command_names_the_fix(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tcaudit.rule_docs", "--check", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "TC202.md (missing)" in proc.stderr
    assert f"run: {REGENERATE}" in proc.stderr
