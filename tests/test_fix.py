"""tcaudit fix: before/after pairs compared exactly, idempotence, the patched scripts run, and the
safety net (nothing unparsable is written, encodings and line endings survive)."""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from helpers import audited_fixture_models, run_training
from tcaudit.config import Settings
from tcaudit.engine import instantiate_rules
from tcaudit.fix.engine import fix_file
from tcaudit.rules.base import after_depth

FIX_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fix"
PAIRS = sorted(FIX_FIXTURES.glob("*.in.py"))


# The structural conversions: ``ddp_x.in.py`` is fixed with the TC5 family and ``--ddp``,
# ``dali_x.in.py`` with TC405 and ``--dali``, ``compile_x.in.py`` with TC305 and ``--compile``.
STRUCTURAL_PREFIXES = {"DDP": ("TC5",), "DALI": ("TC405",), "COMPILE": ("TC305",)}


def _settings_for(path: Path) -> Settings:
    """``tc201_x.in.py`` is fixed with TC201 alone, ``tc2_x.in.py`` with the TC2 family, ``all_x.in.py``
    with every rule; see STRUCTURAL_PREFIXES for the rest."""
    prefix = path.name.split("_")[0].upper()
    if prefix == "PAD":  # ``pad_x.in.py``: the width padding of TC101/TC102, with ``--pad-dims``
        return Settings(select=("TC101", "TC102"), pad_dims=True)
    if prefix in STRUCTURAL_PREFIXES:
        return Settings(select=STRUCTURAL_PREFIXES[prefix], structural_fixes=(prefix.lower(),))
    return Settings(select=("ALL",) if prefix == "ALL" else (prefix,))


@functools.lru_cache(maxsize=None)
def _models_for(path: Path):
    return audited_fixture_models(path)


def _out(path: Path) -> Path:
    return path.with_name(path.name.replace(".in.py", ".out.py"))


@pytest.mark.parametrize("path", PAIRS, ids=lambda p: p.name.replace(".in.py", ""))
def test_fix_matches_expected_output_exactly(path):
    settings = _settings_for(path)
    result = fix_file(path, settings, models=_models_for(path))
    assert result.error is None
    assert result.source.encode(result.fixed) == _out(path).read_bytes()
    # Each round makes every fix it can from one analysis; only fixes that wait for another rule's
    # fix (``after``) or a conversion's companions need a round of their own.
    bound = after_depth(instantiate_rules(Settings(select=("ALL",)))) + (1 if settings.structural_fixes else 0)
    assert result.rounds <= bound


@pytest.mark.parametrize("path", PAIRS, ids=lambda p: p.name.replace(".in.py", ""))
def test_fix_is_idempotent(path):
    result = fix_file(_out(path), _settings_for(path), models=_models_for(_out(path)))
    assert result.error is None
    assert not result.changed, result.diff()


def _run_line(path: Path) -> str | None:
    match = re.search(r"#\s*run:\s*(.+)", path.read_bytes().decode("utf-8", "replace"))
    return match.group(1).strip() if match else None


RUNNABLE = [p for p in PAIRS if _run_line(p)]


@pytest.mark.slow
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.name.replace(".in.py", ""))
def test_patched_script_still_trains(path, tmp_path):
    """The patched script runs on this CPU machine (device-agnostic autocast) and ends with a finite loss."""
    patched = tmp_path / "patched.py"
    patched.write_bytes(_out(path).read_bytes())
    command = _run_line(path).replace("{path}", str(patched)).split()
    assert command[0] == "python"
    proc = run_training([sys.executable, *command[1:]], tmp_path, {**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss\s+(-?[\d.]+(?:e-?\d+)?|nan|inf)", proc.stdout)]
    assert all(l == l and abs(l) != float("inf") for l in losses)


def test_cli_fix_shows_a_diff_and_exits_1(tmp_path):
    target = tmp_path / "train.py"
    target.write_bytes((FIX_FIXTURES / "tc202_deprecated.in.py").read_bytes())
    code, out, err = run_cli("fix", str(target), "--select", "TC202", "--color", "never")
    assert code == 1
    assert "-from torch.cuda.amp import autocast as ac, GradScaler" in out
    assert "+from torch.amp import autocast as ac, GradScaler" in out
    assert target.read_bytes() == (FIX_FIXTURES / "tc202_deprecated.in.py").read_bytes()


def test_cli_fix_apply_writes_keeps_mode_and_second_run_is_clean(tmp_path):
    target = tmp_path / "train.py"
    target.write_bytes((FIX_FIXTURES / "tc202_crlf.in.py").read_bytes())
    target.chmod(0o755)
    code, _, err = run_cli("fix", str(target), "--select", "TC202", "--apply")
    assert code == 0, err
    assert target.read_bytes() == (FIX_FIXTURES / "tc202_crlf.out.py").read_bytes()
    assert b"\r\n" in target.read_bytes() and b"\n" not in target.read_bytes().replace(b"\r\n", b"")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert not list(tmp_path.glob("*.tcaudit-tmp"))
    code, out, _ = run_cli("fix", str(target), "--select", "TC202")
    assert code == 0 and out == ""


def test_unparsable_file_is_left_byte_for_byte(tmp_path):
    target = tmp_path / "old.py"
    original = b'import torch\nprint "py2"\nscaler = torch.cuda.amp.GradScaler()\n'
    target.write_bytes(original)
    code, out, err = run_cli("fix", str(target), "--apply")
    assert target.read_bytes() == original
    assert "not fixed" in err and "Python 2" in err
    assert "Traceback" not in err


def test_latin1_file_keeps_its_encoding(tmp_path):
    target = tmp_path / "legacy.py"
    original = "# -*- coding: latin-1 -*-\n# perte moyenne \xe9t\xe9\nimport torch\nscaler = torch.cuda.amp.GradScaler()\n"
    target.write_bytes(original.encode("latin-1"))
    code, _, err = run_cli("fix", str(target), "--select", "TC202", "--apply")
    assert code == 0, err
    assert target.read_bytes() == original.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")').encode(
        "latin-1"
    )


def test_broken_rewrite_is_never_written(tmp_path, monkeypatch):
    """If a codemod produced code that does not compile, the file stays as it was."""
    import libcst as cst

    from tcaudit.rules.amp import tc202_deprecated_amp_api as module

    def broken_apply(self, tree, findings, context):
        return tree.with_changes(body=[cst.SimpleStatementLine([cst.Expr(cst.Name("return"))])])

    monkeypatch.setattr(module.DeprecatedAmpApiFix, "apply", broken_apply)
    target = tmp_path / "train.py"
    original = b"import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    target.write_bytes(original)
    result = fix_file(target, Settings(select=("TC202",)))
    assert not result.changed
    assert any("did not compile" in reason for _, reason in result.declined)
    code, _, _ = run_cli("fix", str(target), "--select", "TC202", "--apply")
    assert target.read_bytes() == original


def test_unknown_fix_class_is_a_usage_error(tmp_path):
    target = tmp_path / "train.py"
    target.write_text("x = 1\n")
    code, _, err = run_cli("fix", str(target), "--classes", "bogus")
    assert code == 2 and "unknown fix class" in err


def test_fixes_compose_on_one_file(tmp_path):
    target = tmp_path / "train.py"
    target.write_text(
        "import torch\n"
        "from torch.cuda.amp import autocast, GradScaler\n"
        "torch._C._jit_set_profiling_executor(True)\n"
        "scaler = GradScaler()\n"
        "for x in loader:\n"
        "    with autocast():\n"
        "        loss = model(x.cuda()).mean()\n"
        "        scaler.scale(loss).backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
    )
    result = fix_file(target, Settings(select=("TC202", "TC205", "TC207", "TC304")))
    assert sorted(result.applied) == ["TC202", "TC205", "TC207", "TC304"]
    assert result.fixed == (
        "import torch\n"
        "from torch.amp import autocast, GradScaler\n"
        'scaler = GradScaler("cuda")\n'
        "for x in loader:\n"
        '    with autocast("cuda"):\n'
        "        loss = model(x.cuda()).mean()\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.unscale_(opt)\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
    )
    assert not fix_file_text_changes(result.fixed, tmp_path)


def fix_file_text_changes(text: str, tmp_path: Path) -> bool:
    again = tmp_path / "again.py"
    again.write_text(text)
    return fix_file(again, Settings(select=("TC202", "TC205", "TC207", "TC304"))).changed
