"""The engine's trigger check (literal text first, then the regex) must decide exactly as each
rule's own ``may_match``: checked for every rule on every fixture and on torchvision's package, and
the literal extraction itself on patterns whose needs are known."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from tcaudit.catalog import load_catalog
from tcaudit.config import STRUCTURAL_OPTIONS, Settings
from tcaudit.engine import analyse_source, candidate_rules, instantiate_rules
from tcaudit.rules.registry import lazy_rules
from tcaudit.source.deep import call_with_deep_stack
from tcaudit.source.parsing import SourceError, SourceFile, read_source
from tcaudit.source.triggers import all_of, required_literals, trigger


def _texts() -> list[str]:
    roots = [FIXTURES, REPO / "tcaudit"]
    spec = importlib.util.find_spec("torchvision")
    if spec is not None and spec.submodule_search_locations:
        roots.append(Path(list(spec.submodule_search_locations)[0]))
    texts = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            try:
                texts.append(read_source(path).text)
            except SourceError:
                continue
    return texts


def test_candidate_rules_decide_as_may_match():
    rules = instantiate_rules(Settings())
    # The rules a scan starts from, known by the trigger table until a text needs them.
    lazy = lazy_rules(Settings())
    texts = _texts()
    assert len(texts) > 150
    for text in texts:
        expected = [r.id for r in rules if r.may_match(text)]
        assert [r.id for r in candidate_rules(rules, text)] == expected
        assert [r.id for r in candidate_rules(lazy, text)] == expected


@pytest.mark.parametrize(
    "pattern,needs",
    [
        (r"\.backward\(", [".backward("]),
        (r"\bamp\b", ["amp"]),
        (r"(?s)\A(?=.*?(?:backward))(?=.*?(?:\bcuda\b|torch\.accelerator))", ["backward", [["cuda"], ["torch.accelerator"]]]),
        (r"(?s)\A(?=.*\bcuda\b).*(?:\.backward\(|\.step\()", ["cuda", [["backward("], ["step("]]]),
        (r"a|b", []),  # one-character literals are not worth a check
        (r"foo(?!bar)", ["foo"]),  # a negative lookahead needs nothing
        (r"(?:xy)?z+", []),
        (r"(?:xy)+", ["xy"]),
        (r"(?i)Scaler", []),  # case-insensitive: no literal is certain
        (r"x(?i:abc)yz", ["yz"]),
        (r"foo|", []),  # an empty alternative needs nothing
        (r"(", []),  # not a regex: no literals (compiling it fails elsewhere)
    ],
)
def test_required_literals(pattern, needs):
    assert required_literals(pattern) == needs


@pytest.mark.parametrize(
    "pattern,text,matches",
    [
        (r"(?s)\A(?=.*?(?:backward))(?=.*?(?:\bcuda\b))", "loss.backward()\nx.cuda()", True),
        (r"(?s)\A(?=.*?(?:backward))(?=.*?(?:\bcuda\b))", "loss.backward()\nx.cudax()", False),  # literals there, regex says no
        (r"(?s)\A(?=.*?(?:backward))(?=.*?(?:\bcuda\b))", "x.cuda()", False),
        (r"(?i)scaler", "GradSCALER", True),
    ],
)
def test_trigger_search_is_the_regex(pattern, text, matches):
    assert trigger(pattern).search(text) is matches


def test_all_of_parts_are_searched_once_per_text():
    shared = r"\.\s*backward\b"
    first, second = trigger(all_of(shared, r"cuda")), trigger(all_of(r"Adam", shared))
    assert [part.pattern for part in first.parts] == [shared, "cuda"]
    verdicts: dict = {}
    text = "opt = Adam(p)\nloss.backward()\nx.cuda()"
    assert first.search(text, verdicts) and second.search(text, verdicts)
    assert verdicts[first.parts[0]] is True and second.parts[1] is first.parts[0]
    assert not first.search("loss.backward()", {})  # every part is needed
    assert not trigger(all_of(shared, r"cuda")).search("def backward(ctx): return x.cuda()")


def _catalog_examples() -> list[tuple[str, str]]:
    examples = []
    for spec in load_catalog().values():
        for kind, listed in (("bad", spec.bad), ("good", spec.good)):
            for index, example in enumerate(listed):
                examples.append((f"{spec.id} {kind}[{index}]", example.code))
                if example.fixed:
                    examples.append((f"{spec.id} {kind}[{index}] fixed", example.fixed))
    return examples


KNOWN_HIDDEN: list[str] = []


@pytest.mark.parametrize("structural", [(), STRUCTURAL_OPTIONS], ids=["default", "structural"])
def test_triggers_are_necessary_on_the_catalog_examples(structural):
    """Every rule runs on every example, triggers or not: a finding from a rule whose trigger said
    no would be a finding that scan never reports."""
    settings = Settings(structural_fixes=structural)
    rules = instantiate_rules(settings)
    examples = _catalog_examples()
    assert len(examples) > 100
    hidden = []

    def run() -> None:
        for name, code in examples:
            source = SourceFile(Path("example.py"), name, code.encode(), code, "utf-8")
            candidates = {r.id for r in candidate_rules(rules, code)}
            try:
                _, findings, errors = analyse_source(source, rules, settings)
            except SourceError:
                continue
            hidden.extend(f"{name}: {f.rule} line {f.location.line}" for f in findings if f.rule not in candidates)

    call_with_deep_stack(run)
    assert hidden == KNOWN_HIDDEN
