"""``[tool.tcaudit]``: found upward from the scanned path, prefixes, per-file-ignores, exclude,
fail-on, and command-line flags that win over the file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from tcaudit.config import ConfigError, Settings, load_settings

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
BROKEN = "def f(:\n"


def make(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
    return root


def flagged(cwd: Path, *args: str) -> tuple[int, set[tuple[str, str]]]:
    """Exit code and {(path, rule)} of a concise scan."""
    code, out, err = run_cli("scan", *args, "--format", "concise", cwd=cwd)
    assert code in (0, 1), err
    return code, {(line.split(":")[0], line.split()[1]) for line in out.splitlines()}


def test_config_is_found_upward_from_the_scanned_path(tmp_path):
    make(
        tmp_path,
        {
            "proj/pyproject.toml": '[tool.tcaudit]\nselect = ["TC000"]\n',
            # A pyproject.toml without [tool.tcaudit] on the way up is skipped.
            "proj/src/pyproject.toml": '[project]\nname = "inner"\n',
            "proj/src/deep/bad.py": BAD,
            "proj/src/deep/broken.py": BROKEN,
        },
    )
    # Run from outside the project: the config is found from the path, not from the working folder.
    assert flagged(tmp_path, "proj/src/deep")[1] == {("proj/src/deep/broken.py", "TC000")}
    assert flagged(tmp_path, "proj/src/deep/bad.py")[1] == set()
    isolated = flagged(tmp_path, "proj/src/deep/bad.py", "--isolated", "--select", "TC000,TC202")
    assert isolated[1] == {("proj/src/deep/bad.py", "TC202")}


def test_load_settings_records_the_config_and_its_folder(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nignore = ["TC2"]\n', "a/b/train.py": "x = 1\n"})
    settings = load_settings([str(tmp_path / "a" / "b" / "train.py")])
    assert settings.config_path == tmp_path / "pyproject.toml"
    assert settings.root == tmp_path
    assert settings.ignore == ("TC2",)


def test_prefix_selection():
    all_rules = Settings().enabled_rules()
    tc2 = Settings(select=("TC2",)).enabled_rules()
    assert tc2 and all(rule.startswith("TC2") for rule in tc2)
    assert "TC202" in tc2 and "TC000" not in tc2
    assert Settings(select=("TC0",), extend_select=("TC202",)).enabled_rules() == ["TC000", "TC001", "TC202"]
    assert "TC202" not in Settings(ignore=("TC20",)).enabled_rules()
    assert set(Settings(ignore=("TC2",)).enabled_rules()) == set(all_rules) - set(tc2)
    assert Settings(select=("tc202",)).enabled_rules() == ["TC202"]


def test_select_extend_select_and_ignore_from_the_file(tmp_path):
    make(tmp_path, {"bad.py": BAD, "broken.py": BROKEN})
    files = {("bad.py", "TC202"), ("broken.py", "TC000")}
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC0"]\n', encoding="utf-8")
    assert flagged(tmp_path, ".")[1] == {("broken.py", "TC000")}
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tcaudit]\nselect = ["TC0"]\nextend-select = ["TC202"]\n', encoding="utf-8"
    )
    assert flagged(tmp_path, ".")[1] == files
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tcaudit]\nselect = ["TC0", "TC202"]\nignore = ["TC2"]\n', encoding="utf-8"
    )
    assert flagged(tmp_path, ".")[1] == {("broken.py", "TC000")}


def test_per_file_ignores(tmp_path):
    make(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.tcaudit]
                select = ["TC000", "TC202"]

                [tool.tcaudit.per-file-ignores]
                "tests/*" = ["TC2"]
                "legacy_*.py" = ["TC202", "TC000"]
            """,
            "src/train.py": BAD,
            "tests/test_train.py": BAD,
            "src/legacy_train.py": BAD + BROKEN,
        },
    )
    assert flagged(tmp_path, ".")[1] == {("src/train.py", "TC202")}
    # Patterns are relative to the config's folder, whatever the working folder is.
    assert flagged(tmp_path / "tests", ".")[1] == set()


def test_exclude(tmp_path):
    make(
        tmp_path,
        {
            "pyproject.toml": '[tool.tcaudit]\nselect = ["TC202"]\nexclude = ["third_party", "*_pb2.py"]\n',
            "train.py": BAD,
            "third_party/lib/vendored.py": BAD,
            "proto/model_pb2.py": BAD,
            "proto/model.py": BAD,
        },
    )
    assert flagged(tmp_path, ".")[1] == {("train.py", "TC202"), ("proto/model.py", "TC202")}
    # A file named on the command line is scanned anyway (ruff's rule) ...
    assert flagged(tmp_path, "third_party/lib/vendored.py")[1] == {("third_party/lib/vendored.py", "TC202")}
    # ... and so is a folder named explicitly ...
    assert flagged(tmp_path, "third_party")[1] == {("third_party/lib/vendored.py", "TC202")}
    # ... unless --force-exclude, which the pre-commit hook passes.
    assert flagged(tmp_path, "third_party/lib/vendored.py", "train.py", "--force-exclude")[1] == {
        ("train.py", "TC202")
    }
    # --exclude replaces the file's list, like every other flag.
    assert flagged(tmp_path, ".", "--exclude", "train.py")[1] == {
        ("third_party/lib/vendored.py", "TC202"),
        ("proto/model.py", "TC202"),
        ("proto/model_pb2.py", "TC202"),
    }


def test_fail_on_from_the_file_and_the_flag_that_wins(tmp_path):
    make(tmp_path, {"pyproject.toml": '[tool.tcaudit]\nselect = ["TC202"]\nfail-on = "error"\n', "bad.py": BAD})
    code, found = flagged(tmp_path, "bad.py")
    assert (code, found) == (0, {("bad.py", "TC202")})
    assert flagged(tmp_path, "bad.py", "--fail-on", "warning")[0] == 1


def test_cli_flags_win_over_the_file(tmp_path):
    make(
        tmp_path,
        {
            "pyproject.toml": '[tool.tcaudit]\nselect = ["TC000"]\nignore = ["TC202"]\n',
            "bad.py": BAD,
            "broken.py": BROKEN,
        },
    )
    assert flagged(tmp_path, ".")[1] == {("broken.py", "TC000")}
    assert flagged(tmp_path, ".", "--select", "TC202", "--ignore", "TC000")[1] == {("bad.py", "TC202")}
    assert flagged(tmp_path, ".", "--extend-select", "TC202", "--ignore", "TC3")[1] == {
        ("bad.py", "TC202"),
        ("broken.py", "TC000"),
    }


def test_explicit_config_file(tmp_path):
    make(tmp_path, {"ci/tcaudit.toml": 'select = ["TC000"]\n', "bad.py": BAD, "broken.py": BROKEN})
    assert flagged(tmp_path, ".", "--config", "ci/tcaudit.toml")[1] == {("broken.py", "TC000")}


@pytest.mark.parametrize(
    "table,message",
    [
        ('selct = ["TC2"]', "unknown key 'selct'"),
        ('select = ["TC9"]', "'select' names unknown rule or prefix 'TC9'"),
        ("select = 3", "'select' must be a list of rule codes"),
        ('fail-on = "fatal"', "'fail-on' must be one of info, warning, error"),
        ('precision = "fp8"', "'precision' must be one of auto, bf16, fp16"),
        ('gpu = "sm_42"', "'gpu' must be one of"),  # sm_70 (V100) is a GPU now: tests/test_gpus.py
        ('exec-models = "yes"', "'exec-models' must be true or false"),
        ('pad-dims = "yes"', "'pad-dims' must be true or false"),
        ("exclude = [1]", "'exclude' must be a list of glob patterns"),
        ('per-file-ignores = ["x"]', "'per-file-ignores' must be a table"),
        ("models = [{ factory = 1 }]", "factory must be a string like"),
        ('models = [{ factory = "pkg.mod:build", shape = "8x3" }]', "unknown key 'shape'"),
    ],
)
def test_bad_values_are_named(tmp_path, table, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.tcaudit]\n{table}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=None) as info:
        load_settings([str(tmp_path)])
    assert message in str(info.value)
    assert str(tmp_path / "pyproject.toml") in str(info.value)
    code, out, err = run_cli("scan", ".", cwd=tmp_path)
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err
