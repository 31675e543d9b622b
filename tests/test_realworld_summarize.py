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


def test_head_to_head_sets_the_fraction_and_survives_a_later_merge(tmp_path):
    """An h2h run (the patch on verify's original side, the ceiling on its patched side) gives the fraction
    and its interval; a later merge of other parts keeps it rather than the ratio of two speedups."""
    out = tmp_path / "out"
    (out / "vit_classifier" / "h2h").mkdir(parents=True)
    (out / "vit_classifier" / "h2h" / "verify.json").write_text(json.dumps(_verify(4000.0, 5000.0, 3)))
    target = tmp_path / "results.json"
    target.write_text(json.dumps([{"script": "benchmarks/realworld/vit_classifier.py", "naive": 1000.0,
                                   "speedup": {"fix": 3.0, "compile": 4.0, "ceiling": 6.0}}]))
    assert summarize.main([str(out), "--output", str(target), "--merge"]) == 0
    [row] = json.loads(target.read_text())
    assert row["fraction_source"] == "h2h" and abs(row["fraction_of_ceiling"] - 0.8) < 1e-9
    low, high = row["fraction_of_ceiling_ci"]
    assert low < 0.8 < high and abs(low - 1 / (1.25 * 1.02)) < 1e-9
    assert row["naive"] == 1000.0 and row["h2h"]["patched_compile"] == 4000.0 and row["h2h"]["ceiling"] == 5000.0
    assert row["patch_over_ceiling"] == row["fraction_of_ceiling"] and row["patch_over_ceiling_ci"] == [low, high]

    later = tmp_path / "later"
    (later / "vit_classifier" / "fix").mkdir(parents=True)
    (later / "vit_classifier" / "fix" / "verify.json").write_text(json.dumps(_verify(1000.0, 3500.0, 2)))
    assert summarize.main([str(later), "--output", str(target), "--merge"]) == 0
    [row] = json.loads(target.read_text())
    assert row["speedup"]["fix"] == 3.5 and row["fraction_source"] == "h2h"
    assert abs(row["fraction_of_ceiling"] - 0.8) < 1e-9
    assert "h2h" in summarize.table([row])


def test_ablation_variants_compile_and_change_one_thing_each(tmp_path):
    spec = importlib.util.spec_from_file_location("rw_ablate", REPO / "benchmarks" / "realworld" / "ablate.py")
    ablate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablate)
    assert ablate.main([str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.py"))
    assert written == sorted([
        "imagenet_style_ceiling_sync.py", "imagenet_style_ceiling_fp16.py", "imagenet_style_ceiling_fp16_sync.py",
        "imagenet_style_ceiling_float32.py", "imagenet_style_ceiling_dp.py", "unet_seg_ceiling_sync.py",
        "unet_seg_ceiling_fp16.py", "unet_seg_ceiling_fp16_sync.py", "vit_classifier_ceiling_sync.py"])
    fp16 = (tmp_path / "unet_seg_ceiling_fp16.py").read_text()
    assert "torch.float16" in fp16 and "scaler.step(optimizer)" in fp16 and "bfloat16" not in fp16
    assert "or True:" in (tmp_path / "vit_classifier_ceiling_sync.py").read_text()
    (tmp_path / "a_verify.json").write_text(json.dumps({**_verify(100.0, 70.0, 2), "significant": True, "input_wait": 0.04}))
    assert ablate.main(["--summarize", str(tmp_path)]) == 0
    [entry] = json.loads((tmp_path / "summary.json").read_text())
    assert entry["variant"] == "a" and abs(entry["speedup"] - 0.7) < 1e-9
