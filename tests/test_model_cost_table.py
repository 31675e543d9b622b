"""Which cost table the model audit reads: the packaged one, a user's calibrated table over it
(``tcaudit calibrate``'s default output or ``$TCAUDIT_COST_TABLE``), and what happens when the
user's table is bad. No torch."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import REPO
from tcaudit.model import cost
from tcaudit.model.cost import (
    COST_TABLE,
    CostModel,
    default_user_table,
    load_table,
    merge_tables,
    table_notes,
    table_problem,
)
from tcaudit.model.facts import CaptureInfo, ModelFacts, OpFact, Site

CALIBRATED_H200 = REPO / "benchmarks" / "results" / "h200" / "calibrate.json"
NUMBERS = ("rates", "gemm", "conv", "sdpa")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No user table unless a test writes one: XDG_CACHE_HOME in tmp_path, no $TCAUDIT_COST_TABLE."""
    monkeypatch.delenv(cost.TABLE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tcaudit" / "cost_table.json"


def packaged() -> dict:
    return json.loads(COST_TABLE.read_text(encoding="utf-8"))


def calibrated_table(arch="sm_89", device="NVIDIA L4", date="2026-12-01", bf16=1.2e14, k2=4.0) -> dict:
    """A table as `tcaudit calibrate` writes it: the packaged table, plus the GPU it measured."""
    table = packaged()
    entry = copy.deepcopy(table["gpus"]["sm_90"])
    entry.update(device=device, calibrated={"date": date, "torch": "2.11.0", "cuda": "12.8", "python": "3.12.3",
                                            "command": "tcaudit calibrate"})
    entry["rates"]["bfloat16"] = bf16
    entry["gemm"]["k_unaligned"]["2"] = k2
    table["gpus"][arch] = entry
    table["default_gpu"] = arch
    table["source"] = f"tcaudit calibrate on {device} (torch 2.11.0)"
    return table


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def model_with_one_gemm() -> ModelFacts:
    op = OpFact(0, "gemm", "linear", "fc", "Linear", 0, "bfloat16", [[8192, 4095], [4096, 4095]],
                2.0 * 8192 * 4096 * 4095, Site("/p/train.py", 9, 1), {"batch": 1, "m": 8192, "n": 4096, "k": 4095})
    return ModelFacts(target={"kind": "script", "path": "/p/train.py"}, ops=[op], capture=CaptureInfo(method="fx"),
                      total_flops=op.flops)


# -- the packaged table ---------------------------------------------------------------------------


def test_packaged_sm_90_numbers_are_the_committed_h200_calibration():
    measured = json.loads(CALIBRATED_H200.read_text(encoding="utf-8"))["gpus"]["sm_90"]
    entry = packaged()["gpus"]["sm_90"]
    for section in NUMBERS:
        assert entry[section] == measured[section], section
    assert entry["calibrated"] == measured["calibrated"]
    assert entry["device"] == measured["device"] == "NVIDIA H200"


def test_packaged_table_says_what_is_measured_and_what_is_estimated():
    table = packaged()
    assert table["source"] == ("tcaudit calibrate on NVIDIA H200, torch 2.11.0+cu130, 2026-11-30; "
                               "the team's H200 measurements with PyTorch 2.11 for the rest")
    entry = table["gpus"]["sm_90"]
    measured = " ".join(entry["measured"])
    for item in ("rates.bfloat16", "rates.float16", "rates.float32", "gemm.n_unaligned.2", "gemm.k_unaligned.2",
                 "gemm.n_unaligned.8", "gemm.m_unaligned", "gemm.not_multiple_of_64", "conv.channels_unaligned",
                 "sdpa.head_dim_unsupported"):
        assert item in measured, item
    estimated = " ".join(entry["estimated"])
    assert "conv." not in estimated and "sdpa." not in estimated and "rates.float32" not in estimated
    assert "rates.hbm_bytes_per_s" in estimated and "rates.float64" in estimated
    assert table_problem(table) == ""


def test_no_user_table_means_the_packaged_one():
    assert load_table() == packaged()
    assert table_notes() == []


def test_calibrate_writes_where_the_audit_reads(tmp_path, monkeypatch):
    """`tcaudit calibrate` (its measurement faked: no GPU here) writes the default user table, with
    XDG_CACHE_HOME honoured, and the model audit's cost table then carries the measured entry."""
    import tcaudit.verify.calibrate as calibrate
    from conftest import run_cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TCAUDIT_COST_TABLE", raising=False)
    monkeypatch.setattr(calibrate, "measure", lambda repeat=20, quick=False: {
        "arch": "sm_89", "device": "NVIDIA L4", "torch": "2.11.0", "cuda": "12.8",
        "results": {
            "rates": {"bfloat16": 1.2e14, "float16": 1.2e14, "float32": 6e13},
            "gemm": {"k_unaligned": {"1": 4.0, "2": 4.0, "4": 4.0, "8": 2.0},
                     "n_unaligned": {"1": 3.0, "2": 3.0, "4": 3.0, "8": 2.0},
                     "m_unaligned": 1.1, "not_multiple_of_64": 1.05},
            "conv": {"channels_unaligned": 1.7}, "sdpa": {"head_dim_unsupported": 2.5},
            "measured": ["rates.bfloat16: faked for the test"],
        },
    })
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("calibrate needs torch installed")
    code, out, err = run_cli("calibrate")
    assert code == 0, err
    target = tmp_path / "tcaudit" / "cost_table.json"
    assert target.is_file() and str(target) in out
    assert default_user_table() == target
    assert load_table()["gpus"]["sm_89"]["device"] == "NVIDIA L4"


# -- a user table ---------------------------------------------------------------------------------


def test_the_users_calibrated_table_comes_first(isolated):
    write(isolated, calibrated_table())
    table = load_table()
    assert table["default_gpu"] == "sm_89"
    assert table["gpus"]["sm_89"]["device"] == "NVIDIA L4"
    assert table["gpus"]["sm_90"] == packaged()["gpus"]["sm_90"]  # the packaged entries are kept
    assert table_notes() == []
    model = CostModel(model_with_one_gemm())
    assert model.gpu_key == "sm_89" and model.gemm_kn_penalty(4095, 4096, "bfloat16") == 4.0
    assert model.source.startswith("tcaudit calibrate on NVIDIA L4, torch 2.11.0, 2026-12-01")
    assert str(isolated) in model.source
    h200 = CostModel(model_with_one_gemm(), gpu="sm_90")
    assert h200.source == packaged()["source"]


def test_xdg_cache_home_is_honoured(monkeypatch, tmp_path):
    elsewhere = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(elsewhere))
    assert load_table()["default_gpu"] == "sm_90"
    write(elsewhere / "tcaudit" / "cost_table.json", calibrated_table())
    assert load_table()["default_gpu"] == "sm_89"


def test_the_env_var_names_the_table(monkeypatch, tmp_path, isolated):
    write(isolated, calibrated_table("sm_89", "NVIDIA L4"))
    named = write(tmp_path / "a100.json", calibrated_table("sm_80", "NVIDIA A100", k2=3.0))
    monkeypatch.setenv(cost.TABLE_ENV, str(named))
    table = load_table()
    assert table["default_gpu"] == "sm_80" and "sm_89" not in table["gpus"]  # the env var wins
    assert CostModel(model_with_one_gemm()).gemm_kn_penalty(4095, 4096, "bfloat16") == 3.0


def test_a_changed_user_table_is_read_again(isolated):
    write(isolated, calibrated_table(k2=4.0))
    assert load_table()["gpus"]["sm_89"]["gemm"]["k_unaligned"]["2"] == 4.0
    write(isolated, calibrated_table(k2=4.5) | {"padding": "x" * 10})
    assert load_table()["gpus"]["sm_89"]["gemm"]["k_unaligned"]["2"] == 4.5


def test_copies_of_packaged_entries_do_not_hide_newer_packaged_numbers(isolated):
    """calibrate writes the whole table: an older package's sm_90 (no `calibrated` block) comes along."""
    table = calibrated_table()
    table["gpus"]["sm_90"] = {key: value for key, value in copy.deepcopy(table["gpus"]["sm_90"]).items()
                              if key != "calibrated"}
    table["gpus"]["sm_90"]["gemm"]["k_unaligned"]["2"] = 6.0  # PERF.md's old number
    write(isolated, table)
    assert load_table()["gpus"]["sm_90"] == packaged()["gpus"]["sm_90"]


def test_the_users_own_h200_calibration_replaces_the_packaged_one(isolated):
    write(isolated, calibrated_table("sm_90", "NVIDIA H200", date="2027-01-15", k2=5.0))
    table = load_table()
    assert table["gpus"]["sm_90"]["gemm"]["k_unaligned"]["2"] == 5.0
    assert table["source"].startswith("tcaudit calibrate on NVIDIA H200, torch 2.11.0, 2027-01-15")


@pytest.mark.parametrize(
    "content,why",
    [
        ("{not json", "unreadable"),
        ("[]", "not a JSON object"),
        (json.dumps({"gpus": {}}), "no `gpus` entries"),
        (json.dumps({"gpus": {"sm_89": {"rates": {"bfloat16": 1e14}}}}), "hbm_bytes_per_s"),
        ("NEGATIVE", "gpus.sm_89.gemm.k_unaligned.2 is not a positive number"),
        ("MISSING_CONV", "gpus.sm_89.conv.channels_unaligned"),
        ("STRING_RATE", "gpus.sm_89.rates.float32 is not a positive number"),
    ],
)
def test_an_invalid_user_table_falls_back_with_a_note(isolated, content, why):
    if content == "NEGATIVE":
        content = json.dumps(calibrated_table(k2=-1.0))
    elif content == "MISSING_CONV":
        table = calibrated_table()
        del table["gpus"]["sm_89"]["conv"]
        content = json.dumps(table)
    elif content == "STRING_RATE":
        table = calibrated_table()
        table["gpus"]["sm_89"]["rates"]["float32"] = "fast"
        content = json.dumps(table)
    write(isolated, content)
    assert load_table() == packaged()
    [note] = table_notes()
    assert str(isolated) in note and why in note and "using the packaged table" in note
    CostModel(model_with_one_gemm())  # and the audit goes on


def test_a_missing_or_unreadable_named_table_falls_back_with_a_note(monkeypatch, tmp_path):
    monkeypatch.setenv(cost.TABLE_ENV, str(tmp_path / "nope.json"))
    assert load_table() == packaged()
    [note] = table_notes()
    assert "nope.json" in note and "TCAUDIT_COST_TABLE" in note and "not found" in note
    write(tmp_path / "binary.json", "")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    monkeypatch.setenv(cost.TABLE_ENV, str(tmp_path / "binary.json"))
    assert load_table() == packaged()
    assert "unreadable" in table_notes()[0]


def test_the_scan_reports_the_note(monkeypatch, isolated, tmp_path):
    """run_model_audit passes the cost table's note on (the sandbox is stubbed: no torch here)."""
    from tcaudit.config import Settings
    from tcaudit.engine import run_model_audit
    from tcaudit.model import sandbox as sandbox_module
    from tcaudit.source.parsing import read_source

    write(isolated, "{broken")
    script = write(tmp_path / "train.py", "import torch.nn as nn\n\n\nclass Net(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(4095, 4096)\n\n"
                   "    def forward(self, x):\n        return self.fc(x)\n\n\nmodel = Net()\n")

    class Stub:
        def run(self, jobs, limits, preload):
            out = []
            for job in jobs:
                facts = model_with_one_gemm()
                facts.target = job["target"]
                out.append(facts)
            return out

    monkeypatch.setattr(sandbox_module, "shared_sandbox", lambda: Stub())
    monkeypatch.setattr("tcaudit.model.torch_available", lambda: True)
    result = run_model_audit([read_source(script)], Settings(select=("TC1",), root=tmp_path))
    assert not result.errors, result.errors
    assert any("cost table" in note and "using the packaged table" in note for note in result.notes), result.notes


def test_merge_keeps_the_packaged_table_untouched():
    before = packaged()
    merged = merge_tables(before, calibrated_table(), "x.json")
    assert before == packaged() and merged["sources"]["sm_89"].endswith("(x.json)")
