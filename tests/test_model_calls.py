"""The model audit calls only what builds models (issue 46): which models it builds comes from what the
optimizer trains, a function of the script is called only where the trained model is its return value
and its body neither trains, evaluates nor writes files, no overridden nn.Module method of the user's
model is called, and no error about one model ends the scan with exit 2.

One scan of the fixtures runs for the whole module (it builds models in the sandbox).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from conftest import FIXTURES, run_cli
from tcaudit.config import Settings
from tcaudit.engine import report
from tcaudit.model import ModelAuditResult, discover_file
from tcaudit.model.discovery import ScriptIndex, find_candidates
from tcaudit.model.facts import ModelFacts
from tcaudit.model.slicing import Slicer
from tcaudit.rules.registry import discover_model_rules
from tcaudit.source.parsing import read_source

MODELS = FIXTURES / "models"
NOTEBOOK = "notebook_train_fn.ipynb"
FORWARD_FORWARD = "forward_forward.py"
FACTORY_AND_FIT = "factory_and_fit.py"
OVERRIDES = "overridden_methods.py"
SCANNED = (NOTEBOOK, FORWARD_FORWARD, FACTORY_AND_FIT, OVERRIDES)


def labels_in(path: Path) -> list[tuple[str, str | None]]:
    """(label, failure) of each model discovery finds in a file (no torch needed)."""
    return [(target["label"], failure) for target, failure, _ in discover_file(read_source(path, path.name))]


def index_of(tmp_path: Path, code: str) -> ScriptIndex:
    path = tmp_path / "train.py"
    text = textwrap.dedent(code).lstrip("\n")
    path.write_text(text, encoding="utf-8")
    return ScriptIndex(cst.parse_module(text), text, path.resolve())


def kinds(index: ScriptIndex) -> list[tuple[str, str, str | None]]:
    return [(c.kind, c.label, c.refused) for c in find_candidates(index)]


# -- discovery (no torch) ------------------------------------------------------------------------------


def test_a_training_function_assigned_to_a_model_like_name_is_not_a_model():
    assert labels_in(MODELS / NOTEBOOK) == [("FashionMNISTModelV0(input_shape=784, hidden_units=10, out...", None)]


def test_the_factory_is_built_and_the_fit_near_miss_is_not():
    assert labels_in(MODELS / FACTORY_AND_FIT) == [("Net(args.width)", None)]


def test_the_forward_forward_model_is_found():
    assert labels_in(MODELS / FORWARD_FORWARD) == [("Net([784, 500, 500])", None)]


FACTORY = """
    import torch
    import torch.nn as nn
    from nets import zoo

    def make_encoder(args):
        return zoo[args.net]()

    def fit(model, loader):
        for x, y in loader:
            model(x).sum().backward()
        return model

    encoder = make_encoder(args)
    head = nn.Linear(512, 10)
    params = [{"params": filter(lambda p: p.requires_grad, encoder.parameters())}, {"params": head.parameters()}]
    optimizer = torch.optim.SGD(params, lr=0.1)
    model = fit(encoder, loader)
"""


def test_what_the_optimizer_trains_is_built_whatever_its_name(tmp_path):
    """A param-group list with a filter(): the factory that returns the encoder is called (its body only
    builds), the head is built though no name says "model", and fit() is not a construction at all."""
    index = index_of(tmp_path, FACTORY)
    assert [(kind, label, refused) for kind, label, refused in kinds(index)] == [
        ("factory", "make_encoder(args)", None),
        ("sequential", "nn.Linear(512, 10)", None),
    ]


def test_a_factory_of_the_trained_model_that_trains_is_not_called(tmp_path):
    saves = "torch.save({}, 'x.pt')\n        return zoo[args.net]()"
    index = index_of(tmp_path, FACTORY.replace("return zoo[args.net]()", saves))
    [(kind, label, refused), _] = kinds(index)
    assert (kind, label) == ("factory", "make_encoder(args)")
    assert refused == ("make_encoder() returns the model the optimizer trains, but it writes files "
                       "(`torch.save({}, 'x.pt')` at line 6), so the audit does not call it")


@pytest.mark.parametrize("optimizer", [
    "bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)",  # bitsandbytes
    "FusedAdam(model.parameters(), lr=1e-3)",  # apex
    "create_optimizer_v2(model, 'adamw', lr=1e-3)",  # timm, from the model itself
    "Lion(model.parameters(), lr=1e-4)",  # lion_pytorch
])
def test_a_factory_trained_by_an_optimizer_outside_torch_optim_is_built(tmp_path, optimizer):
    index = index_of(tmp_path, f"""
        import bitsandbytes as bnb
        from apex.optimizers import FusedAdam
        from lion_pytorch import Lion
        from timm.optim import create_optimizer_v2
        import torch.nn as nn

        def build_model(width):
            return nn.Sequential(nn.Linear(width, width), nn.ReLU())

        model = build_model(64)
        optimizer = {optimizer}
    """)
    assert kinds(index) == [("factory", "build_model(64)", None)]


def test_a_function_named_like_a_factory_is_not_called_without_an_optimizer(tmp_path):
    index = index_of(tmp_path, """
        import torch.nn as nn

        def build_model(width):
            return make_layers(width)

        def train_model(model):
            model.train()
            for batch in loader:
                model(batch)
            return {"loss": 0.0}

        model = build_model(64)
        model_results = train_model(model)
        net = nn.Linear(8, 8)
    """)
    assert kinds(index) == [
        ("factory", "build_model(64)",
         "no optimizer in this file trains what build_model() returns, and the audit calls a function only to "
         "build a model an optimizer trains"),
        ("sequential", "nn.Linear(8, 8)", None),  # a torch layer: safe to build, the name says it is the model
    ]


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


def test_no_planted_function_ran(scanned):
    _, data, err, folder = scanned
    text = json.dumps(data) + err
    assert "must not be called" not in text
    assert not (folder / "fit_was_called.txt").exists()
    assert not any(f["rule"] == "TC100" and ("train(" in f["message"] or "fit(" in f["message"])
                   for f in data["findings"])


def test_the_notebook_model_is_audited(scanned):
    found = sorted((f["rule"], f["cell"]) for f in findings_in(scanned, NOTEBOOK))
    # FashionMNISTModelV0's Linear(784, 10) and Linear(10, 10): N=10 and K=10, in the model's cell
    # the fourth cell: the notebook's cells are counted, markdown ones included (as ruff counts them)
    assert found and {rule for rule, _ in found} == {"TC101"} and {cell for _, cell in found} == {4}


def test_the_factory_model_is_audited(scanned):
    assert sorted(f["rule"] for f in findings_in(scanned, FACTORY_AND_FIT)) == ["TC101", "TC101"]


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


def test_the_slice_leaves_out_a_statement_that_calls_a_function_that_writes(tmp_path):
    index = index_of(tmp_path, """
        import torch.nn as nn

        def prepare(cfg):
            with open("run.log", "a") as log:
                log.write(str(cfg))
            return cfg

        cfg = {"width": 64}
        cfg = prepare(cfg)
        model = nn.Linear(cfg["width"], 10)
    """)
    plan = Slicer(index).plan(find_candidates(index)[0])
    assert not any("prepare" in item.get("code", "") for item in plan.program)
    [note] = plan.skipped
    assert note.startswith('line 9 (`cfg = prepare(cfg)`) calls prepare(), which writes files (`open("run.log", "a")` '
                           'at line 4)')
