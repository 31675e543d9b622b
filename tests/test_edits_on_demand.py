"""Issue 50, item 2: a finding's edits are made when asked for, for that finding alone, on the smallest
region of the module that holds it; ``api.scan`` makes them lazily by default; the region gives exactly
the whole module's text (so JSON, SARIF and the editor still carry ``tcaudit fix``'s edits)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tcaudit import api
from tcaudit.config import Settings
from tcaudit.engine import analyse_source, candidate_rules
from tcaudit.rewrite.textedits import apply_edits
from tcaudit.rules import base
from tcaudit.rules.registry import lazy_rules
from tcaudit.source.parsing import read_source

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "resnet50" / "train.py"

STEP = '''
def train_step_{i}(model, batch, optimizer, scaler):
    images, labels = batch
    optimizer.zero_grad()
    with torch.cuda.amp.autocast():
        loss = F.cross_entropy(model(images.cuda()), labels.cuda())
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()
'''
STEPS = "import torch\nimport torch.nn.functional as F\n\nscaler = torch.cuda.amp.GradScaler()\n" + "".join(
    STEP.format(i=i) for i in range(6))


def _fixable(findings):
    return [f for f in findings if f.fix is not None and f.fix.available and f.fix.plan is not None]


def test_api_scan_makes_each_fix_s_edits_when_first_read_and_they_equal_the_eager_ones():
    lazy = api.scan(text=STEPS, filename="steps.py", isolated=True)
    fixable = _fixable(lazy)
    assert len([f for f in fixable if f.rule == "TC202"]) == 7
    assert all(f.fix.edits_pending for f in fixable)
    eager = api.scan(text=STEPS, filename="steps.py", isolated=True, edits=True)
    assert not any(f.fix.edits_pending for f in _fixable(eager))
    assert [f.fix.edits for f in fixable] == [f.fix.edits for f in _fixable(eager)]
    assert not any(f.fix.edits_pending for f in fixable)  # made once, kept
    none = api.scan(text=STEPS, filename="steps.py", isolated=True, edits=False)
    assert all(f.fix.edits is None for f in _fixable(none))


def test_one_finding_s_edits_are_made_on_its_region_never_on_the_whole_module(monkeypatch):
    """A TC202 inside ``train_step_3``: its fix runs on the module with the other functions left out,
    and applied to the text its edits make exactly what the whole module's run makes."""
    findings = api.scan(text=STEPS, filename="steps.py", isolated=True, select=["TC202"])
    start = STEPS.splitlines().index("def train_step_3(model, batch, optimizer, scaler):") + 1
    target = next(f for f in findings if f.location.line > start)
    whole = api.scan(text=STEPS, filename="steps.py", isolated=True, select=["TC202"], edits=True)
    expected = next(f for f in whole if f.location == target.location).fix.edits

    def whole_module(*args, **kwargs):
        raise AssertionError("the fix ran on the whole module")

    monkeypatch.setattr(base, "made_by", whole_module)
    assert target.fix.edits == expected
    fixed = apply_edits(STEPS, expected)
    assert fixed.count("torch.cuda.amp.autocast()") == STEPS.count("torch.cuda.amp.autocast()") - 1
    compile(fixed, "steps.py", "exec")


def test_a_lazy_finding_is_pickled_with_its_edits_made():
    finding = next(f for f in api.scan(text=STEPS, filename="steps.py", isolated=True) if f.rule == "TC202")
    assert finding.fix.edits_pending
    copy = pickle.loads(pickle.dumps(finding))
    assert copy.fix.edits and copy.fix.edits == finding.fix.edits


def test_api_scan_refuses_an_unknown_edits_value():
    with pytest.raises(api.TcauditError, match="edits="):
        api.scan(text=STEPS, filename="steps.py", isolated=True, edits="later")


def _fix_inputs() -> list[Path]:
    return sorted((REPO / "fixtures" / "fix").glob("*.in.py")) + [FIXTURE]


@pytest.mark.parametrize("path", _fix_inputs(), ids=lambda p: p.name)
def test_the_region_makes_the_whole_module_s_text_for_every_fixable_finding(path):
    """Where the region is used at all (``made_in_region`` is not None), its text is byte for byte the
    one the codemod makes on the whole module (the safety net's verdict too), and its edits, found by
    comparing the region's code alone, turn the original text into it."""
    settings = Settings(exec_models=False)
    source = read_source(path, path.name)
    rules = candidate_rules(lazy_rules(settings), source.text, source.path, settings.root)
    try:
        facts, findings, _ = analyse_source(source, rules, settings, edits=False)
    except Exception:  # noqa: BLE001 - a fixture that does not parse has no fix to compare
        pytest.skip("does not parse")
    by_id = {rule.id: rule for rule in rules}
    for finding in _fixable(findings):
        rule = by_id.get(finding.rule)
        codemod = base.codemod_of(rule) if rule is not None else None
        if codemod is None or finding.waits_for:
            continue
        region = base.made_in_region(codemod, facts, [finding], settings, rule.id)
        if region is None:
            continue
        try:
            whole = base.made_by(codemod, facts, [finding], settings, rule.id)[0]
        except base.Refused:
            whole = None
        text, edits = region
        assert text == whole, f"{finding.rule} at line {finding.location.line}"
        assert apply_edits(source.text, edits) == whole  # its edits, found on the region's code, too


SHAPES = '''"""Steps in every shape a module holds them."""
import functools

import torch
import torch.nn.functional as F

# a comment above a decorated function


@functools.lru_cache(maxsize=None)
def cached_step(model, x):
    with torch.cuda.amp.autocast():
        return model(x)


async def async_step(model, x):
    with torch.cuda.amp.autocast():
        return model(x)


class Trainer:
    """A class between the functions."""

    def step(self, x):
        with torch.cuda.amp.autocast():
            return self.model(x)
        # a comment at the end of the block, indented


def plain_step(model, x):
    with torch.cuda.amp.autocast():  # tcaudit keeps this comment
        return F.relu(model(x))
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_the_region_serves_decorated_async_class_and_commented_shapes(monkeypatch, newline):
    """Each TC202 of a module of decorated, async, class and commented functions (LF and CRLF) gets its
    edits from its region alone, and they equal the whole module's."""
    text = SHAPES.replace("\n", newline)
    whole = api.scan(text=text, filename="shapes.py", isolated=True, select=["TC202"], edits=True)
    expected = [f.fix.edits for f in whole if f.fix is not None and f.fix.available]
    assert len(expected) == 4 and all(expected)
    lazy = api.scan(text=text, filename="shapes.py", isolated=True, select=["TC202"])

    def whole_module(*args, **kwargs):
        raise AssertionError("the fix ran on the whole module")

    monkeypatch.setattr(base, "made_by", whole_module)
    assert [f.fix.edits for f in lazy if f.fix is not None and f.fix.available] == expected
    for edits in expected:
        fixed = apply_edits(text, edits)
        assert fixed.count(newline) == text.count(newline) and "\r\r" not in fixed
        compile(fixed, "shapes.py", "exec")
