"""The pre-commit hook, for real: ``pre-commit try-repo`` installs tcaudit into its own environment
(pip, from this repository) and runs it on a throwaway git repository; and the README's
``.pre-commit-config.yaml``, taken from README.md as written, runs with ``pre-commit run``.

try-repo on a local path uses the HEAD commit plus changes to tracked files, but not files that are
not committed yet. The test therefore snapshots the working tree (tracked and untracked files that
git does not ignore) into a temporary repository and points try-repo at that, so it checks the code
under test rather than the last commit. Network access to PyPI is needed for the hook's environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
GOOD = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'


def pre_commit_executable() -> str | None:
    beside_python = Path(sys.executable).with_name("pre-commit")
    return str(beside_python) if beside_python.is_file() else shutil.which("pre-commit")


PRE_COMMIT = pre_commit_executable()
if PRE_COMMIT is None:
    pytest.skip("the pre-commit executable is not installed (pip install pre-commit)", allow_module_level=True)
if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)


def git_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="tcaudit tests",
        GIT_AUTHOR_EMAIL="tests@example.invalid",
        GIT_COMMITTER_NAME="tcaudit tests",
        GIT_COMMITTER_EMAIL="tests@example.invalid",
        PRE_COMMIT_HOME=str(home / "pre-commit-home"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PRE_COMMIT", "PRE_COMMIT_COLOR"):
        env.pop(key, None)
    return env


def git(*args: str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"git {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(snapshot of this repository's working tree as a one-commit git repo, environment)."""
    root = tmp_path_factory.mktemp("precommit")
    env = git_env(root)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    snapshot = root / "tcaudit-snapshot"
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file may have been deleted in the working tree
            target = snapshot / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    git("init", "-q", cwd=snapshot, env=env)
    git("add", "-A", cwd=snapshot, env=env)
    git("commit", "-q", "-m", "snapshot", cwd=snapshot, env=env)
    return snapshot, env


@pytest.fixture
def project(tmp_path, workspace) -> Path:
    _, env = workspace
    (tmp_path / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC000", "TC202"]\n', encoding="utf-8")
    (tmp_path / "bad.py").write_text(BAD, encoding="utf-8")
    (tmp_path / "good.py").write_text(GOOD, encoding="utf-8")
    git("init", "-q", cwd=tmp_path, env=env)
    git("add", "-A", cwd=tmp_path, env=env)
    return tmp_path


def try_repo(project: Path, workspace, *files: str, hook: str = "tcaudit") -> subprocess.CompletedProcess:
    snapshot, env = workspace
    return subprocess.run(
        [PRE_COMMIT, "try-repo", str(snapshot), hook, "--verbose", "--files", *files],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_hook_fails_on_a_bad_file(project, workspace):
    proc = try_repo(project, workspace, "bad.py")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "bad.py:2:10: TC202 `torch.cuda.amp.GradScaler` is deprecated" in output
    assert "Failed" in output


def test_hook_passes_on_a_good_file(project, workspace):
    proc = try_repo(project, workspace, "good.py")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Passed" in output
    assert "TC202" not in output


def test_fix_hook_rewrites_the_file_and_stops_the_commit(project, workspace):
    proc = try_repo(project, workspace, "bad.py", hook="tcaudit-fix")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "files were modified by this hook" in output
    assert (project / "bad.py").read_text(encoding="utf-8") == GOOD


# -- the README's snippet -----------------------------------------------------------------------------


def readme_precommit_config() -> str:
    """The YAML block of README.md's "pre-commit" section, as a user would copy it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## pre-commit\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert section, "README.md has no '## pre-commit' section"
    block = re.search(r"```ya?ml\n(.*?)```", section.group(1), re.DOTALL)
    assert block, "README.md's pre-commit section has no yaml block"
    return block.group(1)


def hooks_by_id(text: str) -> dict[str, dict]:
    import yaml  # pre-commit's own dependency

    data = yaml.safe_load(text)
    hooks = data if isinstance(data, list) else [hook for repo in data["repos"] for hook in repo["hooks"]]
    return {hook["id"]: hook for hook in hooks}


def test_readme_hooks_are_the_published_hooks_and_never_build_models():
    readme = hooks_by_id(readme_precommit_config())
    published = hooks_by_id((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert set(readme) == set(published) == {"tcaudit", "tcaudit-fix"}
    for hook_id, hook in readme.items():
        assert hook["entry"] == published[hook_id]["entry"]
        assert "--no-exec" in hook["entry"].split(), hook_id


def tcaudit_on_path(folder: Path) -> str:
    """A PATH whose ``tcaudit`` is this checkout's (the installed one may be another's)."""
    folder.mkdir()
    shim = folder / "tcaudit"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m tcaudit "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.mark.skipif(sys.platform == "win32", reason="the tcaudit shim is a shell script")
def test_readme_snippet_runs_as_written(tmp_path):
    env = git_env(tmp_path)
    env["PATH"] = tcaudit_on_path(tmp_path / "bin")
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.tcaudit]\nselect = ["TC000", "TC202"]\n', encoding="utf-8")
    (project / "bad.py").write_text(BAD, encoding="utf-8")
    (project / "good.py").write_text(GOOD, encoding="utf-8")
    (project / ".pre-commit-config.yaml").write_text(readme_precommit_config(), encoding="utf-8")
    git("init", "-q", cwd=project, env=env)
    git("add", "-A", cwd=project, env=env)

    def run() -> tuple[int, str]:
        proc = subprocess.run([PRE_COMMIT, "run", "--all-files", "--verbose"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    code, output = run()
    assert code == 1, output
    assert "bad.py:2:10: TC202 " in output  # the report hook names the finding
    assert "good.py" not in output
    assert "files were modified by this hook" in output  # and the fix hook fixed it
    assert (project / "bad.py").read_text(encoding="utf-8") == GOOD
    git("add", "-A", cwd=project, env=env)
    code, output = run()
    assert code == 0, output
    assert output.count("Passed") == 2, output
