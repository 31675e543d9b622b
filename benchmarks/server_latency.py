"""Diagnostics latency of ``tcaudit server`` after an edit (CPU machine; the script rules, no model audit):
the wall time from sending a ``didChange`` to receiving the ``publishDiagnostics`` of that version,
for the ResNet50 fixture and the 2,008-line file of ``fix_speed.py``; also the first diagnostics after
``didOpen`` (which import the rules) and a quick-fix ``codeAction`` (the fixes' edits).

    .venv/bin/python benchmarks/server_latency.py [--edits 30] [--repo CHECKOUT] [--out benchmarks/results/server_latency.json]

Each edit appends a comment line at the end (``--where end``, the default) or types a line into the
function in the middle of the file, after its ``def`` line: a statement ``note_N = N`` (``middle``), a
comment line (``comment``) or ``torch.cuda.synchronize()`` (``noticed``, a call the rules read). Each is
one keystroke's change; edits are sent one at a time, each after the previous one's diagnostics
arrived. Since issue 50 a document's scans are incremental (only the top-level statements an edit
changed are parsed, and inside one of them only the statements the edit touched in the innermost block
holding them; walks over the others are reused), and an edit no rule can notice (the comments:
tcaudit/source/inert.py) moves the last findings without analysing again; ``middle`` and ``noticed``
are analysed again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))


def edited(text: str, version: int, where: str) -> str:
    """The text after one more edit: a comment appended, or a statement typed into the middle function."""
    if where == "end":
        return text + f"# edit {version}\n"
    lines = text.split("\n")
    defs = [i for i, line in enumerate(lines) if line.startswith("def ")]
    at = defs[len(defs) // 2] + 1
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())] or "    "
    typed = {"middle": f"note_{version} = {version}", "comment": f"# note {version}",
             "noticed": f"torch.cuda.synchronize()  # {version}"}[where]
    lines.insert(at, f"{indent}{typed}")
    return "\n".join(lines)


def measure(client, path: Path, text: str, edits: int, where: str = "end") -> dict:
    uri = path.as_uri()
    start = time.perf_counter()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}})
    first = client.wait_for("textDocument/publishDiagnostics", lambda p: p["uri"] == uri and p.get("version") == 1)
    opened = time.perf_counter() - start
    times = []
    for version in range(2, edits + 2):
        text = edited(text, version, where)
        start = time.perf_counter()
        client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                 "contentChanges": [{"text": text}]})
        client.wait_for("textDocument/publishDiagnostics", lambda p, v=version: p["uri"] == uri and p.get("version") == v)
        times.append(time.perf_counter() - start)
    target = next((d for d in first["diagnostics"] if d["code"] == "TC201"), first["diagnostics"][0])
    start = time.perf_counter()
    actions = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": target["range"],
                                                         "context": {"diagnostics": [target], "only": ["quickfix"]}})
    action = time.perf_counter() - start
    times.sort()
    return {
        "lines": text.count("\n"),
        "diagnostics": len(first["diagnostics"]),
        "first_diagnostics_after_open_s": round(opened, 3),
        "after_edit_median_s": round(statistics.median(times), 3),
        "after_edit_p90_s": round(times[int(0.9 * (len(times) - 1))], 3),
        "after_edit_max_s": round(times[-1], 3),
        "code_action_s": round(action, 3),
        "code_actions": len(actions),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edits", type=int, default=30)
    parser.add_argument("--where", choices=("end", "middle", "comment", "noticed"), default="end",
                        help="what each edit types where: a comment at the end; in the middle function a new "
                             "variable, a comment line, or a call the rules read (a host sync)")
    parser.add_argument("--out", default=str(HERE / "results" / "server_latency.json"))
    parser.add_argument("--repo", default=str(REPO),
                        help="the checkout whose tcaudit the server runs (default this one: a before/after pair)")
    args = parser.parse_args()
    import fix_speed
    from lsp_client import LspClient

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n")
        (root / "big").mkdir()
        big = fix_speed.two_thousand_line_file(root / "big")
        fixture = root / "train.py"
        fixture.write_text((REPO / "fixtures" / "resnet50" / "train.py").read_text())
        client = LspClient(root, env={"PYTHONPATH": args.repo})
        try:
            client.initialize(root)
            for name, path in (("fixture", fixture), ("2k-line file", big)):
                rows[name] = measure(client, path, path.read_text(), args.edits, args.where)
                print(name, rows[name], flush=True)
        finally:
            client.close()
    result = {
        "command": "benchmarks/server_latency.py " + " ".join(sys.argv[1:]),
        "tcaudit": args.repo,
        "machine": f"CPU only: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "load_average_at_end": os.getloadavg(),
        "edits": args.edits,
        "where": args.where,
        "results": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
