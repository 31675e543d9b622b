"""The scanner's fast paths through LibCST (tcaudit/source/walk.py) must be invisible: ``walk``
makes exactly the callbacks ``node.visit`` makes, in the same order, and ``code_positions`` gives
exactly PositionProvider's positions. Checked on every fixture and on torchvision's files that the
scanner parses (big, varied library code: f-strings with format specs, relative imports, one-line
suites)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from conftest import FIXTURES
from tcaudit.script.facts import ScriptFacts, _Collector
from tcaudit.source.parsing import SourceError, read_source
from tcaudit.source.syntax import nodes_of
from tcaudit.source.walk import code_positions, walk


def _torchvision_files() -> list[Path]:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    names = ("transforms/v2/functional/_geometry.py", "models/detection/roi_heads.py", "ops/roi_align.py",
             "datasets/video_utils.py", "io/image.py", "models/_meta.py")
    return [root / name for name in names if (root / name).is_file()]


def _modules() -> list[tuple[str, cst.Module]]:
    out = []
    for path in sorted(FIXTURES.rglob("*.py")) + _torchvision_files():
        try:
            out.append((path.name, read_source(path).module))
        except SourceError:
            continue  # the deliberately broken fixtures
    return out


MODULES = _modules()
EXTRA = cst.parse_module(
    "from . import a\nfrom .b import (c as d, e)\nx = f'{y:{w}.{p}}' f'{z!r:>10}' f'{q=}'\n"
    "if x: a; b\nelse: c\nwith a as (b, c), d: pass\nlambda *a, **k: (yield)\n"
)


class Trace(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.log.append(("visit", id(node)))
        return not isinstance(node, cst.Lambda)  # a False return must skip the children in both

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.log.append(("leave", id(original_node)))

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.log.append(("visit-attr", id(node), attribute))

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        self.log.append(("leave-attr", id(original_node), attribute))


class NamedHooks(cst.CSTVisitor):
    """A visitor with CSTVisitor's own attribute dispatch, which ``walk`` resolves once per class."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.log.append(("name", node.value))

    def visit_If_body(self, node: cst.If) -> None:
        self.log.append(("if-body", id(node)))

    def leave_If_orelse(self, node: cst.If) -> None:
        self.log.append(("if-orelse-done", id(node)))

    def visit_FormattedStringExpression_format_spec(self, node: cst.FormattedStringExpression) -> None:
        self.log.append(("format-spec", id(node)))

    def visit_Call(self, node: cst.Call) -> bool:
        self.log.append(("call", id(node)))
        return len(node.args) < 3


@pytest.mark.parametrize("visitor_class", [Trace, NamedHooks])
def test_walk_makes_the_callbacks_visit_makes(visitor_class):
    assert len(MODULES) > 100
    for name, module in MODULES + [("extra", EXTRA)]:
        expected, actual = visitor_class(), visitor_class()
        module.visit(expected)
        walk(module, actual)
        assert actual.log == expected.log, name


def _collected(collector: _Collector) -> tuple:
    def frames(frame):
        return tuple((f.kind, id(f.node)) for f in frame.chain())

    def statement(s):
        return None if s is None else (id(s.node), s.index, len(s.block))

    return (
        [(id(c.node), c.name, frames(c.ctx), statement(c.statement)) for c in collector.calls],
        [(id(n), frames(f)) for n, f in collector.withs + collector.functions + collector.classes],
        [(b.target, id(b.value), frames(b.ctx), statement(b.statement)) for b in collector.bindings],
        [(id(i.node), i.local, i.qualname, frames(i.ctx), i.in_import_error_fallback) for i in collector.imports],
        collector.star_imports,
        [(id(n), dotted, frames(f)) for n, dotted, f in collector.references],
    )


def test_the_facts_collector_records_the_same_through_walk_and_visit():
    for name, module in MODULES + [("extra", EXTRA)]:
        by_visit, by_walk = _Collector(module), _Collector(module)
        module.visit(by_visit)
        walk(module, by_walk)
        assert _collected(by_walk) == _collected(by_visit), name


def test_code_positions_are_position_providers():
    for name, module in MODULES + [("extra", EXTRA)]:
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert dict(code_positions(module)) == dict(expected), name


def test_script_facts_positions_use_the_fast_path(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\n\ndef f():\n    return torch.zeros(3).cuda()\n", encoding="utf-8")
    facts = ScriptFacts(read_source(path))
    call = next(c for c in facts.calls if c.method == "cuda")
    assert (facts.line_of(call.node), facts.position(call.node).start.column) == (4, 11)


def test_contains_answers_the_same_from_a_remembered_walk():
    """``contains`` looks a node up in the container's remembered walk while a memo is kept: the same
    answers as a fresh walk's, for the nodes inside, the container itself and the nodes beside it."""
    from tcaudit.source.memo import remembering
    from tcaudit.source.syntax import contains

    module = cst.parse_module((FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8"))
    everything = nodes_of(module, cst.CSTNode)[::61]  # (a fresh walk per question: a sample)
    containers = [s for s in module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))][:4]
    fresh = {(id(c), id(n)): contains(c, n) for c in containers for n in everything}
    with remembering():
        nodes_of(module, cst.CSTNode)
        assert {(id(c), id(n)): contains(c, n) for c in containers for n in everything} == fresh
    assert sum(fresh.values()) > len(containers) * 2
