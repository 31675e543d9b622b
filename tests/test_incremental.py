"""Incremental analysis (issue 50, item 1): a document's next text is parsed only where it changed
(tcaudit/source/incremental.py) and the walks over the statements it did not change are reused
(tcaudit/source/memo.py). Both must be invisible in the results: the spliced module is the module a
whole parse gives, the remembered walks answer what a fresh walk answers, and a scan with the state
reports exactly what a scan without it reports."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Iterator

import libcst as cst
import pytest

from conftest import FIXTURES
from tcaudit import api
from tcaudit.source.incremental import IncrementalState
from tcaudit.source.memo import WalkMemo, remembering
from tcaudit.source.parsing import SourceFile
from tcaudit.source.syntax import nodes_of, parent_map
from tcaudit.source.walk import code_positions

SCRIPTS = sorted([*FIXTURES.glob("fix/*.in.py"), *FIXTURES.glob("scripts/*.py"), *FIXTURES.glob("projects/**/*.py")])


def _source(text: str) -> SourceFile:
    return SourceFile(Path("edited.py"), "edited.py", text.encode(), text, "utf-8")


def _parses(text: str) -> bool:
    try:
        return cst.parse_module(text).code == text
    except cst.ParserSyntaxError:
        return False


def _edit(text: str, rng: random.Random) -> str:
    """One edit as typing makes them: a line copied elsewhere, deleted, indented, a blank or comment
    line inserted (at either indentation), a token changed, something appended to a line."""
    lines = text.split("\n")[:-1]
    index = rng.randrange(len(lines) + 1)
    kind = rng.choice(["copy", "delete", "blank", "comment", "indented comment", "indent", "rename", "append"])
    if kind == "copy" and lines:
        lines.insert(index, lines[rng.randrange(len(lines))])
    elif kind == "delete" and index < len(lines):
        del lines[index]
    elif kind == "blank":
        lines.insert(index, "")
    elif kind == "comment":
        lines.insert(index, "# a note")
    elif kind == "indented comment":
        lines.insert(index, "    # a note")
    elif kind == "indent" and index < len(lines):
        lines[index] = "    " + lines[index]
    elif kind == "rename" and index < len(lines):
        lines[index] = lines[index].replace("model", "net")
    elif index < len(lines) and lines[index].strip():
        lines[index] += " + 1"
    return "\n".join(lines) + "\n"


def _replayed(path: Path, edit, count: int, start) -> "Iterator[str]":
    """The texts of ``count`` random edits of the script at ``path`` (``start(text)`` first), each one that
    parses (a broken text is parsed whole and reported; the state keeps the last good one)."""
    text = path.read_text(encoding="utf-8")
    if "\r" in text or "\ufeff" in text or not _parses(text):
        pytest.skip("not a text the splice takes (carriage returns, a BOM) or not parsable")
    rng = random.Random(path.name)
    start(text)
    for _ in range(count):
        new = edit(text, rng)
        if _parses(new):
            yield new
            text = new


def _analysed(state: IncrementalState, text: str) -> SourceFile:
    source = _source(text)
    with state.analysing(source):
        code_positions(source.module)  # as an analysis asks, so that the memo has something to reuse
    return source


@pytest.mark.parametrize("path", SCRIPTS[::3], ids=lambda p: str(p.relative_to(FIXTURES)))
def test_a_spliced_module_is_the_module_a_whole_parse_gives(path):
    state = IncrementalState()
    for new in _replayed(path, _edit, 8, lambda text: _analysed(state, text)):
        source = _analysed(state, new)
        module = source.parsed_module
        assert module.code == new
        assert module.deep_equals(cst.parse_module(new)), (path, state.reparsed)


def _edit_inside(text: str, rng: random.Random) -> str:
    """One edit typed inside a block: a statement or an ``if`` with its body, a comment at the line's
    indentation, deeper or at the margin, a blank or whitespace line, a line deleted, changed or dedented."""
    lines = text.split("\n")[:-1]
    indented = [k for k, line in enumerate(lines) if line[:1] in (" ", "\t") and line.strip()]
    if not indented:
        return text
    index = rng.choice(indented)
    line = lines[index]
    indent = line[:len(line) - len(line.lstrip())]
    kind = rng.choice(["statement", "compound", "comment", "deeper comment", "margin comment", "blank",
                       "spaces", "delete", "append", "dedent", "after", "end of block"])
    if kind == "end of block":  # a line typed after the last line of the block the line is in
        end = index
        while end + 1 < len(lines) and (not lines[end + 1].strip() or lines[end + 1].startswith(indent)):
            end += 1
        while not lines[end].strip():
            end -= 1
        lines.insert(end + 1, f"{indent}{rng.choice(['note = 4', 'if note:', '# a note', 'return note'])}")
        if lines[end + 1].endswith(":"):
            lines.insert(end + 2, f"{indent}    note = 5")
        return "\n".join(lines) + "\n"
    if kind == "statement":
        lines.insert(index, f"{indent}note = 1")
    elif kind == "compound":
        lines[index:index] = [f"{indent}if note:", f"{indent}    note = 2"]
    elif kind == "comment":
        lines.insert(index, f"{indent}# a note")
    elif kind == "deeper comment":
        lines.insert(index, f"{indent}    # a note")
    elif kind == "margin comment":
        lines.insert(index, "# a note")
    elif kind == "blank":
        lines.insert(index, "")
    elif kind == "spaces":
        lines.insert(index, indent)
    elif kind == "delete":
        del lines[index]
    elif kind == "append":
        lines[index] += "  # typed"
    elif kind == "dedent":
        lines[index] = line[4:] if line.startswith("    ") else line.lstrip()
    else:  # a statement after the line, at its indentation
        lines.insert(index + 1, f"{indent}note = 3")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", SCRIPTS[::2], ids=lambda p: str(p.relative_to(FIXTURES)))
def test_a_module_remade_inside_a_statement_is_the_module_a_whole_parse_gives(path):
    """Edits typed inside blocks parse only the statements they touched in the innermost block that
    holds them (``_Inside``); the module is a whole parse's, node for node, after every edit."""
    state = IncrementalState()
    for new in _replayed(path, _edit_inside, 10, lambda text: _walked(state, text)):
        source, positions, nodes, parents = _walked(state, new)
        module = source.parsed_module
        assert module.code == new
        assert module.deep_equals(cst.parse_module(new)), (path, state.reparsed, state.parsed_inside)
        INSIDE[state.parsed_inside is not None] += 1
        # The walk and the positions remade from the last ones are a fresh walk's.
        fresh_nodes = nodes_of(module, cst.CSTNode)
        assert [id(n) for n in nodes] == [id(n) for n in fresh_nodes]
        assert parents == parent_map(module)
        fresh = code_positions(module)
        assert all(positions[n] == fresh[n] for n in fresh_nodes), (path, state.parsed_inside)


def _walked(state: IncrementalState, text: str) -> tuple:
    """The text analysed with the state as the rules ask of it: (source, positions, every node, parents)."""
    source = _source(text)
    with state.analysing(source):
        module = source.module
        found = (source, code_positions(module), nodes_of(module, cst.CSTNode), parent_map(module))
        for statement in module.body:  # questions about trees inside the statements, as the rules ask
            nodes_of(statement, cst.SimpleStatementLine)
    return found


INSIDE = {True: 0, False: 0}  # how the edits above were parsed: inside a statement, or not


def test_most_edits_inside_blocks_are_parsed_inside_them():
    """The test above would pass by never splicing inside: most of its edits must have been."""
    if not INSIDE[True] + INSIDE[False]:
        pytest.skip("the random edits did not run in this process")
    assert INSIDE[True] >= INSIDE[False], INSIDE


MAIN = """import torch


def main(model, loader, optimizer):
    model.train()
    for epoch in range(10):
        for images, labels in loader:
            loss = model(images).sum()
            loss.backward()
            optimizer.step()
        print(epoch)
    return model


def other():
    return 1
"""


@pytest.mark.parametrize("edit, parsed", [
    pytest.param(lambda t: t.replace("    model.train()\n", "    note = 1\n    model.train()\n"), 1, id="typed before a statement"),
    pytest.param(lambda t: t.replace("    for epoch", "    note = 1\n    for epoch"), 1, id="typed before a loop"),
    pytest.param(lambda t: t.replace("            loss.backward()", "            torch.cuda.synchronize()\n            loss.backward()"),
                 1, id="typed in the inner loop"),
    pytest.param(lambda t: t.replace("loss.backward()", "loss.backward(retain_graph=True)"), 1, id="a statement changed"),
    pytest.param(lambda t: t.replace("        print(epoch)\n", "        print(epoch)\n        note = 2\n"), 2,
                 id="appended to the outer loop"),
    pytest.param(lambda t: t.replace("    return model\n", "    return model\n    note = 3\n"), 2, id="appended to the function"),
])
def test_an_edit_inside_a_loop_parses_the_statements_it_touched(edit, parsed):
    """An edit inside a function parses only the statements it touched in the innermost block (the
    line typed; with the statement it follows where it ends a block); the module is a whole parse's."""
    state = IncrementalState()
    first = _analysed(state, MAIN)
    new = edit(MAIN)
    assert new != MAIN
    source = _analysed(state, new)
    assert source.parsed_module.deep_equals(cst.parse_module(new))
    assert (state.reparsed, state.parsed_inside) == (1, parsed)
    assert source.parsed_module.body[-1] is first.parsed_module.body[-1]


def test_an_edit_inside_a_function_reparses_that_function_and_its_neighbours_only():
    functions = "".join(f"\n\ndef step_{k}(model, batch):\n    loss = model(batch).sum()\n    return loss\n"
                        for k in range(40))
    text = "import torch\n" + functions
    state = IncrementalState()
    first = _analysed(state, text)
    assert state.reparsed == "all"
    edited = text.replace("def step_20(model, batch):\n    loss", "def step_20(model, batch):\n    x = 1\n    loss")
    second = _analysed(state, edited)
    assert state.reparsed == 1  # step_20 alone: the edit comes after its header, so step_19 keeps its lines
    # The statements the edit did not touch are the same objects, so what was found about them is reused.
    assert second.parsed_module.body[5] is first.parsed_module.body[5]
    assert second.parsed_module.body[-1] is first.parsed_module.body[-1]
    assert state.memo.hits > 0
    # An edit of the header itself (or of the lines above it) parses step_19 too: a line the edit leaves
    # there may belong to step_19's block.
    third = edited.replace("def step_30(model, batch):", "def step_30(model, batch, k):")
    _analysed(state, third)
    assert state.reparsed == 2


TEXT = "import torch\n" + "".join(f"\n\ndef f{k}(loss):\n    return loss\n" for k in range(5))


@pytest.mark.parametrize("edit, reparsed", [
    pytest.param(lambda t: "# a header comment\n" + t, "all", id="header"),
    pytest.param(lambda t: t.replace("\n", "\r\n"), "all", id="carriage returns"),
    # The module's indentation comes from its first block: changed there, the whole module is parsed.
    pytest.param(lambda t: t.replace("    return loss\n", "  return loss\n", 1), "all", id="first block's indent"),
    pytest.param(lambda t: t.replace("    return loss\n", "  return loss\n").replace("  return", "    return", 1),
                 5, id="another block's indent"),
    pytest.param(lambda t: t.replace("def f0(loss):\n    return loss", "f0 = None"), 3, id="first block gone"),
    pytest.param(lambda t: t.replace("import torch\n", "import torch\nimport os\n"), 3, id="first statement"),
    pytest.param(lambda t: t + "# the end\n", 1, id="footer"),
    pytest.param(lambda t: t.replace("def f0(loss):\n    return loss", "f0 = None\n\n\ndef g(loss):\n    return loss"),
                 3, id="first block replaced by one"),
])
def test_what_decides_for_the_whole_module_is_followed(edit, reparsed):
    state = IncrementalState()
    _analysed(state, TEXT)
    new = edit(TEXT)
    source = _analysed(state, new)
    assert source.parsed_module.code == new
    if "\r" not in new:
        assert source.parsed_module.deep_equals(cst.parse_module(new))
    assert state.reparsed == reparsed


def test_a_module_that_loses_its_only_block_is_parsed_whole():
    state = IncrementalState()
    text = "import torch\n\n\ndef f(loss):\n    return loss\n\n\nx = 1\n"
    _analysed(state, text)
    new = text.replace("def f(loss):\n    return loss", "f = None")
    assert _analysed(state, new).parsed_module.deep_equals(cst.parse_module(new))
    assert state.reparsed == "all"


def test_a_text_that_does_not_parse_leaves_the_last_good_module_to_splice_into():
    text = "import torch\n" + "".join(f"\n\ndef f{k}(loss):\n    return loss\n" for k in range(6))
    state = IncrementalState()
    _analysed(state, text)
    broken = text.replace("def f3(loss):", "def f3(loss:")
    with pytest.raises(Exception):
        _analysed(state, broken)
    fixed = text.replace("def f3(loss):", "def f3(loss, scale):")
    source = _analysed(state, fixed)
    assert state.reparsed == 2
    assert source.parsed_module.deep_equals(cst.parse_module(fixed))


@pytest.mark.parametrize("path", SCRIPTS[1::4], ids=lambda p: str(p.relative_to(FIXTURES)))
def test_remembered_walks_answer_what_fresh_walks_answer(path):
    text = path.read_text(encoding="utf-8")
    if not _parses(text):
        pytest.skip("not parsable")
    module = cst.parse_module(text)
    positions, nodes, parents = code_positions(module), nodes_of(module, cst.CSTNode), parent_map(module)
    memo = WalkMemo()
    for _ in range(2):  # the second time from the memo
        with remembering(memo):
            remembered = code_positions(module)
            assert [id(n) for n in nodes_of(module, cst.CSTNode)] == [id(n) for n in nodes]
            assert parent_map(module) == parents
            assert all(remembered[node] == positions[node] for node in nodes)
            assert [id(n) for n in nodes_of(module, cst.Call)] == [id(n) for n in nodes if isinstance(n, cst.Call)]
    assert memo.hits > 0


@pytest.mark.parametrize("name", ["resnet50/train.py", "fix/all_rw_moco.in.py"])
def test_a_remembered_walk_answers_for_every_tree_under_it(name):
    """A question about a node inside a statement whose walk is remembered is answered from that walk
    (a slice of it), whatever was asked first; the answers are a fresh walk's, and the memo's note of
    which walk holds which node shrinks with the walks it forgets (edits do not make it grow)."""
    from tcaudit.source import walk as walk_module

    text = (FIXTURES / name).read_text(encoding="utf-8")
    module = cst.parse_module(text)
    inner = [n for n in nodes_of(module, cst.CSTNode) if not isinstance(n, cst.Module)]
    fresh = {id(n): ([id(c) for c in nodes_of(n, cst.Call)], [id(c) for c in nodes_of(n, cst.CSTNode)],
                     parent_map(n)) for n in inner}
    walks = []
    real_walk = walk_module.walk
    for order in (inner, inner[::-1]):  # the statements' walks first; the innermost trees' first
        memo = WalkMemo()
        with remembering(memo), pytest.MonkeyPatch.context() as patch:
            patch.setattr("tcaudit.source.syntax.walk", lambda node, visitor: (walks.append(node), real_walk(node, visitor)))
            for node in order:
                calls, everything, parents = fresh[id(node)]
                assert [id(c) for c in nodes_of(node, cst.Call)] == calls
                assert [id(c) for c in nodes_of(node, cst.CSTNode)] == everything
                assert parent_map(node) == parents
        if order is inner:
            assert len(walks) == len(module.body), "a tree inside a walked statement was walked again"
    state, rng = IncrementalState(), random.Random(name)
    swept = 0
    for _ in range(24):
        source = _source(text)
        sweeps = state.memo.sweeps
        with state.analysing(source):
            for statement in source.module.body:
                nodes_of(statement, cst.Call)
                for node in nodes_of(statement, cst.SimpleStatementLine):
                    assert [id(c) for c in nodes_of(node, cst.Call)] == [id(c) for c in _fresh_calls(node)]
        if state.memo.sweeps > sweeps:
            # What the memo notes is of this module's nodes only: the last modules' went with their walks
            # when it forgot them (every few analyses), and the nodes an edit inside a statement took
            # away went at once.
            assert state.memo.enclosed <= len(_fresh_nodes(source.module))
            swept += 1
        text = next((t for t in (rng.choice([_edit, _edit_inside])(text, rng) for _ in range(30)) if _parses(t)), text)
    assert swept >= 4


def _fresh_calls(node) -> list:
    with remembering(WalkMemo()):
        return nodes_of(node, cst.Call)


def _fresh_nodes(node) -> list:
    with remembering(WalkMemo()):
        return nodes_of(node, cst.CSTNode)


def _frame(frame) -> tuple:
    """A context as the kinds and nodes of its frames, the module's frame without its node (a fresh
    analysis has its own frame; a document's analyses share one, made each one's module's)."""
    return tuple((f.kind, None if f.parent is None else id(f.node)) for f in frame.chain())


def _statement(statement) -> tuple | None:
    return None if statement is None else (id(statement.node), statement.index, tuple(map(id, statement.block)))


def _records(facts) -> dict:
    return {
        "calls": [(id(c.node), c.name, c.qualname, _frame(c.ctx), _statement(c.statement)) for c in facts.calls],
        "bindings": [(b.target, id(b.value), _frame(b.ctx), _statement(b.statement)) for b in facts.bindings],
        "places": [(id(n), _frame(f)) for n, f in [*facts.functions, *facts.classes, *facts.withs]],
        "imports": [(id(i.node), i.local, i.qualname, _frame(i.ctx), i.in_import_error_fallback)
                    for i in facts.imports],
        "stars": list(facts.star_imports),
        "references": [(id(n), dotted, _frame(f)) for n, dotted, f in facts._raw_references],
        "roots": {id(list(r.ctx.chain())[-1]) for r in [*facts.calls, *facts.bindings, *facts.imports]},
    }


@pytest.mark.parametrize("name", ["resnet50/train.py", "scripts/tc5_single_gpu.py", "fix/all_rw_moco.in.py",
                                  "fix/ddp_datamodule_class.in.py"])
def test_facts_of_the_statements_an_edit_left_are_moved_onto_the_new_module(name):
    """The facts take a statement an edit did not touch from the last analysis (tcaudit/script/facts.py's
    ``_moved_records``): every record, context and statement place equals a fresh walk's, and every
    context ends at this analysis's module frame (the document's, its node this module)."""
    from tcaudit.source.memo import active
    from tcaudit.script.facts import ScriptFacts

    text = (FIXTURES / name).read_text(encoding="utf-8")
    state, rng, moved = IncrementalState(), random.Random(name), 0
    for _ in range(8):
        source = _source(text)
        with state.analysing(source):
            hits = state.memo.hits
            facts = ScriptFacts(source)
            reused = _records(facts)
            moved += state.memo.hits > hits
            memo = active()
        with remembering(WalkMemo()):  # a memo of its own: every statement walked afresh
            fresh = _records(ScriptFacts(source))
        assert memo is state.memo
        assert reused.pop("roots") == {id(facts.module_frame)} and facts.module_frame.node is source.module
        fresh.pop("roots")
        assert reused == fresh
        text = next((t for t in (_edit(text, rng) for _ in range(30)) if _parses(t)), text)
    assert moved, "no statement's records were reused: the test would not see a difference"


@pytest.mark.parametrize("name", ["resnet50/train.py", "fix/all_rw_moco.in.py", "scripts/tc5_single_gpu.py"])
def test_positions_and_parents_put_together_from_the_last_module_are_a_fresh_walks(name):
    """After each edit, a module's positions are its statements' (the kept ones' remembered, the memo saying
    which statement holds a node), its parents put together from its statements': every node's equal a
    fresh walk's. The last analysis's positions still answer for its own nodes after the next one (a quick
    fix made from them), though the memo forgot the statements an edit replaced."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    state, rng, updated, last = IncrementalState(), random.Random(name), 0, None
    for _ in range(10):
        source = _source(text)
        module = source.module
        nodes, fresh_parents = nodes_of(module, cst.CSTNode), _fresh_parents(module)  # no memo: fresh walks
        with state.analysing(source):
            remembered, parents = code_positions(module), parent_map(module)
            updated += state.reparsed != "all"
            # Asked while the analysis runs: from the walks of the statements.
            assert all(parents.get(id(node)) is fresh_parents.get(id(node)) for node in nodes[::2])
            assert parents.get(id(module)) is None and parents.get(id(cst.Name("elsewhere"))) is None
        fresh_positions = code_positions(module)  # no memo here: fresh
        assert all(remembered[node] == fresh_positions[node] for node in nodes[::2])
        assert len(remembered) == len(fresh_positions)
        if last is not None:  # the other half of the last module's nodes: asked for the first time now
            last_nodes, last_remembered, last_fresh, last_parents, last_fresh_parents = last
            assert all(last_remembered[node] == last_fresh[node] for node in last_nodes[1::2])
            assert all(last_parents.get(id(node)) is last_fresh_parents.get(id(node)) for node in last_nodes[1::2])
        assert parents == fresh_parents
        last = (nodes, remembered, fresh_positions, parents, fresh_parents)
        text = next((t for t in (_edit(text, rng) for _ in range(30)) if _parses(t)), text)
    assert updated, "no analysis was incremental: the test would not see a difference"


def test_nodes_of_hands_out_a_list_of_its_own():
    module = cst.parse_module("f(g(1))\n")
    with remembering():
        calls = nodes_of(module, cst.Call)
        calls.clear()
        assert len(nodes_of(module, cst.Call)) == 2


def _key(finding) -> tuple:
    fix = finding.fix
    return (finding.rule, finding.location.line, finding.location.column, finding.message,
            None if fix is None else (fix.available, fix.reason))


@pytest.mark.parametrize("name", ["resnet50/train.py", "scripts/tc5_single_gpu.py", "fix/all_rw_moco.in.py"])
def test_a_scan_with_the_state_reports_what_a_scan_without_it_reports(name):
    path = FIXTURES / name
    text = path.read_text(encoding="utf-8")
    settings = api.load(isolated=True, exec_models=False)
    state = IncrementalState()
    rng = random.Random(name)
    checked = 0
    for _ in range(10):
        with_state = api.scan(text=text, filename=path.name, settings=settings, edits=False, incremental=state)
        without = api.scan(text=text, filename=path.name, settings=settings, edits=False)
        assert [_key(f) for f in with_state] == [_key(f) for f in without]
        checked += state.reparsed != "all"
        text = next((t for t in (_edit(text, rng) for _ in range(30)) if _parses(t)), text)
    assert checked, "no scan was incremental: the test would not see a difference"


@pytest.mark.parametrize("name", ["resnet50/train.py", "fix/all_rw_moco.in.py", "scripts/tc5_single_gpu.py"])
def test_the_literals_triggers_need_are_answered_from_the_last_text_as_a_search_answers(name):
    """``triggers.Literals``: whether each text of a document contains a literal, answered from the last
    text's answers and the stretch the edit changed, is ``literal in text`` after every edit (typed,
    deleted, several at once), for literals found before, never found, and found only in the edit."""
    from tcaudit.source.triggers import Literals

    text = (FIXTURES / name).read_text(encoding="utf-8")
    rng = random.Random(name)
    words = sorted(set(re.findall(r"[A-Za-z_.(]{3,12}", text)))
    literals = [*rng.sample(words, 60), "note = 1", "a note", "note", "backward", "torch.compile", "DistributedSampler",
                ".cuda(", "zzz_never"]
    state = Literals()
    for _ in range(40):
        state.use(text)
        for literal in rng.sample(literals, 40):  # not every literal every time, as triggers ask
            assert state.contains(literal) == (literal in text), literal
        text = rng.choice([_edit, _edit_inside])(text, rng)
        if rng.random() < 0.2:
            text = _edit(text, rng)  # two edits between analyses


def _typed(text: str, rng: random.Random) -> str:
    """A few characters typed or deleted anywhere, a line's end among them: what breaks a regex's match
    or makes one at its edges."""
    at = rng.randrange(len(text) + 1)
    if rng.random() < 0.5:
        return text[:at] + rng.choice(["\n", " ", "x", "(", ".", "_", "cuda", "backward(", "= False", "#"]) + text[at:]
    return text[:at] + text[at + rng.randint(1, 6):]


# Shapes the trigger regexes have, and ones that must not be answered from the last text: anchors at the
# text's end, lookarounds, a match across lines.
_REGEX_SHAPES = [r"\bcuda\b", r"\.backward\(|\.step\(|\b(fit|train)\w*\(", r"set_to_none\s*=\s*False",
                 r"(?m)^[ \t]*(?:[^\n]*;[ \t]*)?[\w.]+\.eval\(\)", r"(?m)^\s*import\s", r"model\s*$", r"\)\Z",
                 r"(?<=\.)cuda", r"cuda(?!\()", r"(?s)def.*?return", r"x\W+y", r"[^a-z]model[^\n]", r"\Aimport",
                 r"model(?<!\wmodel)\b", r"(?<!\s)model", r"(?<=\n)def", r"model(?=\.cuda\()", r"cuda(?=.*\))",
                 r"(?<![\w.])model(?!\s*=)"]


@pytest.mark.parametrize("name", ["resnet50/train.py", "fix/all_rw_moco.in.py"])
def test_the_trigger_regexes_are_answered_from_the_last_text_as_a_search_answers(name, monkeypatch):
    """``triggers.Literals.matches``: whether each text of a document has a match of a regex, answered
    from the last text's match and the lines the edit touched, is ``regex.search(text) is not None``
    after every edit (lines and characters typed or deleted, several at once), for every rule's trigger
    regexes (and the parts of ``all_of`` ones), those the analysis asks of the text, and regexes that
    look beyond their match or across lines."""
    from tcaudit.config import Settings
    from tcaudit.rules.registry import lazy_rules
    from tcaudit.source.triggers import Literals, trigger

    patterns = set(_REGEX_SHAPES)
    for rule in lazy_rules(Settings()):
        patterns.update((rule.triggers or ()) + tuple(rule.helper_triggers or ()))
    regexes = {re.compile(p) for p in _REGEX_SHAPES}
    for pattern in patterns:
        check = trigger(pattern)
        regexes.add(check.regex)
        regexes.update(part.regex for part in check.parts)
    text = (FIXTURES / name).read_text(encoding="utf-8")
    asked = set()  # and those the facts and rules ask of the document's text (``text_matches``, ``match_span``)
    monkeypatch.setattr(Literals, "span", lambda self, regex, ask=Literals.span: asked.add(regex) or ask(self, regex))
    state = IncrementalState()
    for version in (text, text + "note = 1\n"):
        list(api.scan(text=version, filename="train.py", incremental=state))
    assert asked - regexes, "no regex but the triggers' was asked"
    regexes = sorted(regexes | asked, key=lambda r: (r.pattern, r.flags))
    monkeypatch.undo()
    rng = random.Random(name)
    state = Literals()
    answered = 0
    for _ in range(60):
        state.use(text)
        for regex in rng.sample(regexes, len(regexes) // 2):  # not every regex every time, as triggers ask
            assert state.matches(regex) == (regex.search(text) is not None), (regex.pattern, regex.flags)
            answered += 1
        text = rng.choice([_edit, _edit_inside, _typed, _typed])(text, rng)
        if rng.random() < 0.2:
            text = _typed(text, rng)  # two edits between analyses
    assert answered > 1000


@pytest.mark.parametrize("name", ["resnet50/train.py", "scripts/tc5_single_gpu.py"])
def test_a_search_of_a_documents_code_answers_as_a_search_of_its_text_without_comments(name):
    """``syntax.code_matches``: a regex searched in a document's code (its comments stripped), answered from
    a match the last text's answers found where the regex keeps within a line and looks beyond itself only
    as ``\\b`` does, is the search of the stripped text, after edits that move matches into comments and out
    (a ``#`` typed before one, a word typed after a ``#``) and for regexes that look further."""
    from tcaudit.script.evidence import ACCELERATOR_NAMED, CUDA_NAMED
    from tcaudit.source.syntax import code_matches, strip_comments
    from tcaudit.source.triggers import Literals, answering_literals

    regexes = [re.compile(p) for p in (ACCELERATOR_NAMED, CUDA_NAMED, r"\b(mps|xpu|HalfTensor)\b", r"model(?=#)",
                                       r"(?m)cuda$", r"cuda(?!\w)", r"\bnote\b", r"zero_grad\(\)")]
    text = (FIXTURES / name).read_text(encoding="utf-8")
    rng = random.Random(name)
    state = Literals()
    for _ in range(60):
        with answering_literals(state, text):
            for regex in regexes:
                assert code_matches(regex, text) == (regex.search(strip_comments(text)) is not None), regex.pattern
        lines = text.split("\n")
        at = rng.randrange(len(lines))
        line = lines[at]
        column = rng.randrange(len(line) + 1)
        typed = rng.choice(["#", "# cuda", "cuda", " note", "model", "#mps", "", "xpu"])
        lines[at] = line[:column] + typed + line[column + (1 if typed == "" and column < len(line) else 0):]
        text = "\n".join(lines)
        if rng.random() < 0.3:
            text = _typed(text, rng)


def test_an_older_analysis_makes_no_edits_once_the_documents_next_one_began():
    """The next analysis of a document makes the frames it shares with the last one its own nodes' (the
    facts reuse the records of what an edit inside a function left): a fix of the last analysis whose
    edits are asked for after that (a quick fix racing the typing) gets none, rather than edits planned
    in part from the next text; asked before, it gets them, and the next analysis's fix gets its own."""
    text = (FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8")
    state = IncrementalState()

    def fixable(found):
        return [f for f in found if f.fix is not None and f.fix.available and f.rule in ("TC201", "TC303", "TC401",
                                                                                          "TC403", "TC301")]

    first = fixable(api.scan(text=text, filename="train.py", edits="lazy", incremental=state))
    asked_before = first[0]
    assert asked_before.fix.edits
    edited = text.replace("def main():\n", "def main():\n    note = 1\n", 1)
    second = fixable(api.scan(text=edited, filename="train.py", edits="lazy", incremental=state))
    assert state.parsed_inside is not None, "the edit was not spliced inside main()"
    assert len(first) >= 4
    assert [f.fix.edits for f in first[1:]] == [None] * (len(first) - 1)
    assert asked_before.fix.edits  # made before: kept
    assert all(f.fix.edits for f in second)


def test_a_modules_parents_stay_its_own_when_a_tree_of_a_fix_holds_its_nodes():
    """A fix builds a tree around some of the module's statements and walks it: the memo then says that
    walk holds those nodes, and the module's parents still answer with the module's own."""
    text = (FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8")
    source = _source(text)
    module = source.module
    fresh = _fresh_parents(module)
    with IncrementalState().analysing(source):
        parents = parent_map(module)
        borrowed = module.body[len(module.body) // 2]
        nodes_of(cst.Module(body=[cst.If(test=cst.Name("flag"), body=cst.IndentedBlock(body=[borrowed]))]), cst.CSTNode)
        inner = nodes_of(borrowed, cst.CSTNode)
        assert len(inner) > 10
        assert all(parents.get(id(node)) is fresh.get(id(node)) for node in inner)
        assert parents.get(id(borrowed)) is module


def _fresh_parents(module: cst.Module) -> dict:
    with remembering():
        return dict(parent_map(module))


def _facts_records(facts) -> dict:
    """What the facts recorded of a module, by node identity: each record's nodes, the kinds and nodes of
    its frames up to the module, and the statement it is in (its node, block and place)."""
    def chain(frame):
        return tuple((f.kind, id(f.node)) for f in frame.chain())

    def statement(found):
        return None if found is None else (id(found.node), tuple(map(id, found.block)), found.index)

    return {
        "calls": [(id(c.node), c.name, c.qualname, chain(c.ctx), statement(c.statement)) for c in facts.calls],
        "bindings": [(b.target, id(b.value), chain(b.ctx), statement(b.statement)) for b in facts.bindings],
        "withs": [(id(node), chain(frame)) for node, frame in facts.withs],
        "functions": [(id(node), chain(frame)) for node, frame in facts.functions],
        "classes": [(id(node), chain(frame)) for node, frame in facts.classes],
        "imports": [(id(i.node), i.local, i.qualname, chain(i.ctx), i.in_import_error_fallback) for i in facts.imports],
        "star_imports": list(facts.star_imports),
        "references": [(r.dotted, id(r.node), chain(r.ctx)) for r in facts.references],
    }


@pytest.mark.parametrize("name", ["resnet50/train.py", "fix/all_rw_moco.in.py", "scripts/tc5_single_gpu.py"])
def test_a_documents_facts_reuse_the_records_of_the_statements_an_edit_inside_a_function_left(name):
    """Typing inside a function remakes it around the edit; the facts then take the records of its
    statements the edit left (and their frames) from the last text's, and make the rest. After every
    edit (typed, deleted, several at once, at every depth) the records equal those a walk of the same
    module makes with nothing kept, frames and statements included."""
    from tcaudit.script.facts import ScriptFacts

    text = (FIXTURES / name).read_text(encoding="utf-8")
    rng = random.Random(name)
    state = IncrementalState()
    inside = reused = 0
    for _ in range(40):
        source = _source(text)
        with state.analysing(source):
            facts = ScriptFacts(source)
            inside += state.parsed_inside is not None
            reused += bool(state.memo.remade)
        with remembering():
            fresh = ScriptFacts(SourceFile(source.path, source.display_path, source.raw, text, "utf-8").with_module(source.module))
        assert _facts_records(facts) == _facts_records(fresh)
        text = next((t for t in (_edit_inside(text, rng) for _ in range(30)) if _parses(t)), text)
    assert inside > 10 and reused > 10, "too few edits were spliced inside a function"


def test_another_files_facts_read_during_a_documents_analysis_have_their_own_module_frame():
    """The document's facts share one module frame from one text to the next; a project module's (or this
    file's on disk) read while the document is analysed gets its own, and the document's stays its module's."""
    from tcaudit.script.facts import ScriptFacts

    text = (FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8")
    helper_text = (FIXTURES / "scripts" / "tc5_single_gpu.py").read_text(encoding="utf-8")
    state, frames = IncrementalState(), []
    for version in range(3):
        source = _source(text)
        with state.analysing(source):
            facts = ScriptFacts(source)
            on_disk, helper = ScriptFacts(_source(text)), ScriptFacts(_source(helper_text))
            assert facts.module_frame.node is source.module
            assert on_disk.module_frame is not facts.module_frame and helper.module_frame is not facts.module_frame
            assert {id(list(c.ctx.chain())[-1]) for c in helper.calls} == {id(helper.module_frame)}
            frames.append(facts.module_frame)
        text = text.replace("def main():", f"def main():\n    note_{version} = {version}", 1)
    assert frames[0] is frames[1] is frames[2], "the document's texts share their module frame"
