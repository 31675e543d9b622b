"""benchmarks/realworld/summarize.py: rows from verify.json files, and --merge adding runs of several
device calls together (a part a new run lacks keeps the earlier figure; the fraction is recomputed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("rw_summarize", REPO / "benchmarks" / "realworld" / "summarize.py")
summarize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summarize)


def _verify(original: float, patched: float, rounds: int) -> dict:
    return {
        "original": {"samples_per_s": original}, "patched": {"samples_per_s": patched},
        "speedup": patched / original, "speedup_ci": [patched / original * 0.98, patched / original * 1.02],
        "rounds": rounds, "loss_parity": True, "fixes_applied": ["TC201"], "gpu": "NVIDIA H200",
        "device": "NVIDIA H200", "cpu_timings": False, "torch": "2.11.0", "steps": 20, "command": "tcaudit verify ...",
    }


def test_merge_keeps_parts_and_scripts_the_new_run_lacks(tmp_path):
    out = tmp_path / "out"
    (out / "gpt_manual_attention" / "fix").mkdir(parents=True)
    (out / "gpt_manual_attention" / "fix" / "verify.json").write_text(json.dumps(_verify(40.0, 200.0, 2)))
    earlier = tmp_path / "results.json"
    old_rows = [
        {"script": "benchmarks/realworld/imagenet_style.py", "speedup": {"fix": 2.0}},
        {"script": "benchmarks/realworld/gpt_manual_attention.py", "patched": 180.0, "ceiling": 320.0,
         "speedup": {"fix": 4.4, "compile": None, "ceiling": 8.0}, "speedup_ci": {"ceiling": None},
         "rounds": {"ceiling": 1}, "naive_per_run": {"ceiling": 40.0}, "loss_parity": {"ceiling": True},
         "command": {"ceiling": "old"}, "fixes_applied": {"fix": ["TC201"], "compile": None}},
    ]
    earlier.write_text(json.dumps(old_rows))
    assert summarize.main([str(out), "--output", str(earlier), "--merge"]) == 0
    rows = json.loads(earlier.read_text())
    assert [r["script"].split("/")[-1] for r in rows] == ["imagenet_style.py", "gpt_manual_attention.py"]
    gpt = rows[1]
    assert gpt["patched"] == 200.0 and gpt["rounds"]["fix"] == 2  # the new run's part
    assert gpt["ceiling"] == 320.0 and gpt["speedup"]["ceiling"] == 8.0 and gpt["command"]["ceiling"] == "old"
    assert abs(gpt["fraction_of_ceiling"] - 5.0 / 8.0) < 1e-9


def test_without_merge_only_what_out_measured(tmp_path):
    out = tmp_path / "out"
    (out / "dcgan" / "compile").mkdir(parents=True)
    (out / "dcgan" / "compile" / "verify.json").write_text(json.dumps(_verify(100.0, 300.0, 2)))
    target = tmp_path / "results.json"
    target.write_text("[]")
    assert summarize.main([str(out), "--output", str(target)]) == 0
    [row] = json.loads(target.read_text())
    assert row["speedup"]["compile"] == 3.0 and row["fraction_of_ceiling"] is None
