"""`tcaudit fix`'s "no fix" lines point at the lines scan reported: the original text's, in diff mode and
after --apply alike (fixes insert lines above later findings; issue 51: as scan says, not the partly fixed
text's), and so do the line numbers in their reasons."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import run_cli
from tcaudit.fix.engine import FileFix

REPO = Path(__file__).resolve().parent.parent
WGAN = REPO / "fixtures" / "fix" / "all_rw_wgan_gp.in.py"


def test_original_line_maps_kept_replaced_and_inserted_lines():
    original = "a\nb\nc\nd\n"
    fixed = "a\nnew1\nnew2\nb\nC\nd\n"
    result = FileFix("x.py", original, fixed)
    assert [result.original_line(n) for n in range(1, 7)] == [1, 2, 2, 2, 3, 4]
    assert FileFix("x.py", original, original).original_line(3) == 3


def _declined_lines(stderr: str, name: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}:(\d+): TC305 no fix", stderr, re.MULTILINE)]


def test_declines_name_the_lines_of_the_file_on_disk(tmp_path):
    script = tmp_path / "train.py"
    shutil.copyfile(WGAN, script)
    lines = script.read_text().splitlines()
    built = [i + 1 for i, text in enumerate(lines) if text.startswith(("generator = ", "discriminator = "))]
    _, _, err = run_cli("fix", "--no-exec", "--compile", "--isolated", "train.py", cwd=tmp_path)
    assert _declined_lines(err, "train.py") == built, err
    _, _, err = run_cli("fix", "--no-exec", "--compile", "--isolated", "--apply", "train.py", cwd=tmp_path)
    fixed = script.read_text().splitlines()
    built_after = [i + 1 for i, text in enumerate(fixed) if text.startswith(("generator = ", "discriminator = "))]
    assert built_after != built  # the fixes inserted lines above the models
    assert _declined_lines(err, "train.py") == built, err
    grad_line = next(i + 1 for i, text in enumerate(lines) if "gradients = autograd.grad(" in text)
    assert f"create_graph=True, line {grad_line})" in err, err
