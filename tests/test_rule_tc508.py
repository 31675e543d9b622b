"""TC508 find-unused-parameters reads what a verify run measured for the same script text."""

from __future__ import annotations

import json
import textwrap

from conftest import run_cli
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file
from tcaudit.runtime_facts import text_digest

SCRIPT = textwrap.dedent('''
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main(model, local_rank):
        model = DDP(
            model,
            device_ids=[local_rank],
            find_unused_parameters=True,
        )
        return model
''').lstrip()


def _verify_results(folder, text, unused):
    results = folder / "tcaudit-verify"
    results.mkdir(exist_ok=True)
    data = {"script_sha256": text_digest(text), "rounds": 3, "original": {"steps": 50},
            "health": {"original": {"unused_parameters": unused}}}
    (results / "verify.json").write_text(json.dumps(data), encoding="utf-8")


def _scan(path):
    return run_cli("scan", str(path), "--select", "TC508", "--format", "json", "--no-cache", cwd=path.parent)


def test_without_a_verify_run_it_is_info_and_says_how_to_get_the_evidence(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    code, out, _ = _scan(path)
    (finding,) = json.loads(out)["findings"]
    assert finding["severity"] == "info" and code == 0
    assert not finding["fix"]["available"] and "--health" in finding["fix"]["reason"]


def test_a_verify_run_of_this_text_with_every_parameter_used_makes_it_a_fixable_warning(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    _verify_results(tmp_path, SCRIPT, [])
    code, out, _ = _scan(path)
    (finding,) = json.loads(out)["findings"]
    assert finding["severity"] == "warning" and code == 1
    assert finding["fix"]["available"] and finding["fix"]["edit"]["kind"] == "remove-keyword"
    result = fix_file(path, Settings(select=("TC508",), root=tmp_path))
    assert result.applied == ["TC508"]
    assert result.fixed == SCRIPT.replace("        find_unused_parameters=True,\n", "")
    assert not fix_file_again(tmp_path, result.fixed).changed


def fix_file_again(folder, text):
    again = folder / "again.py"
    again.write_text(text, encoding="utf-8")
    return fix_file(again, Settings(select=("TC508",), root=folder))


def test_a_parameter_without_gradient_means_the_flag_is_needed(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    _verify_results(tmp_path, SCRIPT, ["module.aux_head.weight"])
    code, out, _ = _scan(path)
    assert json.loads(out)["findings"] == [] and code == 0


def test_a_run_of_another_text_is_not_evidence(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    _verify_results(tmp_path, SCRIPT + "# edited since\n", [])
    _, out, _ = _scan(path)
    (finding,) = json.loads(out)["findings"]
    assert finding["severity"] == "info"


def test_the_scan_cache_does_not_answer_from_before_the_verify_run(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\nselect = ['TC508']\n", encoding="utf-8")
    _, before, _ = run_cli("scan", str(path), "--format", "json", cwd=tmp_path)
    _verify_results(tmp_path, SCRIPT, [])
    _, after, _ = run_cli("scan", str(path), "--format", "json", cwd=tmp_path)
    assert json.loads(before)["findings"][0]["severity"] == "info"
    assert json.loads(after)["findings"][0]["severity"] == "warning"
