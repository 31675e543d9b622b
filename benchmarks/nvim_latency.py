"""Editor latency in a real client: headless Neovim (0.7+) drives ``tcaudit server`` and, where it is
installed, ``ruff server``, on the same files, back to back (CPU; issue 50).

For each server and file: the first diagnostics after the client attaches; the median of ``--edits``
edits (each appends a comment line with ``nvim_buf_set_lines``, Neovim sends ``didChange`` with no
debounce, and the time runs until the ``publishDiagnostics`` of that buffer version arrives); and a
code action round trip at the first diagnostic with no ``only`` filter, as ``vim.lsp.buf.code_action()``
asks (tcaudit lists "Fix all safe" there, its edit made when the client resolves it).

    PYTHONPATH=. .venv/bin/python benchmarks/nvim_latency.py [--edits 10] [--ruff /tmp/ruffpkg/bin/ruff]
        [--repo CHECKOUT] [--servers tcaudit,ruff] [--out benchmarks/results/nvim_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

DRIVER = r'''
local out = {edits = {}}
local seen = {}
local function now() return vim.loop.hrtime() / 1e6 end
local function finish(status)
  out.status = status
  local f = io.open(vim.env.BENCH_RESULT, "w")
  f:write(vim.fn.json_encode(out))
  f:close()
  vim.cmd("qa!")
end
local default = vim.lsp.handlers["textDocument/publishDiagnostics"]
vim.lsp.handlers["textDocument/publishDiagnostics"] = function(err, result, ctx, config)
  table.insert(seen, {t = now(), version = result.version, n = #result.diagnostics,
                      first = result.diagnostics[1]})
  return default(err, result, ctx, config)
end
vim.cmd("edit " .. vim.env.BENCH_FILE)
vim.bo.filetype = "python"
local bufnr = vim.api.nvim_get_current_buf()
local cmd = vim.fn.json_decode(vim.env.BENCH_CMD)
local started = now()
local client_id = vim.lsp.start_client({name = "bench", cmd = cmd, root_dir = vim.fn.getcwd(),
                                        flags = {debounce_text_changes = 0}})
vim.lsp.buf_attach_client(bufnr, client_id)
if not vim.wait(120000, function() return #seen > 0 end, 1) then return finish("no diagnostics") end
out.first_ms = seen[1].t - started
out.diagnostics = seen[#seen].n
local edits = tonumber(vim.env.BENCH_EDITS)
for i = 1, edits do
  local count = #seen
  local t = now()
  vim.api.nvim_buf_set_lines(bufnr, -1, -1, false, {"# edit " .. i})
  local version = vim.lsp.util.buf_versions[bufnr]
  local ok = vim.wait(120000, function()
    for k = count + 1, #seen do
      if seen[k].version == nil or seen[k].version == version then return true end
    end
    return false
  end, 1)
  if not ok then return finish("no diagnostics after edit " .. i) end
  table.insert(out.edits, seen[#seen].t - t)
end
local target = seen[#seen].first
local range = target and target.range or {start = {line = 0, character = 0}, ["end"] = {line = 0, character = 1}}
local params = {textDocument = vim.lsp.util.make_text_document_params(bufnr), range = range,
                context = {diagnostics = target and {target} or {}}}
local t = now()
local responses = vim.lsp.buf_request_sync(bufnr, "textDocument/codeAction", params, 120000)
out.code_action_ms = now() - t
out.code_actions = 0
for _, response in pairs(responses or {}) do
  out.code_actions = out.code_actions + #(response.result or {})
end
finish("ok")
'''


def run(nvim: str, command: list[str], path: Path, edits: int, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="tcaudit-nvim-") as tmp:
        driver = Path(tmp) / "driver.lua"
        driver.write_text(DRIVER, encoding="utf-8")
        result = Path(tmp) / "result.json"
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "pyproject.toml").write_text("[tool.tcaudit]\nexec-models = false\n", encoding="utf-8")
        target = work / "train.py"
        shutil.copy(path, target)
        subprocess.run([nvim, "--headless", "--clean", "-n", "-c", f"luafile {driver}"], cwd=work, timeout=900,
                       env={**os.environ, **env, "BENCH_FILE": str(target), "BENCH_CMD": json.dumps(command),
                            "BENCH_EDITS": str(edits), "BENCH_RESULT": str(result)},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        data = json.loads(result.read_text()) if result.exists() else {"status": "no result"}
    times = sorted(data.get("edits") or [0.0])
    return {
        "status": data.get("status"),
        "lines": path.read_text(encoding="utf-8").count("\n"),
        "diagnostics": data.get("diagnostics"),
        "first_diagnostics_ms": round(data.get("first_ms", 0.0), 1),
        "after_edit_median_ms": round(statistics.median(times), 1),
        "after_edit_max_ms": round(times[-1], 1),
        "code_action_ms": round(data.get("code_action_ms", 0.0), 1),
        "code_actions": data.get("code_actions"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--nvim", default=shutil.which("nvim") or "nvim")
    parser.add_argument("--ruff", default=shutil.which("ruff") or "/tmp/ruffpkg/bin/ruff")
    parser.add_argument("--out", default=str(HERE / "results" / "nvim_latency.json"))
    parser.add_argument("--repo", default=str(REPO),
                        help="the checkout whose tcaudit the server runs (default this one: a before/after pair)")
    parser.add_argument("--servers", default="tcaudit,ruff", help="which servers, comma-separated")
    args = parser.parse_args()
    import fix_speed

    wanted = set(args.servers.split(","))
    servers = {"tcaudit": [sys.executable, "-m", "tcaudit", "server"]} if "tcaudit" in wanted else {}
    if "ruff" in wanted and Path(args.ruff).is_file():
        servers["ruff"] = [args.ruff, "server"]
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="tcaudit-nvim-files-") as tmp:
        big = fix_speed.two_thousand_line_file(Path(tmp))
        files = {"fixture": REPO / "fixtures" / "resnet50" / "train.py", "2k-line file": big}
        for file_name, path in files.items():
            for server, command in servers.items():
                rows[f"{server}, {file_name}"] = run(args.nvim, command, path, args.edits, {"PYTHONPATH": args.repo})
                print(server, file_name, rows[f"{server}, {file_name}"], file=sys.stderr, flush=True)
    version = subprocess.run([args.nvim, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    result = {
        "command": "benchmarks/nvim_latency.py " + " ".join(sys.argv[1:]),
        "tcaudit": args.repo,
        "timings": "CPU only: wall milliseconds in headless Neovim",
        "nvim": version,
        "ruff": subprocess.run([args.ruff, "--version"], capture_output=True, text=True).stdout.strip()
        if "ruff" in servers else None,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_average_at_end": os.getloadavg(),
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
