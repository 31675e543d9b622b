"""The scan's speed machinery must not change what it finds: worker processes (``--jobs``) and the
result cache give exactly the report a plain in-process scan gives, and the cache misses whenever
something a finding depends on changes. Also: a corrupted entry is a miss, concurrent scans share
one cache folder safely, a worker that dies costs only its own file, and bad input is a clear
message, not a traceback."""

from __future__ import annotations

import dataclasses

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, run_cli
from tcaudit import engine
from tcaudit.cache import CACHE_DIR_NAME, ScanCache
from tcaudit.config import Settings, load_settings
from tcaudit.engine import scan

AMP = textwrap.dedent(
    """
    import torch

    scaler = torch.cuda.amp.GradScaler()


    def train(model, loader, optimizer):
        model.cuda()
        for x, y in loader:
            optimizer.zero_grad()
            loss = model(x.cuda()).sum()
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            print(loss.item())
    """
).lstrip()


def torchvision_dir() -> Path | None:
    spec = importlib.util.find_spec("torchvision")  # finds it without importing torch
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """fixtures/ (every rule fires somewhere, TC000 included) plus part of torchvision (big
    library files, most of which no rule's trigger matches), in one folder."""
    root = tmp_path_factory.mktemp("corpus")
    shutil.copytree(FIXTURES, root / "fixtures")
    suppressed = root / "fixtures" / "suppressed"
    suppressed.mkdir()
    (suppressed / "line.py").write_text(AMP.replace("GradScaler()", "GradScaler()  # tcaudit: ignore[TC202]"))
    (suppressed / "file.py").write_text("# tcaudit: ignore-file[TC6]\n" + AMP)
    vision = torchvision_dir()
    if vision is not None:
        for part in ("transforms", "ops", "models/detection"):
            shutil.copytree(vision / part, root / "torchvision" / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def json_scan(cwd: Path, *args: str) -> tuple[int, str, str]:
    code, out, err = run_cli("scan", ".", "--format", "json", "--no-exec", "--isolated", *args, cwd=cwd)
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def test_jobs_and_cache_give_the_same_report(corpus, tmp_path):
    cache = tmp_path / "cache"
    reference = json_scan(corpus, "--jobs", "1", "--no-cache")
    assert reference[0] == 1
    assert len(json.loads(reference[1])["findings"]) > 50
    # Three cold scans (each computes every fix's edits for JSON): two worker processes filling the
    # default cache, one process filling a given cache folder; the warm scans read them either way.
    runs = {
        "--jobs 2, cold default cache": json_scan(corpus, "--jobs", "2"),
        "--jobs 2, warm default cache": json_scan(corpus, "--jobs", "2"),
        "--jobs 1, the default cache given as --cache-dir": json_scan(
            corpus, "--jobs", "1", "--cache-dir", str(corpus / CACHE_DIR_NAME)
        ),
        "--jobs 1, cold cache": json_scan(corpus, "--jobs", "1", "--cache-dir", str(cache)),
        "--jobs 2, warm cache": json_scan(corpus, "--jobs", "2", "--cache-dir", str(cache)),
        "default jobs, warm default cache": json_scan(corpus),
    }
    for name, run in runs.items():
        assert run == reference, name
    assert (corpus / CACHE_DIR_NAME).is_dir()  # the default: in the working folder without a config


def test_the_engine_answers_from_the_cache_and_parses_nothing_when_warm(corpus, tmp_path):
    settings = Settings(root=corpus)
    cache = ScanCache.open(tmp_path / "cache", settings, settings.enabled_rules())
    paths = [str(corpus / "fixtures")]
    plain = scan(paths, settings, model_audit=False)
    cold = scan(paths, settings, model_audit=False, jobs=2, cache=cache)
    warm = scan(paths, settings, model_audit=False, jobs=2, cache=cache)
    assert cold.files_cached == 0
    assert warm.files_cached == warm.files_scanned == plain.files_scanned
    assert warm.files_parsed == plain.files_parsed > 0
    for result in (cold, warm):
        assert [f.to_dict() for f in result.findings] == [f.to_dict() for f in plain.findings]
        assert result.suppressed == plain.suppressed > 0
        assert result.errors == []


def test_a_cache_entry_gives_back_the_exact_findings(tmp_path):
    """Details and fix plans hold tuples and nested lists; JSON alone would turn tuples into lists."""
    script = tmp_path / "train.py"
    script.write_text(AMP, encoding="utf-8")
    settings = Settings(root=tmp_path)
    rules = engine.instantiate_rules(settings)
    result = engine.scan_file(script, rules, settings, "train.py")
    assert {f.rule for f in result.findings} >= {"TC202", "TC205", "TC601"}
    cache = ScanCache.open(tmp_path / "cache", settings, settings.enabled_rules())
    key = cache.key(str(script), "train.py", script.read_bytes())
    assert cache.store(key, result.findings, result.parsed)
    loaded = cache.load(key)
    assert loaded is not None and loaded.parsed
    assert loaded.findings == result.findings

    def exact(finding):
        # Types too (tuples stay tuples in details); a fix plan comes back as its rendering, which
        # is all a cached finding needs (fix always analyses the file afresh).
        return repr(dataclasses.replace(finding, fix=None)), finding.fix and finding.fix.to_dict()

    assert [exact(f) for f in loaded.findings] == [exact(f) for f in result.findings]


def cached_scan(project: Path, *args: str) -> tuple[int, list[str], str]:
    code, out, err = run_cli("scan", ".", "--format", "concise", "--no-exec", *args, cwd=project)
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out.splitlines(), err


def entries(project: Path) -> list[Path]:
    return sorted((project / CACHE_DIR_NAME).glob("scan-v*/*/*.json"))


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.tcaudit]\n", encoding="utf-8")
    (tmp_path / "train.py").write_text(AMP, encoding="utf-8")
    (tmp_path / "other.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n", encoding="utf-8")
    return tmp_path


def test_the_cache_folder_is_marked_like_ruffs(project):
    cached_scan(project)
    folder = project / CACHE_DIR_NAME
    assert (folder / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    assert len(entries(project)) == 2
    assert not list(folder.rglob("*.tmp"))


def test_a_corrupted_entry_is_a_miss_and_is_rewritten(project):
    first = cached_scan(project)
    for damage in (b"", b"{not json", b'{"format": 1}', b"\x00\xff" * 40, b'{"format": 1, "key": "x"}'):
        for entry in entries(project):
            entry.write_bytes(damage)
        assert cached_scan(project) == first
        assert all(entry.read_bytes() != damage for entry in entries(project))


def test_an_entry_with_a_wrong_shape_is_a_miss(project):
    first = cached_scan(project)
    from tcaudit.cache import seal, unseal

    for entry in entries(project):
        data = json.loads(unseal(entry.read_bytes()))
        data["findings"] = [{"rule": "TC999"}]
        entry.write_bytes(seal(json.dumps(data).encode()))  # sealed with the right key, still a miss
    assert cached_scan(project) == first


def test_a_forged_entry_is_a_miss_and_is_rewritten(project):
    """An entry committed to the repository, or edited, with its findings emptied: without the user's
    key its seal does not check, so the scan analyses the file again (issue 31)."""
    from tcaudit.cache import unseal

    first = cached_scan(project)
    assert any(" TC205 " in line for line in first[1])
    for entry in entries(project):
        mac, _, payload = entry.read_bytes().partition(b"\n")
        data = json.loads(payload)
        data["findings"] = []
        entry.write_bytes(mac + b"\n" + json.dumps(data).encode())  # the old seal over a new body
    assert cached_scan(project) == first
    for entry in entries(project):
        assert json.loads(unseal(entry.read_bytes()))["findings"], "rewritten with the real findings"


def test_another_users_cache_is_a_miss(project, tmp_path, monkeypatch):
    from tcaudit import cache

    first = cached_scan(project)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
    assert cached_scan(project) == first  # every entry fails the new key's check: analysed again
    key = tmp_path / "someone-else" / "tcaudit" / "cache-key"
    assert key.is_file() and oct(key.stat().st_mode & 0o777) == "0o600"
    assert cache.unseal(next(iter(entries(project))).read_bytes()) is not None  # rewritten under the new key


def test_a_changed_file_misses(project):
    code, lines, _ = cached_scan(project)
    assert any(" TC205 " in line for line in lines)
    (project / "train.py").write_text(AMP.replace("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "pass"))
    code, lines, _ = cached_scan(project)
    assert not any(" TC205 " in line for line in lines)
    assert any(" TC202 " in line for line in lines)


def engine_scan(project: Path, settings: Settings, cache_dir: Path):
    cache = ScanCache.open(cache_dir, settings, settings.enabled_rules())
    return scan([str(project)], settings, model_audit=False, cache=cache)


def test_changed_settings_or_rules_miss_and_filters_still_apply(project, tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("cache")
    base = load_settings([str(project)], overrides={"exec-models": False})
    assert engine_scan(project, base, cache_dir).files_cached == 0
    assert engine_scan(project, base, cache_dir).files_cached == 2
    for overrides in ({"precision": "fp16"}, {"gpu": "sm_80"}, {"select": ["TC2"]}, {"ignore": ["TC601"]}):
        changed = load_settings([str(project)], overrides={"exec-models": False, **overrides})
        result = engine_scan(project, changed, cache_dir)
        assert result.files_cached == 0, overrides
        fresh = scan([str(project)], changed, model_audit=False)
        assert [f.to_dict() for f in result.findings] == [f.to_dict() for f in fresh.findings], overrides
    # Filters run after the cache, so changing them needs no miss and still takes effect.
    filtered = load_settings(
        [str(project)], overrides={"exec-models": False, "fail-on": "error", "exclude": ["nothing"]}
    )
    from dataclasses import replace

    filtered = replace(filtered, per_file_ignores=(("train.py", ("TC6",)),))
    result = engine_scan(project, filtered, cache_dir)
    assert result.files_cached == 2
    assert not [f for f in result.findings if f.rule.startswith("TC6")]
    assert result.suppressed >= 1


def test_a_suppression_comment_added_later_applies_to_a_cached_file(project):
    _, lines, _ = cached_scan(project)
    assert any(line.startswith("other.py:2:") and " TC202 " in line for line in lines)
    (project / "other.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()  # tcaudit: ignore[TC202]\n")
    _, lines, _ = cached_scan(project)
    assert not any(line.startswith("other.py") for line in lines)


def test_cache_dir_flag_config_key_and_no_cache(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    first = cached_scan(project, "--cache-dir", str(elsewhere / "c"))
    assert (elsewhere / "c" / "CACHEDIR.TAG").is_file()
    assert not (project / CACHE_DIR_NAME).exists()
    assert cached_scan(project, "--no-cache") == first
    assert not (project / CACHE_DIR_NAME).exists()
    (project / "pyproject.toml").write_text('[tool.tcaudit]\ncache-dir = "build/tcaudit"\n', encoding="utf-8")
    assert cached_scan(project) == first
    assert (project / "build" / "tcaudit" / "CACHEDIR.TAG").is_file()  # relative to the config file


def test_an_unusable_cache_dir_warns_and_scans_without_it(project):
    blocker = project / "a-file"
    blocker.write_text("not a folder\n")
    reference = cached_scan(project, "--no-cache")
    code, lines, err = cached_scan(project, "--cache-dir", str(blocker / "cache"))
    assert (code, lines) == reference[:2]
    assert err.startswith("tcaudit: warning: cannot use cache folder")
    assert "scanning without the cache" in err


@pytest.mark.parametrize(
    "args,message",
    [
        (("--jobs", "0"), "must be at least 1"),
        (("--jobs", "two"), "must be a whole number"),
    ],
)
def test_bad_jobs_is_a_usage_error(project, args, message):
    code, out, err = run_cli("scan", ".", *args, cwd=project)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_a_bad_cache_dir_key_is_a_config_error(project):
    (project / "pyproject.toml").write_text("[tool.tcaudit]\ncache-dir = 3\n", encoding="utf-8")
    code, out, err = run_cli("scan", ".", cwd=project)
    assert code == 2
    assert "'cache-dir' must be a folder path" in err


def test_concurrent_scans_share_one_cache_folder(corpus, tmp_path):
    cache = tmp_path / "shared-cache"
    command = [sys.executable, "-m", "tcaudit", "scan", "fixtures/scripts", "--format", "json", "--no-exec", "--isolated",
               "--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(command + ["--jobs", str(1 + n % 2)], cwd=corpus, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        for n in range(4)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    code, reference, _ = run_cli("scan", "fixtures/scripts", "--format", "json", "--no-exec", "--isolated", "--no-cache",
                                 cwd=corpus)
    assert code == 1
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 1, err.decode()
        assert b"Traceback" not in err and b"warning" not in err, err.decode()
        assert json.loads(out) == json.loads(reference)
    assert not list(cache.rglob("*.tmp"))
    warm = subprocess.run(command, cwd=corpus, env=env, capture_output=True, timeout=300)
    assert json.loads(warm.stdout) == json.loads(reference)


def test_a_worker_that_dies_costs_only_its_own_file(tmp_path, monkeypatch):
    for n in range(engine.PARALLEL_MIN_FILES + 4):
        (tmp_path / f"script_{n:02d}.py").write_text(AMP, encoding="utf-8")
    (tmp_path / "crash.py").write_text(AMP, encoding="utf-8")
    real_scan_file = engine.scan_file

    def dying_scan_file(path, *args, **kwargs):
        if path.name == "crash.py":
            os._exit(70)  # what a segfault in native code looks like to the pool
        return real_scan_file(path, *args, **kwargs)

    monkeypatch.setattr(engine, "scan_file", dying_scan_file)
    settings = Settings(root=tmp_path)
    result = scan([str(tmp_path)], settings, model_audit=False, jobs=2)
    monkeypatch.setattr(engine, "scan_file", real_scan_file)
    expected = scan([str(tmp_path / f"script_{n:02d}.py") for n in range(engine.PARALLEL_MIN_FILES + 4)],
                    settings, model_audit=False)
    assert [f.to_dict() for f in result.findings] == [f.to_dict() for f in expected.findings]
    assert len(result.errors) == 1
    assert "crash.py: internal error: the worker process scanning this file died" in result.errors[0]


def test_workers_started_with_spawn_find_the_same(corpus, monkeypatch):
    settings = Settings(root=corpus)
    paths = [str(corpus / "fixtures" / "scripts")]
    plain = scan(paths, settings, model_audit=False)
    monkeypatch.setattr(engine, "START_METHOD", "spawn")
    spawned = scan(paths, settings, model_audit=False, jobs=2)
    assert [f.to_dict() for f in spawned.findings] == [f.to_dict() for f in plain.findings]
    assert spawned.errors == []


WARM_PROBE = textwrap.dedent(
    """
    import json, sys
    from tcaudit.cli.main import main

    code = main(sys.argv[1:])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("libcst", "torch"))
    print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
    """
)


def test_a_warm_scan_loads_no_libcst(project):
    def probe() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", WARM_PROBE, "scan", ".", "--format", "concise", "--no-exec"],
            cwd=project, capture_output=True, text=True, timeout=300,
        )
        return json.loads(proc.stderr.strip().splitlines()[-1])

    cold = probe()
    assert cold["code"] == 1 and "libcst" in cold["heavy"]
    warm = probe()
    assert warm == {"code": 1, "heavy": []}


@pytest.mark.slow
def test_the_model_audit_runs_on_a_warm_cache_too(tmp_path):
    """TC1 findings depend on more than the file (the model code it imports, torch, the cost
    table), so they are never cached: a warm scan audits the model again and reports the same."""
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "models" / "mlp_4095.py", tmp_path / "mlp_4095.py")
    cold = run_cli("scan", "mlp_4095.py", "--format", "json", "--jobs", "2", cwd=tmp_path)
    warm = run_cli("scan", "mlp_4095.py", "--format", "json", "--jobs", "2", cwd=tmp_path)
    plain = run_cli("scan", "mlp_4095.py", "--format", "json", "--no-cache", cwd=tmp_path)
    assert any(f["rule"].startswith("TC1") for f in json.loads(plain[1])["findings"]), plain
    assert cold == warm == plain
    assert len(entries(tmp_path)) == 1
