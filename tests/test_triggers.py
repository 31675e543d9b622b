"""The engine's trigger check (literal text first, then the regex) must decide exactly as each
rule's own ``may_match``: checked for every rule on every fixture and on torchvision's package, and
the literal extraction itself on patterns whose needs are known."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from tcaudit.config import Settings
from tcaudit.engine import candidate_rules, instantiate_rules
from tcaudit.source.parsing import SourceError, read_source
from tcaudit.source.triggers import required_literals, trigger


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
    texts = _texts()
    assert len(texts) > 150
    for text in texts:
        assert [r.id for r in candidate_rules(rules, text)] == [r.id for r in rules if r.may_match(text)]


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
