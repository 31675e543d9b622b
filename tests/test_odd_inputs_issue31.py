"""Issue 31's odd inputs: a file CPython refuses to compile is TC000 and is never rewritten, and a
statement too large to analyse in reasonable time (a few thousand links of ``a.b.b...``, ``f()()...``,
a long sum, a huge literal) is TC000 instead of minutes of parsing; ordinary long lines are analysed."""

from __future__ import annotations

import pytest

from conftest import run_cli
from tcaudit.source.parsing import MAX_STATEMENT_NODES, beyond_analysis

STEP = """
model = torch.nn.Linear(4, 4).cuda()
scaler = torch.cuda.amp.GradScaler()
"""


def _script(line: str) -> str:
    return "import torch\n" + line + "\n" + STEP


def _elif_chain(arms: int) -> str:
    return "x = 1\nif x == -1:\n    y = 0\n" + "".join(f"elif x == {i}:\n    y = {i}\n" for i in range(arms))


CASES = {
    "elif_3000.py": (_script(_elif_chain(3000)), "CPython cannot compile it"),
    # CPython compiles these (a fresh interpreter's limits), LibCST would take many seconds on each
    "attribute_chain.py": (_script("x = a" + ".b" * 1500), "too large to analyse"),
    "call_chain.py": (_script("x = f" + "()" * 1500), "too large to analyse"),
    "long_sum.py": (_script("x = " + " + ".join(["a"] * 1500)), "too large to analyse"),
    "deeper_sum.py": (_script("x = " + "+".join(["a"] * 5000)), "CPython cannot compile it"),
    "huge_literal.py": (_script("x = [" + ",".join(map(str, range(MAX_STATEMENT_NODES + 10_000))) + "]"),
                        "too large to analyse"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_reports_tc000_and_nothing_else(tmp_path, name):
    code, why = CASES[name]
    (tmp_path / name).write_text(code)
    rc, out, _ = run_cli("scan", name, "--isolated", "--no-exec", "--format", "concise", cwd=tmp_path)
    lines = [line for line in out.splitlines() if ": TC" in line]
    assert rc == 1 and len(lines) == 1 and " TC000 " in lines[0] and why in lines[0], out


@pytest.mark.parametrize("name", sorted(CASES))
def test_fix_apply_leaves_the_file_byte_for_byte(tmp_path, name):
    code, why = CASES[name]
    path = tmp_path / name
    path.write_bytes(code.encode())
    rc, _, err = run_cli("fix", name, "--apply", "--isolated", "--no-exec", cwd=tmp_path)
    assert rc == 1 and f"{name}: not fixed: {why}" in err  # its TC000 remains, as scan reports it
    assert path.read_bytes() == code.encode()


def test_a_chain_cpython_compiles_and_an_ordinary_long_line_are_analysed(tmp_path):
    assert beyond_analysis(_elif_chain(1200)) is None  # many arms, still compiled by CPython
    long_line = 'banner = "' + "=" * 5000 + '"'
    assert beyond_analysis(_script(long_line)) is None
    (tmp_path / "long_line.py").write_text(_script(long_line))
    rc, out, _ = run_cli("scan", "long_line.py", "--isolated", "--no-exec", "--format", "concise",
                         "--select", "TC202", cwd=tmp_path)
    assert rc == 1 and " TC202 " in out and "TC000" not in out


def test_the_screen_costs_nothing_for_ordinary_files():
    """No line over 2,000 characters and fewer than 1,000 ``elif``: not even parsed again."""
    assert beyond_analysis("import torch\n" * 10_000) is None
