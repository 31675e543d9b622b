"""verify --health flags a patch that trains worse: planted patches given with --patched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.verify.health import regressions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "verify"
TINY = FIXTURES / "tiny_train.py"


def _healthy(**changes) -> dict:
    side = {"nonfinite_loss_steps": 0, "nonfinite_grad_steps": 0, "skipped_steps": 0, "grad_norm_median": 1.0,
            "unused_parameters": []}
    side.update(changes)
    return side


def test_regressions_compare_the_patched_side_with_the_original():
    assert regressions(_healthy(), _healthy(grad_norm_median=9.0)) == []
    assert "10x the original" not in " ".join(regressions(_healthy(), _healthy(grad_norm_median=9.0)))
    assert any("12x the original" in line for line in regressions(_healthy(), _healthy(grad_norm_median=12.0)))
    assert any("skipped" in line for line in regressions(_healthy(), _healthy(skipped_steps=2)))
    # The same problem on both sides is not a regression of the patch.
    assert regressions(_healthy(unused_parameters=["a"]), _healthy(unused_parameters=["a"])) == []


def _verify_planted(tmp_path_factory, planted: str):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp(planted)
    code, stdout, stderr = run_cli("verify", str(TINY), "--patched", str(FIXTURES / f"{planted}.py"), "--health",
                                   "--rounds", "1", "--steps", "4", "--warmup", "2", "--out", str(out),
                                   "--", "--steps", "50", "--batch-size", "12")
    return code, stdout, stderr, json.loads((out / "verify.json").read_text()), out


@pytest.fixture(scope="module")
def nan_patch(tmp_path_factory):
    return _verify_planted(tmp_path_factory, "planted_nan")


@pytest.fixture(scope="module")
def unused_patch(tmp_path_factory):
    return _verify_planted(tmp_path_factory, "planted_unused")


def test_verify_flags_a_patch_that_trains_into_nan(nan_patch):
    code, stdout, stderr, data, out = nan_patch
    assert code == 1, stderr
    assert data["health"]["original"]["nonfinite_loss_steps"] == 0
    assert data["health"]["patched"]["nonfinite_loss_steps"] >= 3
    assert data["health"]["patched"]["nonfinite_grad_steps"] >= 3
    assert any("non-finite loss" in line for line in data["health_regressions"])
    assert "trains worse than the original" in stdout
    assert "loss = loss * float(\"nan\")" in (out / "work" / "patch.diff").read_text()


def test_verify_flags_a_patch_that_leaves_parameters_without_gradient(unused_patch):
    from tcaudit.runtime_facts import unused_parameters

    code, stdout, stderr, data, out = unused_patch
    assert code == 1, stderr
    assert data["loss_parity"] is True  # only the health check sees this one
    assert data["health"]["patched"]["unused_parameters"] == ["spare.bias", "spare.weight"]
    assert any("spare.weight" in line for line in data["health_regressions"])
    assert unused_parameters(out / "verify.json", "patched") == ["spare.bias", "spare.weight"]
    assert unused_parameters(out / "verify.json", "original") == []


def test_unused_parameters_loader_without_health_facts(tmp_path):
    from tcaudit.runtime_facts import unused_parameters

    (tmp_path / "verify.json").write_text(json.dumps({"health": None}))
    assert unused_parameters(tmp_path / "verify.json") is None
    assert unused_parameters(tmp_path / "missing.json") is None


def test_patched_file_that_does_not_exist_exits_2(tmp_path):
    pytest.importorskip("torch")
    code, _, stderr = run_cli("verify", str(TINY), "--patched", str(tmp_path / "nope.py"), "--out", str(tmp_path / "o"))
    assert code == 2 and "no such patched file" in stderr


def test_verify_json_carries_the_script_digest_that_tc508_matches(unused_patch, tmp_path):
    """verify writes the original script's SHA-256 and timed steps; runtime_facts finds that run for
    the same text (and only for it) in a ``tcaudit-verify`` folder."""
    from tcaudit.runtime_facts import measured_run, text_digest

    data = unused_patch[3]
    assert data["script_sha256"] == text_digest(TINY.read_text(encoding="utf-8")) and data["steps"] == 4
    (tmp_path / "tcaudit-verify").mkdir()
    (tmp_path / "tcaudit-verify" / "verify.json").write_text(json.dumps(data), encoding="utf-8")
    run = measured_run(tmp_path / "train.py", TINY.read_text(encoding="utf-8"), tmp_path)
    assert run is not None and run.steps == 4 and run.unused_parameters == ()
    assert measured_run(tmp_path / "train.py", "# another text\n", tmp_path) is None
