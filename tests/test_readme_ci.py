"""CI runs exactly what the README tells a new contributor to run."""

from __future__ import annotations

import re

from conftest import REPO

README = REPO / "README.md"
CI = REPO / ".ci" / "run"


def readme_test_command() -> str:
    """The shell block that follows the README's "run the test suite" sentence."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"run the test suite:\s*\n+```(?:sh|bash|console)?\n(.*?)\n```", text, re.DOTALL)
    assert match, "README.md has no shell block after 'run the test suite:'"
    command = match.group(1).strip()
    assert "pytest" in command
    return command


def test_ci_runs_the_readme_test_command_verbatim():
    command = readme_test_command()
    lines = [line.strip() for line in CI.read_text(encoding="utf-8").splitlines()]
    assert command in lines, f".ci/run does not contain the README's test command:\n{command}"


def test_ci_script_fails_fast():
    text = CI.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


def _start_here_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Start here", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)\n```", section, re.DOTALL)]


def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def test_start_here_is_two_commands_and_the_scan_installs_only_what_running_it_needs():
    scan, test = _start_here_commands()
    assert '.venv/bin/pip install -e ".[torch]" && .venv/bin/tcaudit scan fixtures/resnet50/train.py' in scan
    assert '.venv/bin/pip install -e ".[torch,test]"' in test and test == readme_test_command()


def test_the_test_extra_leaves_dali_to_ci():
    extras = _extras()
    assert not any("dali" in requirement for requirement in extras["test"] + extras["torch"]), extras
    assert any(requirement.startswith("nvidia-dali") for requirement in extras["dali"])
    lines = [line.strip() for line in CI.read_text(encoding="utf-8").splitlines()]
    dali = next(i for i, line in enumerate(lines) if '.venv/bin/pip install' in line and '".[dali]"' in line)
    assert dali < lines.index(readme_test_command())  # into the venv the README's command then uses


def test_the_dali_tests_skip_with_a_reason_without_dali():
    text = (REPO / "tests" / "test_fix_dali.py").read_text(encoding="utf-8")
    assert "pytest.mark.skipif(\n    not HAS_DALI, reason=\"DALI is not installed (pip install -e '.[dali]'" in text
