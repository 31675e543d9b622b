"""An already-tuned AMP script must report nothing above info with every script rule on."""

from __future__ import annotations

from pathlib import Path

from helpers import scan_paths

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


def test_tuned_script_has_nothing_above_info():
    path = FIXTURES / "tuned_resnet50_ddp.py"
    result = scan_paths([str(path)], select=("ALL",))
    above_info = [f"{f.rule}:{f.location.line} {f.message}" for f in result.findings if str(f.severity) != "info"]
    assert not above_info, above_info
