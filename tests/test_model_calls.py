"""The model audit calls only what builds models (issue 46): no overridden nn.Module method of the
user's model is called, and no error about one model ends the scan with exit 2.

One scan of the fixtures runs for the whole module (it builds models in the sandbox).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli
from tcaudit.config import Settings
from tcaudit.engine import report
from tcaudit.model import ModelAuditResult, discover_file
from tcaudit.model.facts import ModelFacts
from tcaudit.rules.registry import discover_model_rules
from tcaudit.source.parsing import read_source

MODELS = FIXTURES / "models"
FORWARD_FORWARD = "forward_forward.py"
OVERRIDES = "overridden_methods.py"
SCANNED = (FORWARD_FORWARD, OVERRIDES)


def labels_in(path: Path) -> list[tuple[str, str | None]]:
    """(label, failure) of each model discovery finds in a file (no torch needed)."""
    return [(target["label"], failure) for target, failure, _ in discover_file(read_source(path, path.name))]


# -- discovery (no torch) ------------------------------------------------------------------------------


def test_the_forward_forward_model_is_found():
    assert labels_in(MODELS / FORWARD_FORWARD) == [("Net([784, 500, 500])", None)]


# -- the scan (builds in the sandbox) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("calls")
    for name in SCANNED:
        shutil.copy(MODELS / name, folder / name)
    code, out, err = run_cli("scan", *SCANNED, "--select", "TC1", "--isolated", "--no-cache", "--format", "json",
                             cwd=folder)
    return code, json.loads(out), err, folder


def findings_in(scanned, name: str) -> list[dict]:
    return [f for f in scanned[1]["findings"] if f["path"] == name]


def test_the_scan_never_ends_in_an_internal_error(scanned):
    code, _, err, _ = scanned
    assert code in (0, 1), err
    assert "internal error" not in err








def test_the_forward_forward_model_is_read_from_its_parameters(scanned):
    """Net has no forward: the audit says so in one TC100 and checks its layers' parameters; neither
    Net.train nor Layer.train ran (each raises)."""
    found = findings_in(scanned, FORWARD_FORWARD)
    [tc100] = [f for f in found if f["rule"] == "TC100"]
    assert tc100["message"].startswith("could not trace `Net([784, 500, 500])`")
    assert "train" not in tc100["message"] + tc100["explanation"]


def test_overridden_methods_are_never_called_and_the_casts_still_apply(scanned):
    """``Net().half()`` then ``model.to(torch.bfloat16)``: the slice casts with nn.Module.half and
    nn.Module.to, and the capture puts the model in training mode without calling its ``train``."""
    found = findings_in(scanned, OVERRIDES)
    assert sorted((f["rule"], f["details"]["module"]) for f in found) == [("TC101", "fc.0"), ("TC101", "fc.1")]
    assert all("bf16 GEMM" in f["message"] for f in found)


# -- errors about one model are TC100 findings, not scan errors ----------------------------------------


TARGET = {"kind": "script", "path": "/p/train.py", "label": "Net()", "source": "Net()",
          "construction": {"line": 3, "column": 9}}


def test_an_internal_error_while_auditing_a_model_is_a_tc100():
    rules = [cls() for rule_id, cls in discover_model_rules().items() if rule_id == "TC100"]
    result = ModelAuditResult()
    facts = ModelFacts.failed(TARGET, "internal error while auditing the model: TypeError('boom')\nTraceback ...",
                              "error")
    report([facts], rules, Settings(select=("TC1",)), [], result)
    assert result.errors == []
    [finding] = result.findings
    assert (finding.rule, finding.location.line) == ("TC100", 3)
    assert "internal error" in finding.message and "TypeError('boom')" in finding.message


def test_a_model_rule_that_raises_becomes_a_tc100_for_that_model():
    class Broken:
        id = "TC101"

        def check(self, facts, context):
            raise ValueError("rule bug")

    tc100 = [cls() for rule_id, cls in discover_model_rules().items() if rule_id == "TC100"]
    result = ModelAuditResult()
    facts = ModelFacts(target=TARGET, model_class="Net")
    report([facts], [Broken(), *tc100], Settings(select=("TC1",)), [], result)
    assert result.errors == []
    [finding] = result.findings
    assert (finding.rule, finding.location.line) == ("TC100", 3)
    assert "internal error in TC101" in finding.message and "rule bug" in finding.message + finding.explanation
