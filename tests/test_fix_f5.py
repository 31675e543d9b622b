"""F5: the evaluation model reloaded from a checkpoint after training. The exact before/after pairs
are fixtures/fix/compile_eval_reload, compile_eval_model and all_eval_reload (run by the oracle too);
these tests pin what they rest on."""

from __future__ import annotations

from helpers import scan_code
from tcaudit.script.facts import ScriptFacts
from tcaudit.script.guards import training_phase

RELOADED_ONLY = '''
import torch
import torch.nn as nn


def main(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), "ckpt.pt")
    model = nn.Conv2d(3, 8, 3).cuda()
    model.load_state_dict(torch.load("ckpt.pt"))
'''


def test_a_model_built_only_after_its_training_loop_is_not_compiled(tmp_path):
    """The only `model = ...` in the function is the evaluation copy: compiling it would compile
    after training and leave the training model as it was."""
    result = scan_code(tmp_path, RELOADED_ONLY, select=("TC305",), structural_fixes=("compile",))
    (finding,) = result.findings
    assert not finding.fix.available
    assert finding.fix.reason == "`model` is only built after its training loop here; compile it by hand where it trains"


def test_training_phase_places_statements_before_inside_and_after_the_loop(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(RELOADED_ONLY.lstrip(), encoding="utf-8")
    from tcaudit.source.parsing import SourceFile

    text = path.read_text()
    facts = ScriptFacts(SourceFile(path=path, display_path="train.py", raw=text.encode(), text=text, encoding="utf-8"))
    phases = {}
    for binding in facts.bindings_of("optimizer") + facts.bindings_of("loss") + facts.bindings_of("model"):
        phases[binding.target + str(facts.line_of(binding.statement.node))] = training_phase(
            facts, binding.ctx, binding.statement.node
        )
    assert phases == {"optimizer6": "before", "loss8": "inside", "model13": "after"}


def test_an_in_place_compile_keeps_the_checkpoint_keys_a_wrapper_would_prefix():
    """Why TC305 writes `model.compile()` and not `model = torch.compile(model)`: the wrapper's
    state_dict keys gain `_orig_mod.`, and loading them into the uncompiled evaluation model fails."""
    import torch

    trained = torch.nn.Sequential(torch.nn.Linear(2, 2))
    trained.compile()
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert list(trained.state_dict()) == list(fresh.state_dict()) == ["0.weight", "0.bias"]
    fresh.load_state_dict(trained.state_dict())
    wrapped = torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert list(wrapped.state_dict()) == ["_orig_mod.0.weight", "_orig_mod.0.bias"]
