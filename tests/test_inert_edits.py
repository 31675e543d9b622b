"""Edits no rule notices (issue 50, item 1): the editor's scan of such an edit moves the last analysis's
findings instead of analysing again (tcaudit/source/inert.py, ``_Kept`` in tcaudit/engine.py). Reuse
must be invisible: after every edit of a replayed random sequence, the findings (places, messages,
fixes and their edits) equal those of a whole scan of the same text; and anything a rule could notice
(a word it reads, a name used elsewhere, a string, another module of the project) is analysed again."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES
from tcaudit import api
from tcaudit.engine import _vocabulary
from tcaudit.rewrite.textedits import apply_edits
from tcaudit.rules import registry
from tcaudit.source.inert import Outline, Shift, inert_edit

# Real-world-shaped scripts with many findings and fixes, and a two-module project.
SCRIPTS = ["resnet50/train.py", "fix/tc201_convnet.in.py", "fix/tc201_fp16_overflow_transformer.in.py",
           "scripts/tc2_dcgan_examples.py", "scripts/tc2_trainer_class.py", "projects/loader_factory/train.py"]


def _key(findings) -> list[tuple]:
    return [(f.rule, f.location, f.message, f.severity, f.source_line, f.explanation, f.related, f.scope,
             f.follows, None if f.fix is None else (f.fix.available, f.fix.reason, f.fix.description))
            for f in findings]


def _typed(text: str, rng: random.Random, step: int) -> str:
    """One edit as typing makes them, most of them ones no rule notices: a statement binding a new
    name, a comment, a blank line, spacing; and some that a rule may notice (a name used elsewhere, a
    string, a comment naming an API)."""
    lines = text.split("\n")[:-1]
    index = rng.randrange(len(lines) + 1)
    here = lines[index] if index < len(lines) else ""
    indent = here[: len(here) - len(here.lstrip())]
    kind = rng.choice(["fresh", "fresh", "fresh", "comment", "comment", "blank", "spacing", "trailing",
                       "used name", "string", "api comment", "delete fresh"])
    if kind == "fresh":
        lines.insert(index, f"{indent}note_{step} = {step} * 2")
    elif kind == "comment":
        lines.insert(index, f"{indent}# a note {step}")
    elif kind == "blank":
        lines.insert(index, "")
    elif kind == "spacing" and "=" in here and "==" not in here:
        lines[index] = here.replace("=", " = ", 1)
    elif kind == "trailing" and here.strip() and '"""' not in here and "'''" not in here:
        lines[index] = here + f"  # see {step}"
    elif kind == "used name":
        lines.insert(index, f"{indent}model = {step}")
    elif kind == "string":
        lines.insert(index, f'{indent}note_{step} = "cuda"')
    elif kind == "api comment":
        lines.insert(index, f"{indent}# try channels_last and autocast here")
    elif kind == "delete fresh":
        fresh = [i for i, line in enumerate(lines) if line.lstrip().startswith("note_")]
        if fresh:
            del lines[rng.choice(fresh)]
    return "\n".join(lines) + "\n"


def _compile_ok(text: str) -> bool:
    try:
        compile(text, "<edit>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", SCRIPTS)
def test_reused_findings_equal_a_whole_scan_after_every_edit(name, tmp_path):
    path = tmp_path / Path(name).name
    text = (FIXTURES / name).read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    settings = api.load(isolated=True, exec_models=False)
    state = api.IncrementalState()
    rng = random.Random(name)
    api.scan(text=text, filename=str(path), settings=settings, edits="lazy", incremental=state)
    reused = 0
    for step in range(24):
        candidate = _typed(text, rng, step)
        if not _compile_ok(candidate):
            continue
        text = candidate
        with_state = api.scan(text=text, filename=str(path), settings=settings, edits="lazy", incremental=state)
        reused += state.reused
        whole = api.scan(text=text, filename=str(path), settings=settings, edits="lazy")
        assert _key(with_state) == _key(whole), (name, step)
        if state.reused:  # the moved fixes' edits make what a whole scan's make (a sample: each costs a codemod)
            fixable = [(a, b) for a, b in zip(with_state, whole) if b.fix is not None and b.fix.available]
            for a, b in rng.sample(fixable, min(2, len(fixable))):
                assert (a.fix.edits is None) == (b.fix.edits is None), (name, step, a.rule)
                if b.fix.edits is not None:
                    assert apply_edits(text, a.fix.edits) == apply_edits(text, b.fix.edits), (name, step, a.rule)
    assert reused >= 4, f"only {reused} of the edits of {name} were reused"


def _outline(text: str) -> Outline:
    outline = Outline.parse(text)
    assert outline is not None
    return outline


BODY = 'def train(model, loader):\n    """One pass over the items."""\n    total = 0\n    for x in loader:\n        total += 1\n    return total\n'


@pytest.mark.parametrize("new, inert", [
    (BODY.replace("    total = 0\n", "    total = 0  # running count\n"), True),  # a comment
    (BODY.replace("    total = 0\n", "    total=0\n"), True),  # spacing
    (BODY.replace("    total = 0\n", "    total = 0\n\n"), True),  # a blank line
    (BODY.replace("    total = 0\n", "    # the count so far\n    total = 0\n"), True),  # a comment line
    (BODY.replace("    total = 0\n", "    total = 0\n    note = 3\n"), False),  # a statement, even a new name's
    (BODY.replace("    total = 0\n", "    total = 0  # channels_last\n"), False),  # a word rules read
    (BODY.replace("    total = 0\n", "    total = 0  # launch with torchrun\n"), False),  # a pattern rules search
    (BODY.replace("    total = 0\n", "    total = 1\n"), False),  # a value changed
    (BODY.replace("One pass", "A pass"), False),  # a docstring (a string) changed
    (BODY.replace("        total += 1\n", "    total += 1\n"), False),  # out of the loop
    (BODY.replace("    total = 0\n", "    total = 0\n    note = \n"), False),  # does not parse
])
def test_what_is_inert(new, inert):
    found = inert_edit(BODY, _outline(BODY), new, _vocabulary())
    assert (found is not None) is inert


def test_a_statement_added_to_a_block_is_analysed_again(tmp_path):
    """A rule reads the shape of a block: a new statement inside apex's ``amp.scale_loss`` block makes
    TC209's migration decline ("does more than the backward"), though the statement binds a new name."""
    path = tmp_path / "train.py"
    text = (FIXTURES / "fix" / "tc209_apex_amp_flag.in.py").read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    settings = api.load(isolated=True, exec_models=False)
    state = api.IncrementalState()
    before = api.scan(text=text, filename=str(path), settings=settings, edits="lazy", incremental=state)
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if "scaled_loss.backward()" in line)
    lines.insert(at + 1, lines[at][: len(lines[at]) - len(lines[at].lstrip())] + "note = 3 * 2")
    edited = "\n".join(lines)
    after = api.scan(text=edited, filename=str(path), settings=settings, edits="lazy", incremental=state)
    assert not state.reused
    assert _key(after) == _key(api.scan(text=edited, filename=str(path), settings=settings, edits="lazy"))
    migrate = [f for f in after if f.rule == "TC209" and f.fix is not None]
    assert any(f.fix.available for f in before if f.rule == "TC209") and not any(f.fix.available for f in migrate)


def test_the_shift_moves_what_is_after_the_change_and_refuses_what_is_in_it():
    old = "def f():\n    x = 1\n    return x\n"
    new = "def f():\n    note = 0\n    x = 1\n    return x\n"
    shift = Shift(old, new)
    assert (shift.start, shift.old_end, shift.new_end) == (9, 9, 22)  # slid back to the line's start
    assert shift.position(1, 5) == (1, 5)
    assert shift.position(2, 5) == (3, 5)  # the line the statement was typed in front of
    assert shift.position(2, 10, end=True) == (3, 10)
    assert shift.position(2, 1, end=True) == (2, 1)  # an end at the line's start stays before the change
    replaced = Shift("a = 1\nb = 2\n", "a = 1\nb = 22\n")
    assert replaced.position(2, 5) is None  # the first changed character
    assert replaced.position(2, 1) == (2, 1)
    assert replaced.clear_of(1, 1, 1, 6)
    assert not replaced.clear_of(2, 1, 2, 6)  # an edit of the changed line would undo the change


def test_lines_named_in_messages_are_renumbered(tmp_path):
    """TC201 names the training step's lines ("line 90-91"); a comment line typed above them moves them."""
    path = tmp_path / "train.py"
    text = (FIXTURES / "resnet50" / "train.py").read_text(encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    settings = api.load(isolated=True, exec_models=False)
    state = api.IncrementalState()
    first = api.scan(text=text, filename=str(path), settings=settings, edits="lazy", incremental=state)
    assert any("(line " in f.message for f in first if f.rule == "TC201")
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("def main")) + 1
    lines.insert(at, "    # a note")
    edited = "\n".join(lines)
    moved = api.scan(text=edited, filename=str(path), settings=settings, edits="lazy", incremental=state)
    assert state.reused
    assert _key(moved) == _key(api.scan(text=edited, filename=str(path), settings=settings, edits="lazy"))


def test_a_changed_module_of_the_project_is_analysed_again(tmp_path):
    """The last analysis read a module the script imports; once that file changes, the next edit of the
    script is analysed again even where the edit itself is inert."""
    shutil.copytree(FIXTURES / "projects" / "loader_factory", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    text = script.read_text(encoding="utf-8")
    settings = api.load(isolated=True, exec_models=False)
    state = api.IncrementalState()
    api.scan(text=text, filename=str(script), settings=settings, edits="lazy", incremental=state)
    text += "# a note\n"
    api.scan(text=text, filename=str(script), settings=settings, edits="lazy", incremental=state)
    assert state.reused
    others = [p for p in sorted((tmp_path / "p").rglob("*.py")) if p != script]
    assert others
    for other in others:
        other.write_text(other.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    text += "# another note\n"
    api.scan(text=text, filename=str(script), settings=settings, edits="lazy", incremental=state)
    assert not state.reused


def test_the_text_table_is_up_to_date():
    assert registry.TEXT_TABLE_PATH.read_text(encoding="utf-8") == registry.render_text_table(), (
        "tcaudit/rules/text_table.py is out of date: run python -m tcaudit.rules.registry --write"
    )
