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
