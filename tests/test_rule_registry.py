"""The engine knows each rule's triggers without importing it (tcaudit/rules/registry.py): the table
it reads must say exactly what the rule modules declare, and a scan must import a rule module (and
LibCST, and a rule's catalog file) only where a file needs it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO
from tcaudit.catalog import load_catalog, rules_dir
from tcaudit.config import STRUCTURAL_OPTIONS, Settings
from tcaudit.engine import instantiate_rules
from tcaudit.rules import registry
from tcaudit.rules.base import ScriptRule
from tcaudit.rules.registry import LazyRule, lazy_rules, triggers_under


def test_trigger_table_is_what_the_rule_modules_declare():
    assert registry.TABLE_PATH.read_text(encoding="utf-8") == registry.render_table(), (
        "tcaudit/rules/trigger_table.py is out of date: run python -m tcaudit.rules.registry --write"
    )


@pytest.mark.parametrize(
    "structural",
    [(), *((option,) for option in STRUCTURAL_OPTIONS), tuple(STRUCTURAL_OPTIONS)],
    ids=lambda options: "+".join(options) or "none",
)
def test_lazy_rules_have_the_triggers_of_the_configured_rules(structural):
    settings = Settings(structural_fixes=structural)
    made = {rule.id: rule.triggers for rule in instantiate_rules(settings)}
    lazy = {rule.id: rule.triggers for rule in lazy_rules(settings)}
    assert lazy == made


def test_tc310_needs_less_text_under_compile():
    # The one rule whose triggers depend on a structural option: checks that the option reaches it.
    plain = {rule.id: rule.triggers for rule in lazy_rules(Settings())}["TC310"]
    compiled = {rule.id: rule.triggers for rule in lazy_rules(Settings(structural_fixes=("compile",)))}["TC310"]
    assert plain != compiled == (r"def forward",)


def test_several_structural_options_or_their_triggers():
    by_option = {"ddp": ("a",), "compile": ("b",)}
    assert triggers_under(("x",), by_option, ()) == ("x",)
    assert triggers_under(("x",), by_option, ("dali",)) == ("x",)
    assert triggers_under(("x",), by_option, ("ddp", "compile")) == ("b", "a")


def test_a_rule_with_its_own_match_code_is_loaded_up_front(monkeypatch):
    class OwnMatch(ScriptRule):
        id = "TC201"

        def may_match(self, text: str) -> bool:
            return "yes" in text

    table = registry.build_table()
    assert all(triggers is not None for _module, triggers, _, _ in table.values())
    monkeypatch.setattr(
        "tcaudit.rules.registry.discover_script_rules", lambda: {"TC201": OwnMatch}
    )
    assert registry.build_table()["TC201"][1] is None
    monkeypatch.setitem(registry.TRIGGER_TABLE, "TC201", (OwnMatch.__module__, None, {}, ()))
    monkeypatch.setattr(LazyRule, "load", lambda self: OwnMatch())
    from tcaudit.engine import candidate_rules

    rules = [rule for rule in lazy_rules(Settings()) if rule.id == "TC201"]
    assert [type(r) for r in candidate_rules(rules, "yes")] == [OwnMatch]
    assert candidate_rules(rules, "x.backward()") == []


def test_catalog_reads_a_rule_file_when_asked_for_it():
    catalog = load_catalog()
    assert sorted(catalog) == sorted(path.stem for path in rules_dir().glob("TC*.toml"))
    assert "TC201" in catalog and "TC999" not in catalog
    assert catalog["TC201"] is catalog["TC201"]
    with pytest.raises(KeyError):
        catalog["TC999"]


PROBE = textwrap.dedent(
    """
    import json, sys
    import tcaudit.catalog as catalog

    read = []
    load = catalog.load_rule_file
    catalog.load_rule_file = lambda path: read.append(path.stem) or load(path)
    from tcaudit.cli.main import main

    code = main(sys.argv[1:])
    import re
    modules = sorted(m for m in sys.modules if m == "libcst" or re.match("tcaudit[.]rules[.][a-z]+[.]tc[0-9]", m))
    print(json.dumps({"code": code, "modules": modules, "read": sorted(read)}), file=sys.stderr)
    """
)


def _scan(tmp_path: Path, text: str, *args: str) -> dict:
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "scan", str(script), "--no-cache", "--no-exec", "--isolated", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    return json.loads(proc.stderr.strip().splitlines()[-1])


def test_scan_without_candidates_imports_no_rule_and_reads_no_rule_file(tmp_path):
    report = _scan(tmp_path, "x = 1\n")
    assert report == {"code": 0, "modules": [], "read": []}


def test_scan_imports_only_the_rules_a_file_triggers(tmp_path):
    # Only TC202's trigger ("amp") occurs in this text: only its module is imported, and only its
    # catalog file read for the finding.
    report = _scan(tmp_path, "import torch\nwith torch.cuda.amp.autocast():\n    pass\n", "--format", "json")
    assert report["code"] == 1
    assert report["modules"] == ["libcst", "tcaudit.rules.amp.tc202_deprecated_amp_api"]
    assert report["read"] == ["TC202"]
