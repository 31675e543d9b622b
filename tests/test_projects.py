"""Projects, not files (issue 46): the multi-file projects under ``fixtures/projects/`` report (or stay
silent) as their ``expect.toml`` says, scanned from their entry script and as a folder; a changed
imported module invalidates the cached result of the scripts that import it; a module imported by
several entry scripts is parsed once per scan; every related place is in the JSON, SARIF and text
reports; and each project still trains after ``tcaudit fix --apply`` (run before and after with the
oracle's shim: the same losses on the CPU)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROJECTS = FIXTURES / "projects"
NAMES = sorted(p.name for p in PROJECTS.iterdir() if (p / "expect.toml").is_file())


def expect(name: str) -> dict:
    return tomllib.loads((PROJECTS / name / "expect.toml").read_text(encoding="utf-8"))


def reported(folder: Path, target: str, rules: list[str], *extra: str) -> list[list]:
    code, out, err = run_cli("scan", target, "--no-exec", "--no-cache", "--isolated", "--format", "json",
                             "--select", ",".join(rules), *extra, cwd=folder)
    assert code in (0, 1), err
    found = []
    for f in json.loads(out)["findings"]:
        entry = [f["rule"], f["path"], f["line"]]
        if "cell" in f:
            entry.append(f["cell"])
        found.append(entry)
    return sorted(found)


@pytest.mark.parametrize("name", NAMES)
def test_the_entry_script_reports_what_its_project_holds(name):
    spec = expect(name)
    assert reported(PROJECTS / name, spec["entry"], spec["rules"]) == sorted(spec["entry_findings"])


@pytest.mark.parametrize("name", NAMES)
def test_the_folder_scan_reports_each_problem_where_the_code_is(name):
    spec = expect(name)
    assert reported(PROJECTS / name, ".", spec["rules"]) == sorted(spec["folder_findings"])


@pytest.mark.parametrize("name", NAMES)
def test_each_file_scanned_alone_reports_what_the_folder_scan_reports_there(name):
    """A helper scanned alone (the editor, a pre-commit run on the changed file) finds the training
    scripts that import it and reports what the folder scan reports at it."""
    spec = expect(name)
    by_file: dict[str, list] = {}
    for finding in spec["folder_findings"]:
        by_file.setdefault(finding[1], []).append(finding)
    for path, findings in sorted(by_file.items()):
        assert reported(PROJECTS / name, path, spec["rules"]) == sorted(findings), path


def test_a_scaler_live_on_an_older_gpu_is_reported_there():
    spec = expect("scaler_enabled")
    assert reported(PROJECTS / "scaler_enabled", "train.py", spec["rules"], "--gpu", "v100") == spec["v100_findings"]


def test_related_places_reach_every_report_format():
    folder = PROJECTS / "loss_helper"
    code, out, _ = run_cli("scan", "train.py", "--no-exec", "--no-cache", "--isolated", "--format", "json",
                           "--select", "TC601", cwd=folder)
    clip = next(f for f in json.loads(out)["findings"] if f["line"] == 30)
    assert clip["related"] == [{
        "path": "commons.py", "line": 12, "column": 23, "end_line": 12, "end_column": 40,
        "message": "`param_norm.item()` syncs every training step (in `clip_grad_value_`, called from the loop)",
    }]
    assert clip["message"] == ("`commons.clip_grad_value_(...)` syncs every training step: `param_norm.item()` per item "
                               "of `p in parameters`")
    code, out, _ = run_cli("scan", "train.py", "--no-exec", "--no-cache", "--isolated", "--format", "sarif",
                           "--select", "TC601", cwd=folder)
    results = json.loads(out)["runs"][0]["results"]
    places = [r["relatedLocations"][0]["physicalLocation"] for r in results]
    assert sorted((p["artifactLocation"]["uri"], p["region"]["startLine"]) for p in places) == [
        ("commons.py", 12), ("meters.py", 10), ("utils/loss.py", 11)]
    code, out, _ = run_cli("scan", "train.py", "--no-exec", "--no-cache", "--isolated", "--select", "TC601", cwd=folder)
    assert "see commons.py:12:23: `param_norm.item()` syncs" in out
    code, out, _ = run_cli("scan", "train.ipynb", "--no-exec", "--no-cache", "--isolated", "--format", "json",
                           "--select", "TC401", cwd=PROJECTS / "notebook_settings")
    [finding] = json.loads(out)["findings"]
    assert finding["message"] == "training DataLoader loads every batch in the main process: `num_workers = 0`"
    assert finding["related"] == [{"path": "train.ipynb", "cell": 3, "line": 2, "column": 1, "end_line": 2,
                                   "end_column": 1, "message": "where `num_workers` gets 0: `num_workers = 0`"}]
    assert "(train.ipynb:cell 3:2)" in finding["fix"]["reason"]


def test_the_lsp_diagnostic_carries_the_helper_as_related_information():
    from pygls.workspace import PositionCodec

    from tcaudit.findings import Finding, Location, Related, Severity
    from tcaudit.lsp.convert import diagnostic

    finding = Finding("TC601", "per-step-sync", Severity.WARNING, Location("train.py", 2, 1, 2, 10), "sync",
                      related=(Related(Location("utils/loss.py", 11, 18, 11, 30), "the sync", mirror=True),))
    result = diagnostic(finding, ["x", "compute_loss(a)"], PositionCodec(), "file:///p/train.py")
    [info] = result.related_information
    assert info.location.uri.endswith("/utils/loss.py") and info.location.range.start.line == 10
    assert info.message == "the sync"


def test_fix_declines_a_loader_built_in_another_module_with_the_reason():
    folder = PROJECTS / "loader_factory"
    code, out, _ = run_cli("scan", "train.py", "--no-exec", "--no-cache", "--isolated", "--format", "json",
                           "--select", "TC401,TC505", cwd=folder)
    findings = {f["rule"]: f for f in json.loads(out)["findings"]}
    assert "utils.py:29 (`get_data`), another module" in findings["TC401"]["fix"]["reason"]
    # --ddp: the script is converted and the module's training DataLoader sharded, in one run (issue 48).
    code, out, err = run_cli("fix", "train.py", "--ddp", "--no-exec", "--isolated", "--no-cache", "--select", "TC5",
                             cwd=folder)
    assert "--- a/utils.py" in out and "--- a/train.py" in out, err
    assert ("+    sampler = DistributedSampler(train_set, shuffle=True) if dist.is_available() and dist.is_initialized() "
            "else None\n+    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=sampler is None, "
            "sampler=sampler)\n") in out
    assert '+        if hasattr(train_loader.sampler, "set_epoch"):\n+            train_loader.sampler.set_epoch(epoch)\n' in out
    assert "val_loader = DataLoader(val_set" in out and "sampler=DistributedSampler(val_set" not in out


def test_fix_edits_the_module_that_builds_the_loader(tmp_path):
    folder = _copy("loader_factory", tmp_path)
    code, out, err = run_cli("fix", ".", "--no-exec", "--isolated", "--no-cache", "--select", "TC401,TC402", cwd=folder)
    assert code == 1, err
    assert "--- a/utils.py" in out and "--- a/train.py" not in out
    assert ("+    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, "
            "num_workers=min(16, os.cpu_count() or 1), pin_memory=True)") in out
    assert "+import os" in out
    assert "train.py:20: TC401 no fix: the DataLoader is built in utils.py:29 (`get_data`)" in err
    code, out, err = run_cli("fix", ".", "--apply", "--no-exec", "--isolated", "--no-cache", "--select", "TC401,TC402",
                             cwd=folder)
    assert code == 0, err
    assert reported(folder, ".", ["TC401", "TC402"]) == []  # converged, from both sides
    # The helper alone (a pre-commit run on the changed file) finds the scripts that train with it.
    (folder / "utils.py").write_text((PROJECTS / "loader_factory" / "utils.py").read_text(), encoding="utf-8")
    assert reported(folder, "utils.py", ["TC401", "TC402"]) == [["TC401", "utils.py", 29], ["TC402", "utils.py", 29]]


# A second script training with utils.get_data's DataLoader, at module level (no ``__main__`` guard).
QUICK = ("import torch\nimport utils\n\n\nclass A:\n    batch_size = 4\n\n\n"
         "model = torch.nn.Linear(3, 4).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "train_loader, _ = utils.get_data(A)\nfor x, y in train_loader:\n"
         "    loss = model(x.cuda().mean((2, 3))).sum()\n    loss.backward()\n    opt.step()\n")


def test_a_helper_shared_with_a_script_without_a_main_guard_keeps_its_loader(tmp_path):
    folder = _copy("loader_factory", tmp_path)
    (folder / "quick.py").write_text(QUICK, encoding="utf-8")
    code, out, err = run_cli("scan", "utils.py", "--no-exec", "--no-cache", "--isolated", "--format", "json",
                             "--select", "TC401", cwd=folder)
    [finding] = json.loads(out)["findings"]
    assert not finding["fix"]["available"]
    assert "quick.py trains with this DataLoader without an `if __name__" in finding["fix"]["reason"]
    assert sorted(r["path"] for r in finding["related"]) == ["quick.py", "train.py"]


def test_fixing_the_script_edits_the_module_that_builds_its_loader(tmp_path):
    folder = _copy("loader_factory", tmp_path)
    code, out, err = run_cli("fix", "train.py", "--no-exec", "--isolated", "--no-cache", "--select", "TC401,TC402",
                             cwd=folder)
    assert code == 1, err
    # One diff per file: the script has nothing to change for these rules, its helper module does.
    assert "--- a/utils.py" in out and "--- a/train.py" not in out
    assert "+    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=" in out
    assert "no fix" not in err  # the fix the script's findings decline is made, in utils.py
    assert "1 file would change" in err
    code, out, err = run_cli("fix", "train.py", "--apply", "--no-exec", "--isolated", "--no-cache",
                             "--select", "TC401,TC402", cwd=folder)
    assert code == 0, err
    assert "fixed utils.py (TC401, TC402)" in err
    assert reported(folder, "train.py", ["TC401", "TC402"]) == []
    assert reported(folder, "utils.py", ["TC401", "TC402"]) == []


def test_a_script_and_its_helper_module_are_written_all_or_none(tmp_path):
    folder = _copy("loader_factory", tmp_path)
    before = {name: (folder / name).read_bytes() for name in ("train.py", "utils.py")}
    (folder / "utils.py").chmod(0o444)
    try:
        code, out, err = run_cli("fix", "train.py", "--apply", "--no-exec", "--isolated", "--no-cache", cwd=folder)
    finally:
        (folder / "utils.py").chmod(0o644)
    assert code == 2, err
    # train.py is written first and put back when utils.py cannot be: the same bytes as before.
    assert "utils.py: not fixed (nor train.py: all or none): the file is read-only" in err
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert not [p.name for p in folder.iterdir() if p.name.endswith((".tcaudit-tmp", ".tcaudit-backup"))]


def test_a_shared_helper_that_cannot_be_fixed_says_why_when_the_script_is_fixed(tmp_path):
    folder = _copy("loader_factory", tmp_path)
    (folder / "quick.py").write_text(QUICK, encoding="utf-8")
    code, out, err = run_cli("fix", "train.py", "--no-exec", "--isolated", "--no-cache", "--select", "TC401",
                             cwd=folder)
    assert code == 0 and out == "", err
    assert ("utils.py:29: TC401 no fix: quick.py trains with this DataLoader without an "
            "`if __name__ == \"__main__\":` guard") in err, err
    assert "train.py:20: TC401 no fix: the DataLoader is built in utils.py:29 (`get_data`)" in err


def test_fix_ddp_says_for_every_file_what_it_converted_or_why_not():
    """issue 48: a user who asks for --ddp is always told, file by file."""
    code, out, err = run_cli("fix", ".", "--ddp", "--no-exec", "--isolated", "--no-cache", "--select", "TC5",
                             cwd=PROJECTS / "loader_factory")
    assert "train.py: --ddp: converted (TC505)" in err, err
    # The module whose DataLoader the script trains with gets its DistributedSampler.
    assert "utils.py: --ddp: completed for the scripts that use it (TC503)" in err, err
    code, out, err = run_cli("fix", ".", "--ddp", "--no-exec", "--isolated", "--no-cache", "--select", "TC5",
                             cwd=PROJECTS / "trainer_package")
    assert ("src/detector/losses.py: --ddp: not converted: no single-process CUDA training loop found here "
            "(TC505 and TC501 report none)") in err, err
    code, out, err = run_cli("fix", ".", "--ddp", "--no-exec", "--isolated", "--no-cache", "--select", "TC5",
                             cwd=PROJECTS / "argparse_defaults")
    assert "train.py: --ddp: converted (TC505)" in err, err
    code, out, err = run_cli("fix", ".", "--no-exec", "--isolated", "--no-cache", "--select", "TC5",
                             cwd=PROJECTS / "argparse_defaults")
    assert "--ddp" not in err  # not asked for: nothing said about it


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(PROJECTS / name, target)
    return target


def test_a_changed_imported_module_invalidates_the_cached_result(tmp_path):
    folder = _copy("loss_helper", tmp_path)
    cache = tmp_path / "cache"

    def scan() -> list:
        code, out, err = run_cli("scan", "train.py", "--no-exec", "--isolated", "--cache-dir", str(cache),
                                 "--format", "json", "--select", "TC601", cwd=folder)
        return sorted(f["line"] for f in json.loads(out)["findings"])

    assert scan() == [28, 30, 33]
    assert scan() == [28, 30, 33]  # answered from the cache
    loss = folder / "utils" / "loss.py"
    loss.write_text(loss.read_text().replace(".detach().cpu()", ".detach()"), encoding="utf-8")
    assert scan() == [30, 33]
    commons = folder / "commons.py"
    commons.write_text(commons.read_text().replace("param_norm.item()", "float(0)"), encoding="utf-8")
    assert scan() == [33]


def test_a_helper_scanned_alone_is_scanned_again_when_a_script_that_imports_it_changes(tmp_path):
    folder = _copy("loss_helper", tmp_path)
    cache = tmp_path / "cache"

    def scan(target: str) -> list:
        code, out, err = run_cli("scan", target, "--no-exec", "--isolated", "--cache-dir", str(cache),
                                 "--format", "json", "--select", "TC601", cwd=folder)
        return sorted(f["line"] for f in json.loads(out)["findings"])

    assert scan("commons.py") == [12]
    assert scan("commons.py") == [12]  # answered from the cache
    train = folder / "train.py"
    # The clipping helper now runs once per epoch, not every step: commons.py's own text did not change.
    text = train.read_text()
    step = next(line for line in text.splitlines() if "clip_grad_value_(" in line)
    train.write_text(text.replace(step + "\n", ""), encoding="utf-8")
    assert scan("commons.py") == []


def test_a_module_imported_by_several_entry_scripts_is_parsed_once(tmp_path):
    from tcaudit import api
    from tcaudit.project.modules import forget_modules, parse_counts

    folder = _copy("config_module", tmp_path)
    forget_modules()
    settings = api.load([folder], isolated=True)
    result = api.scan([folder / "train_a.py", folder / "train_b.py"], settings=settings, model_audit=False)
    assert sorted(f.location.line for f in result if f.rule == "TC401") == [12, 14]
    counts = parse_counts()
    assert counts["parsed"] <= 2, counts  # config.py (and data.py at most), once for both scripts


def test_imports_that_leave_the_project_are_not_followed(tmp_path):
    from tcaudit.project.imports import dependencies, module_file, search_roots

    (tmp_path / "pyproject.toml").write_text("[project]\nname='p'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .core import f\n")
    (tmp_path / "pkg" / "core.py").write_text("import torch\nfrom . import helpers\ndef f():\n    pass\n")
    (tmp_path / "pkg" / "helpers.py").write_text("")
    venv = tmp_path / ".venv" / "lib" / "site-packages"
    venv.mkdir(parents=True)
    (venv / "torch.py").write_text("")
    entry = tmp_path / "train.py"
    entry.write_text("import pkg\nimport torch\n")
    roots = search_roots(entry, None)
    assert roots[0] == tmp_path.resolve()
    assert module_file(roots, entry, "torch") is None
    assert module_file(roots, tmp_path / "pkg" / "core.py", ".helpers") == (tmp_path / "pkg" / "helpers.py").resolve()
    deps = dependencies(entry, entry.read_text(), None)
    assert [p.name for p in deps.files] == ["__init__.py", "core.py", "helpers.py"]


def test_values_are_judged_by_what_they_hold(tmp_path, monkeypatch):
    from tcaudit.project.symbols import project_of
    from tcaudit.project.values import Values
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import read_source

    (tmp_path / "settings.py").write_text("WORKERS = 0\nDTYPE = 'bfloat16'\n")
    entry = tmp_path / "train.py"
    entry.write_text(
        "import argparse\nimport torch\nfrom settings import WORKERS, DTYPE\n"
        "p = argparse.ArgumentParser()\np.add_argument('--workers', type=int, default=0)\n"
        "p.add_argument('--seed', type=int, required=True)\nargs = p.parse_args()\n"
        "a = WORKERS\nb = args.workers\nc = args.seed\nd = DTYPE == 'float16'\n"
        "e = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'\nf = e == 'float16'\ng = len(args)\n"
    )
    monkeypatch.chdir(tmp_path)
    facts = ScriptFacts(read_source(entry, "train.py"))
    values = Values(project_of(facts, tmp_path), {"torch.cuda.is_bf16_supported": True})

    def of(name):
        found = values.of(facts, facts.bindings_of(name)[0].value)
        return None if found is None else [(v.value, v.how, v.on_command_line) for v in found]

    assert of("a") == [(0, "`WORKERS` is 0 in settings.py", False)]
    assert of("b") == [(0, "`--workers` defaults to 0", True)]
    assert values.of(facts, facts.bindings_of("b")[0].value)[0].said == "`--workers` defaults to 0 (train.py:5)"
    assert of("c") is None  # required: the user chooses it
    assert of("d") == [(False, "`DTYPE` is 'bfloat16' in settings.py", False)]
    assert [v for v, _, _ in of("f")] == [False]
    assert of("g") is None


# -- each project still trains after the fix ----------------------------------------------------------

def _runnable(folder: Path, entry: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The entry's text (a notebook's code cells, joined) and the project's other Python and YAML files."""
    if entry.endswith(".ipynb"):
        cells = json.loads((folder / entry).read_text(encoding="utf-8"))["cells"]
        text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code") + "\n"
    else:
        text = (folder / entry).read_text(encoding="utf-8")
    files = tuple(
        (p.relative_to(folder).as_posix(), p.read_text(encoding="utf-8"))
        for p in sorted(folder.rglob("*")) if p.suffix in (".py", ".yaml") and p.relative_to(folder).as_posix() != entry
    )
    return text, files


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).parent))
    from oracle.harness import ScriptRun, run_scripts

    workdir = tmp_path_factory.mktemp("projects")
    runs = []
    for name in NAMES:
        spec = expect(name)
        folder = workdir / "patched" / name
        shutil.copytree(PROJECTS / name, folder)
        promised = _promised(folder)
        code, out, err = run_cli("fix", ".", "--apply", "--no-exec", "--isolated", "--no-cache", cwd=folder)
        assert code in (0, 1), err
        applied = _applied(err)
        before = _contents(folder)
        code, out, again = run_cli("fix", ".", "--apply", "--no-exec", "--isolated", "--no-cache", cwd=folder)
        FIXED[name] = {"promised": promised, "applied": applied, "again": _applied(again),
                       "unchanged": _contents(folder) == before, "after": _reported_rules(folder)}
        for label, source in (("original", PROJECTS / name), ("patched", folder)):
            text, files = _runnable(source, spec["entry"])
            path = ("src",) if (source / "src").is_dir() else ()
            runs.append(ScriptRun(f"{name}-{label}", text, files=files, path=path, timeout=300))
    return run_scripts(runs, workdir / "runs", mode="cpu")


# What fix did to each project (filled by ``trained``): what scan promised, what fix applied, what a
# second fix applied and whether it changed a byte, and what a scan of the fixed project reports.
FIXED: dict[str, dict] = {}


def _promised(folder: Path) -> dict[str, set[str]]:
    """By file: the rules whose fix scan says plain ``tcaudit fix`` makes."""
    code, out, err = run_cli("scan", ".", "--no-exec", "--isolated", "--no-cache", "--format", "json", cwd=folder)
    assert code in (0, 1), err
    promised: dict[str, set[str]] = {}
    for finding in json.loads(out)["findings"]:
        fix = finding["fix"]
        if fix and fix["available"] and fix["class"] != "structural" and not fix.get("option"):
            promised.setdefault(finding["path"], set()).add(finding["rule"])
    return promised


def _applied(err: str) -> dict[str, set[str]]:
    """By file: the rules ``fix --apply`` reports it applied (``fixed utils.py (TC401, TC402)``)."""
    out: dict[str, set[str]] = {}
    for match in re.finditer(r"^fixed (\S+) \(([^)]*)\)$", err, re.MULTILINE):
        out[match.group(1)] = set(match.group(2).split(", "))
    return out


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _reported_rules(folder: Path) -> dict[str, set[str]]:
    code, out, err = run_cli("scan", ".", "--no-exec", "--isolated", "--no-cache", "--format", "json", cwd=folder)
    assert code in (0, 1), err
    found: dict[str, set[str]] = {}
    for finding in json.loads(out)["findings"]:
        found.setdefault(finding["path"], set()).add(finding["rule"])
    return found


@pytest.mark.parametrize("name", NAMES)
def test_fix_makes_what_scan_promised_once_and_the_fixed_project_reports_none_of_it(trained, name):
    fixed = FIXED[name]
    assert fixed["applied"] == fixed["promised"]
    assert fixed["again"] == {} and fixed["unchanged"], fixed["again"]
    for path, rules in fixed["applied"].items():
        assert not rules & fixed["after"].get(path, set()), (path, rules & fixed["after"].get(path, set()))


@pytest.mark.parametrize("name", NAMES)
def test_each_project_trains_the_same_after_the_fix(trained, name):
    from oracle.harness import max_relative_difference

    original, patched = trained[f"{name}-original"], trained[f"{name}-patched"]
    assert original.rc == 0, original.explain()
    assert patched.rc == 0, patched.explain()
    assert original.losses, original.explain()
    assert len(patched.losses) == len(original.losses), (original.losses, patched.losses)
    rtol = expect(name).get("oracle", {}).get("rtol", 1e-4)
    assert max_relative_difference(original.losses, patched.losses) <= rtol, (original.losses, patched.losses)


def test_omegaconf_and_hydra_values_are_read_from_their_configs(tmp_path, monkeypatch):
    from tcaudit.project.symbols import project_of
    from tcaudit.project.values import Values
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import read_source

    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text(
        "defaults:\n  - data: images\n  - _self_\nlr: 0.1\nmissing: ???\nref: ${lr}\ndata:\n  size: 64\n",
        encoding="utf-8")
    (tmp_path / "conf" / "data" / "images.yaml").write_text("size: 32\nworkers: 0\n", encoding="utf-8")
    (tmp_path / "base.yaml").write_text("train:\n  workers: 0\n  nested: {a: 1}\n", encoding="utf-8")
    entry = tmp_path / "train.py"
    entry.write_text(
        "import hydra\nfrom omegaconf import OmegaConf\nfrom dataclasses import dataclass\n\n\n"
        "@dataclass\nclass Cfg:\n    workers: int = 0\n\n\n"
        "loaded = OmegaConf.load('base.yaml')\n"
        "made = OmegaConf.create({'train': {'workers': 0, 'n': 'x'}})\n"
        "typed = OmegaConf.structured(Cfg)\n"
        "a = loaded.train.workers\nb = made.train.workers\nc = typed.workers\nd = loaded.train.nested\n\n\n"
        "@hydra.main(version_base=None, config_path='conf', config_name='config')\n"
        "def main(cfg):\n    e = cfg.data.workers\n    f = cfg.data.size\n    g = cfg.missing\n    h = cfg.ref\n"
        "    return e, f, g, h\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    facts = ScriptFacts(read_source(entry, "train.py"))
    values = Values(project_of(facts, tmp_path))
    [main] = facts.functions_by_name["main"]

    def of(name, fn=None):
        binding = [b for b in facts.bindings_of(name) if b.ctx.function is fn][0]
        found = values.of(facts, binding.value, fn)
        return None if found is None else [(v.value, v.said, v.on_command_line) for v in found]

    assert of("a") == [(0, "`train.workers` is 0 in the YAML config (base.yaml:2)", False)]
    assert of("b") == [(0, "`train.workers` is 0 in the config (train.py:12)", False)]
    assert of("c") == [(0, "`Cfg.workers` defaults to 0 (train.py:8)", False)]
    assert of("d") is None  # a mapping, not a value
    # Hydra: the group file the defaults list picks; the primary file's own key first; never ??? or ${...}
    assert of("e", main) == [(0, "`data.workers` is 0 in the Hydra config (conf/data/images.yaml:2)", True)]
    assert of("f", main) == [(64, "`data.size` is 64 in the Hydra config (conf/config.yaml:8)", True)]
    assert of("g", main) is None and of("h", main) is None
    # An override a launch script passes is the user's choice.
    (tmp_path / "run.sh").write_text("python train.py data.workers=8 lr=0.2\n", encoding="utf-8")
    assert Values(project_of(facts, tmp_path)).of(facts, facts.bindings_of("e")[0].value, main) is None


def test_click_and_tyro_defaults_are_command_line_defaults(tmp_path, monkeypatch):
    from tcaudit.project.symbols import project_of
    from tcaudit.project.values import Values
    from tcaudit.script.facts import ScriptFacts
    from tcaudit.source.parsing import read_source

    entry = tmp_path / "train.py"
    entry.write_text(
        "import click\nimport tyro\nfrom dataclasses import dataclass\n\n@dataclass\nclass Cfg:\n    workers: int = 0\n\n"
        "@click.command()\n@click.option('--workers', default=0, type=int)\n@click.option('--seed', required=True)\n"
        "def main(workers, seed):\n    a = workers\n    b = tyro.cli(Cfg).workers\n    cfg = tyro.cli(Cfg)\n"
        "    c = cfg.workers\n    d = seed\n"
    )
    monkeypatch.chdir(tmp_path)
    facts = ScriptFacts(read_source(entry, "train.py"))
    values = Values(project_of(facts, tmp_path))

    def of(name):
        binding = facts.bindings_of(name)[0]
        found = values.of(facts, binding.value, binding.ctx.function)
        return None if found is None else [(v.value, v.how, v.on_command_line) for v in found]

    assert of("a") == [(0, "`--workers` defaults to 0", True)]
    assert of("c") == [(0, "`Cfg.workers` defaults to 0", True)]
    assert of("d") is None
    (tmp_path / "launch.sh").write_text("python train.py --workers 4\n")
    assert Values(project_of(facts, tmp_path)).of(facts, facts.bindings_of("a")[0].value,
                                                  facts.bindings_of("a")[0].ctx.function) is None


def test_a_trainer_module_gets_the_launch_bound_verdict_of_the_model_scripts_hand_it():
    """src/detector/engine.py trains what train.py builds (a 16-32-4 MLP at batch 8, which the audit
    measures as launch-bound): its TF32 advice is info there too, as it is in train.py."""
    code, out, err = run_cli("scan", ".", "--no-cache", "--isolated", "--gpu", "sm_90", "--format", "json",
                             cwd=PROJECTS / "trainer_package")  # the TC1 rules on: the model audit runs
    assert code in (0, 1), err
    [finding] = [f for f in json.loads(out)["findings"] if f["path"] == "src/detector/engine.py" and f["rule"] == "TC301"]
    assert finding["severity"] == "info" and "launch-bound" in finding["message"]


def test_the_walk_for_a_helpers_scripts_reads_only_regular_project_files(tmp_path):
    """A scan of a helper looks for the project's scripts that import it: a FIFO or a symlink named
    ``*.py``, or tcaudit's own private folders (``tcaudit-model-*``, which the model's sandbox writes),
    are never opened; the scan ends and reports what it reports without them."""
    import os
    import subprocess

    folder = _copy("loader_factory", tmp_path)
    os.mkfifo(folder / "pipe.py")
    secret = tmp_path / "secret.txt"
    secret.write_text("import torch\nloss.backward()\n", encoding="utf-8")
    (folder / "link.py").symlink_to(secret)
    private = folder / "tcaudit-model-abc"
    private.mkdir()
    os.mkfifo(private / "planted.py")
    (private / "train_copy.py").write_text((folder / "train.py").read_text(), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "tcaudit", "scan", "utils.py", "--no-exec", "--no-cache", "--isolated",
                           "--format", "json", "--select", "TC401"], cwd=folder, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    [finding] = json.loads(proc.stdout)["findings"]
    assert [r["path"] for r in finding["related"]] == ["train.py"]  # not the copy in the private folder


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each project after ``tcaudit fix . --ddp --apply``: converted ones started as two ranks."""
    sys.path.insert(0, str(Path(__file__).parent))
    from oracle.harness import ScriptRun, run_scripts

    workdir = tmp_path_factory.mktemp("ddp")
    outcome: dict[str, tuple[dict[str, set[str]], str]] = {}
    runs = []
    for name in NAMES:
        spec = expect(name)
        folder = workdir / "patched" / name
        shutil.copytree(PROJECTS / name, folder)
        code, out, err = run_cli("fix", ".", "--ddp", "--apply", "--no-exec", "--isolated", "--no-cache", cwd=folder)
        assert code in (0, 1), err
        outcome[name] = (_applied(err), err)
        if "TC505" in _applied(err).get(spec["entry"], set()):
            text, files = _runnable(folder, spec["entry"])
            path = ("src",) if (folder / "src").is_dir() else ()
            runs.append(ScriptRun(name, text, files=files, path=path, timeout=300, world_size=2,
                                  env=(("TCAUDIT_ORACLE_STEPS", "1"),)))
    return outcome, run_scripts(runs, workdir / "runs", mode="cpu") if runs else {}, workdir / "runs"


@pytest.mark.parametrize("name", NAMES)
def test_a_ddp_patch_trains_two_ranks_on_their_own_data_or_says_why_not(ranks, name):
    outcome, runs, folders = ranks
    applied, err = outcome[name]
    entry = expect(name)["entry"]
    if "TC505" not in applied.get(entry, set()):
        # Not converted: the decline says why, or the entry's line says no single-process CUDA loop was found.
        assert re.search(rf"TC505 no fix: \S|^{re.escape(entry)}: --ddp: not converted: \S", err, re.MULTILINE), err
        return
    run = runs[name]
    assert run.rc == 0, run.explain()
    assert sorted(run.by_rank) == [0, 1] and run.by_rank[0] and run.by_rank[1], run.explain()
    assert run.by_rank[0] != run.by_rank[1], f"both ranks computed {run.by_rank[0]}"
    # One model: after every optimizer step both ranks hold the same parameters (DDP averaged the gradients).
    records = {record["rank"]: record["steps"] for record in (
        json.loads(p.read_text()) for p in (folders / name / "oracle").glob("losses-*.json")) if record["rank"] is not None}
    assert sorted(records) == [0, 1] and records[0] and len(records[0]) == len(records[1]), records
    for step, (mine, theirs) in enumerate(zip(records[0], records[1])):
        assert abs(mine[1] - theirs[1]) <= 1e-6 * max(1.0, abs(mine[1])), (step, mine, theirs)
    # The checkpoints (rank 0's) load without a process group: `model.module`'s state, no DDP object.
    checkpoints = sorted((folders / name).glob("*.pt"))
    assert checkpoints or name != "ddp_tutorial", "the tutorial saves checkpoint.pt every epoch"
    for checkpoint in checkpoints:
        import torch

        assert torch.load(checkpoint, weights_only=True), checkpoint
