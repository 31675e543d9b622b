"""The README's ``[[tool.tcaudit.models]]`` documentation (where every TC100 points): its example is a
valid config, and every key and dtype it names is one the audit accepts."""

from __future__ import annotations

import re
import sys

from conftest import REPO
from tcaudit.config import ModelSpec, Settings, settings_from_table
from tcaudit.model import factory_target, parse_input

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def models_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^### Models for the audit: `\[\[tool\.tcaudit\.models\]\]`\n(.*?)(?=^##)", text,
                      re.DOTALL | re.MULTILINE)
    assert match, "README.md has no '### Models for the audit: `[[tool.tcaudit.models]]`' section"
    return match.group(1)


def test_the_example_is_a_valid_config(tmp_path):
    block = re.search(r"```toml\n(.*?)```", models_section(), re.DOTALL)
    assert block, "the models section has no toml example"
    table = tomllib.loads(block.group(1))["tool"]["tcaudit"]
    settings = settings_from_table(table, "README.md", Settings(root=tmp_path))
    assert settings.models == (
        ModelSpec("mypkg.models:build_model", "32x3x224x224", None),
        ModelSpec("mypkg.lm:GPT.from_config", "8x1024", "bf16"),
    )
    for spec in settings.models:
        parse_input(spec.input)
        assert factory_target(spec, settings)[1] is None


def test_every_documented_key_and_dtype_is_accepted(tmp_path):
    section = models_section()
    keys = re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)
    assert keys == ["factory", "input", "dtype"]
    dtype_row = next(line for line in section.splitlines() if line.startswith("| `dtype` |"))
    dtypes = re.findall(r"`(\w+)`", dtype_row)[1:]
    dtypes = [name for name in dtypes if name not in {"precision"}]
    assert {"bf16", "fp16", "fp32", "fp64", "int64", "int32"} <= set(dtypes)
    for dtype in dtypes:
        spec = ModelSpec("mypkg.models:build_model", "8x16", dtype)
        assert factory_target(spec, Settings(root=tmp_path))[1] is None, dtype
